package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"sync"
	"time"

	"courier.dev/courier"
)

// Active-message ids of the test protocol.
const (
	amData = 1 // client → server: one message of the test (header: thread index, flags)
	amFin  = 2 // client → server: header: thread index, threads, messages sent
	amAck  = 3 // server → client: every message of the thread was received
	amPong = 4 // server → client (latency mode): the reply to one message
)

const hdrLat = 1 // amData header flag: reply with amPong

// Params are the test's options.
type Params struct {
	Size       int
	Iterations int
	Warmup     int
	Threads    int
	Window     int
	Server     string // address to connect to; "" = be the server
	Port       int
	MemType    string
	Wakeup     bool
	Latency    bool // ping-pong (one-way latency = RTT/2) instead of a bandwidth stream
	RndvThresh int  // messages of at least this size are sent with AMRndv
	Quiet      bool // no table rows (the summary only)
}

func (p *Params) check() error {
	switch {
	case p.Size <= 0:
		return errors.New("-s: message size must be positive")
	case p.Iterations <= 0:
		return errors.New("-n: iterations must be positive")
	case p.Threads <= 0:
		return errors.New("-t: threads must be positive")
	case p.Window <= 0:
		return errors.New("-O: window must be positive")
	case p.Warmup < 0:
		return errors.New("-warmup: must not be negative")
	}
	if _, err := p.memoryType(); err != nil {
		return err
	}
	return nil
}

// memoryType is the message buffers' memory type (-m): host, or cuda (device memory the
// library copies with the CUDA driver; the program never touches it).
func (p *Params) memoryType() (courier.MemoryType, error) {
	switch p.MemType {
	case "host":
		return courier.MemoryTypeHost, nil
	case "cuda":
		return courier.MemoryTypeCuda, nil
	}
	return 0, fmt.Errorf("-m %s: unknown memory type (host or cuda)", p.MemType)
}

func newContext(p *Params) (*courier.Context, error) {
	cp := (&courier.ContextParams{}).EnableAM().SetName("goperftest")
	if p.Wakeup {
		cp.EnableWakeup()
	}
	return courier.NewContext(cp)
}

// idle waits for work: sleeps on the worker's event fd with -wakeup, else keeps polling
// (as the native perftest does). Go preempts a spinning goroutine, so it need not yield;
// and yielding from a goroutine locked to its thread hands the thread's P to another
// thread, which costs microseconds.
func idle(w *courier.Worker, wakeup bool, spins *int) {
	*spins++
	if *spins < 64 {
		return
	}
	*spins = 0
	if wakeup {
		if armed, err := w.Arm(); err == nil && armed {
			_ = w.Wait(10 * time.Millisecond)
		}
	}
}

// buffers hands out message buffers the library maps (MemMap with Alloc), as the seed's
// perftest maps its memory and ucx_perftest allocates its buffers with ucp_mem_map: a
// same-host peer then copies rendezvous data through the region's shared segment. A larger
// need maps a bigger region; release unmaps them all.
type buffers struct {
	c    *courier.Context
	mt   courier.MemoryType
	maps []*courier.Memory
}

func (b *buffers) get(n int) ([]byte, error) {
	m, err := b.c.MemMap(&courier.MemMapParams{Alloc: true, Length: n, MemoryType: b.mt})
	if err != nil {
		return nil, err
	}
	b.maps = append(b.maps, m)
	if b.mt == courier.MemoryTypeCuda {
		return m.DeviceBytes()[:n], nil
	}
	return m.Bytes()[:n], nil
}

func (b *buffers) release() {
	for _, m := range b.maps {
		_ = m.Close()
	}
	b.maps = nil
}

// ----- server -------------------------------------------------------------------------

type conn struct {
	ep       *courier.Endpoint
	received uint64
	expected uint64 // from the fin; 0 until it arrives
	fin      bool
	acked    bool
	lat      bool             // the client pings: answer every message
	onData   courier.Callback // completes the connection's rendezvous receives (made once)
}

// RunServer listens on p.Port, serves clients until every thread of one run is done, and
// returns. ready (may be nil) gets the bound address once listening.
func RunServer(ctx context.Context, p *Params, ready chan<- string) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c, err := newContext(p)
	if err != nil {
		return err
	}
	defer c.Close()
	mt, _ := p.memoryType() // checked by Params.check
	bufs := &buffers{c: c, mt: mt}
	defer bufs.release()
	w, err := c.NewWorker((&courier.WorkerParams{}).SetThreadMode(courier.ThreadModeSingle))
	if err != nil {
		return err
	}
	defer w.Close()

	conns := map[uint32]*conn{}
	finned := 0 // fins received whose acks are not sent yet
	threads := -1
	var failure error
	get := func(idx uint32) *conn {
		cn := conns[idx]
		if cn == nil {
			cn = &conn{}
			conns[idx] = cn
		}
		return cn
	}
	buf, err := bufs.get(p.Size) // rendezvous data lands here (one buffer: contents unchecked)
	if err != nil {
		return err
	}
	pong, err := bufs.get(p.Size)
	if err != nil {
		return err
	}
	// Everything below runs inside w.Progress on this goroutine: no locks.
	// The answer has the size of the message it answers: the client's -s drives the test,
	// as with ucx_perftest, whatever this server was started with.
	reply := func(cn *conn, n int) {
		if cn.ep == nil {
			failure = errors.New("a message came before its connection was accepted")
			return
		}
		if n > len(pong) {
			if pong, failure = bufs.get(n); failure != nil {
				return
			}
		}
		if _, err := cn.ep.SendAM(amPong, nil, pong[:n], rndvFlag(p, n), nil); err != nil {
			failure = err
		}
	}
	l, err := w.NewListener(&courier.ListenerParams{
		Address: net.JoinHostPort("0.0.0.0", strconv.Itoa(p.Port)),
		ConnectionHandler: func(r *courier.ConnRequest) {
			ep, err := r.Accept(nil)
			if err != nil {
				failure = err
				return
			}
			get(uint32(r.ClientID())).ep = ep
		},
	})
	if err != nil {
		return err
	}
	defer l.Close()
	err = w.SetAMHandler(amData, func(m *courier.AMMessage) {
		if len(m.Header) < 8 {
			failure = errors.New("short data header")
			return
		}
		cn := get(binary.LittleEndian.Uint32(m.Header))
		lat := binary.LittleEndian.Uint32(m.Header[4:])&hdrLat != 0
		if !m.IsRndv() {
			cn.received++
			if lat {
				reply(cn, m.DataLen)
			}
			return
		}
		if m.DataLen > len(buf) {
			if buf, failure = bufs.get(m.DataLen); failure != nil {
				return
			}
		}
		cn.lat = lat
		if cn.onData == nil {
			cn.onData = func(info courier.Info, err error) {
				if err != nil {
					failure = err
					return
				}
				cn.received++
				if cn.lat {
					reply(cn, info.Length)
				}
			}
		}
		if _, err := m.ReceiveData(buf[:m.DataLen], cn.onData); err != nil {
			failure = err
		}
	})
	if err != nil {
		return err
	}
	err = w.SetAMHandler(amFin, func(m *courier.AMMessage) {
		if len(m.Header) < 16 {
			failure = errors.New("short fin header")
			return
		}
		cn := get(binary.LittleEndian.Uint32(m.Header))
		threads = int(binary.LittleEndian.Uint32(m.Header[4:]))
		cn.expected = binary.LittleEndian.Uint64(m.Header[8:])
		cn.fin = true
		finned++
	})
	if err != nil {
		return err
	}
	if ready != nil {
		ready <- l.Addr().String()
	}
	spins := 0
	polls := 0
	acked := 0
	var acks []*courier.Request
	for threads < 0 || acked < threads {
		if failure != nil {
			return failure
		}
		if polls++; polls&1023 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if w.Progress() > 0 {
			spins = 0
		} else {
			idle(w, p.Wakeup, &spins)
		}
		if finned == 0 {
			continue
		}
		for _, cn := range conns {
			if cn.fin && !cn.acked && cn.received >= cn.expected && cn.ep != nil {
				r, err := cn.ep.SendAM(amAck, nil, nil, 0, nil)
				if err != nil {
					return err
				}
				acks = append(acks, r)
				cn.acked = true
				acked++
				finned--
			}
		}
	}
	for _, r := range acks {
		if err := r.Wait(ctx); err != nil {
			return err
		}
	}
	for _, cn := range conns {
		if cn.ep != nil {
			_ = cn.ep.Flush()
		}
	}
	// Let the clients see their acks before the endpoints go away.
	for deadline := time.Now().Add(200 * time.Millisecond); time.Now().Before(deadline); {
		if w.Progress() == 0 {
			runtime.Gosched()
		}
	}
	for _, cn := range conns {
		if cn.ep != nil {
			cn.ep.CloseForce()
		}
	}
	return failure
}

func rndvFlag(p *Params, n int) courier.AMFlags {
	if p.RndvThresh > 0 && n >= p.RndvThresh {
		return courier.AMRndv
	}
	return 0
}

// ----- client -------------------------------------------------------------------------

// Row is one line of the table: the average over the last rows' iterations.
type Row struct {
	Thread, Threads  int
	Iteration, Total int
	Latency          time.Duration
	BandwidthGbps    float64
}

// Result is a thread's (or the run's) outcome.
type Result struct {
	Iterations    int     `json:"iterations"`
	Threads       int     `json:"threads"`
	Size          int     `json:"size"`
	MemType       string  `json:"mem_type"`
	Test          string  `json:"test"`
	Window        int     `json:"window"`
	LatencyMs     float64 `json:"latency_ms"`
	LatencyUs     float64 `json:"latency_us"`
	BandwidthGbps float64 `json:"bandwidth_gbps"`
	BandwidthMBs  float64 `json:"bandwidth_mbs"`
	MsgRate       float64 `json:"msg_rate"`
	ElapsedSec    float64 `json:"elapsed_s"`
}

const rowEvery = 100

func gbps(size int, per time.Duration) float64 {
	if per <= 0 {
		return 0
	}
	return float64(size) * 8 / per.Seconds() / 1e9
}

// RunClient runs p.Threads threads against p.Server and returns the summary; rows go to
// the rows channel (may be nil) as they are measured.
func RunClient(ctx context.Context, p *Params, rows chan<- Row) (Result, error) {
	c, err := newContext(p)
	if err != nil {
		return Result{}, err
	}
	defer c.Close()
	var wg sync.WaitGroup
	elapsed := make([]time.Duration, p.Threads)
	errs := make([]error, p.Threads)
	for t := 0; t < p.Threads; t++ {
		wg.Add(1)
		go func(t int) {
			defer wg.Done()
			elapsed[t], errs[t] = runThread(ctx, c, p, t, rows)
		}(t)
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Result{}, err
	}
	var worst time.Duration
	for _, e := range elapsed {
		worst = max(worst, e)
	}
	r := Result{Iterations: p.Iterations, Threads: p.Threads, Size: p.Size, MemType: p.MemType,
		Test: "am_bw", Window: p.Window, ElapsedSec: worst.Seconds()}
	// Latency: the time per message of one thread (one-way, RTT/2, for the latency test);
	// bandwidth: every thread's bytes over the slowest thread's time.
	var per time.Duration
	for _, e := range elapsed {
		per += e / time.Duration(p.Iterations)
	}
	per /= time.Duration(p.Threads)
	if p.Latency {
		r.Test = "am_lat"
		r.Window = 1
		per /= 2
	}
	r.LatencyMs = float64(per) / 1e6
	r.LatencyUs = float64(per) / 1e3
	if worst > 0 {
		total := float64(p.Size) * float64(p.Iterations) * float64(p.Threads)
		if p.Latency {
			total *= 2 // both directions moved size bytes per iteration
		}
		r.BandwidthGbps = total * 8 / worst.Seconds() / 1e9
		r.BandwidthMBs = total / worst.Seconds() / (1 << 20)
		r.MsgRate = float64(p.Iterations) * float64(p.Threads) / worst.Seconds()
	}
	return r, nil
}

func runThread(ctx context.Context, c *courier.Context, p *Params, t int, rows chan<- Row) (time.Duration, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	w, err := c.NewWorker((&courier.WorkerParams{}).SetThreadMode(courier.ThreadModeSingle))
	if err != nil {
		return 0, err
	}
	defer w.Close()
	mt, _ := p.memoryType() // checked by Params.check
	bufs := &buffers{c: c, mt: mt}
	defer bufs.release()
	var pongs uint64
	acked := false
	var sendErr error
	pongBuf, err := bufs.get(p.Size)
	if err != nil {
		return 0, err
	}
	if err := w.SetAMHandler(amPong, func(m *courier.AMMessage) {
		if !m.IsRndv() {
			pongs++
			return
		}
		// A large reply: receive it (into one buffer; contents unchecked).
		if m.DataLen > len(pongBuf) {
			var err error
			if pongBuf, err = bufs.get(m.DataLen); err != nil {
				if sendErr == nil {
					sendErr = err
				}
				return
			}
		}
		if _, err := m.ReceiveData(pongBuf[:m.DataLen], func(_ courier.Info, err error) {
			if err != nil && sendErr == nil {
				sendErr = err
			}
			pongs++
		}); err != nil && sendErr == nil {
			sendErr = err
		}
	}); err != nil {
		return 0, err
	}
	if err := w.SetAMHandler(amAck, func(*courier.AMMessage) { acked = true }); err != nil {
		return 0, err
	}
	ep, err := w.NewEndpoint(&courier.EndpointParams{SocketAddress: p.Server, ClientID: uint64(t)})
	if err != nil {
		return 0, err
	}
	defer ep.CloseForce()
	if err := ep.WaitConnected(10 * time.Second); err != nil {
		return 0, err
	}
	hdr := make([]byte, 8)
	binary.LittleEndian.PutUint32(hdr, uint32(t))
	if p.Latency {
		binary.LittleEndian.PutUint32(hdr[4:], hdrLat)
	}
	data, err := bufs.get(p.Size)
	if err != nil {
		return 0, err
	}
	if p.MemType == "host" { // device memory is sent as the driver allocated it
		for i := range data {
			data[i] = byte(i)
		}
	}
	flags := rndvFlag(p, p.Size)
	window := p.Window
	if p.Latency {
		window = 1
	}
	total := p.Warmup + p.Iterations
	inflight := 0
	done := func(_ courier.Info, err error) {
		inflight--
		if err != nil && sendErr == nil {
			sendErr = err
		}
	}
	spins := 0
	polls := 0
	progressUntil := func(cond func() bool) error {
		for !cond() {
			if sendErr != nil {
				return sendErr
			}
			if polls++; polls&1023 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			if w.Progress() > 0 {
				spins = 0
			} else {
				idle(w, p.Wakeup, &spins)
			}
		}
		return sendErr
	}
	var start, mark time.Time
	for i := 0; i < total; i++ {
		if i == p.Warmup {
			start = time.Now()
			mark = start
		}
		if err := progressUntil(func() bool { return inflight < window }); err != nil {
			return 0, err
		}
		inflight++
		if _, err := ep.SendAM(amData, hdr, data, flags, done); err != nil {
			return 0, err
		}
		if p.Latency {
			want := uint64(i + 1)
			if err := progressUntil(func() bool { return pongs >= want }); err != nil {
				return 0, err
			}
		}
		if j := i - p.Warmup + 1; j > 0 && j%rowEvery == 0 && j < p.Iterations && rows != nil {
			now := time.Now()
			per := now.Sub(mark) / rowEvery
			if p.Latency {
				per /= 2
			}
			mark = now
			rows <- Row{Thread: t + 1, Threads: p.Threads, Iteration: j, Total: p.Iterations,
				Latency: per, BandwidthGbps: gbps(p.Size, per)}
		}
	}
	if err := progressUntil(func() bool { return inflight == 0 }); err != nil {
		return 0, err
	}
	fin := make([]byte, 16)
	binary.LittleEndian.PutUint32(fin, uint32(t))
	binary.LittleEndian.PutUint32(fin[4:], uint32(p.Threads))
	binary.LittleEndian.PutUint64(fin[8:], uint64(total))
	if _, err := ep.SendAM(amFin, fin, nil, 0, nil); err != nil {
		return 0, err
	}
	if err := progressUntil(func() bool { return acked }); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// ----- output -------------------------------------------------------------------------

const rule = "+-----+-----+-----+-----+"

func printHeader(out io.Writer) {
	fmt.Fprintln(out, rule)
	fmt.Fprintln(out, "| Thread | Iteration | Latency | Bandwidth (Gb/s) |")
	fmt.Fprintln(out, rule)
}

func printRow(out io.Writer, r Row) {
	fmt.Fprintf(out, "| %d/%d | %d/%d | %v | %f |\n", r.Thread, r.Threads, r.Iteration, r.Total, r.Latency, r.BandwidthGbps)
}

func printSummary(out io.Writer, r Result) {
	fmt.Fprintln(out, rule)
	fmt.Fprintf(out, "Number of iterations: %d, number of threads: %d, message size: %d, memory type: %s, average latency (ms): %.3f, average bandwidth (Gb/s): %.3f\n",
		r.Iterations, r.Threads, r.Size, r.MemType, r.LatencyMs, r.BandwidthGbps)
}
