package courier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"
)

// COURIER_TEST_GO_GCSTRESS=1 makes progress loops and tests collect garbage constantly, to flush
// out lifetime bugs (buffers not pinned, handles freed early). Run it with GOGC=1.
var gcStress = os.Getenv("COURIER_TEST_GO_GCSTRESS") != ""

const testTimeout = 30 * time.Second

func maybeGC() {
	if gcStress {
		runtime.GC()
	}
}

func newContext(t *testing.T) *Context {
	t.Helper()
	p := (&ContextParams{}).EnableTag().EnableAM().EnableStream().EnableWakeup().SetName(t.Name())
	// COURIER_TLS from the environment applies as usual.
	c, err := NewContext(p)
	if err != nil {
		t.Fatalf("NewContext: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func newWorker(t *testing.T, c *Context, mode ThreadMode) *Worker {
	t.Helper()
	w, err := c.NewWorker((&WorkerParams{}).SetThreadMode(mode))
	if err != nil {
		t.Fatalf("NewWorker: %v", err)
	}
	return w
}

// progressedPair makes two multi-thread workers of a new context, each progressed on its
// own goroutine until the test ends, then closed; stopA and stopB stop that sooner.
func progressedPair(t *testing.T) (a, b *Worker, stopA, stopB func()) {
	t.Helper()
	c := newContext(t)
	a = newWorker(t, c, ThreadModeMulti)
	b = newWorker(t, c, ThreadModeMulti)
	stopA, stopB = progress(a), progress(b)
	t.Cleanup(func() {
		stopA()
		stopB()
		a.Close()
		b.Close()
	})
	return a, b, stopA, stopB
}

// progress runs w.Progress on its own goroutine until the returned stop is called.
func progress(w *Worker) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			if w.Progress() == 0 {
				runtime.Gosched()
			}
			if gcStress && i%64 == 0 {
				runtime.GC()
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

func wait(t *testing.T, r *Request) Info {
	t.Helper()
	select {
	case <-r.Done():
	case <-time.After(testTimeout):
		t.Fatalf("request did not complete in %v", testTimeout)
	}
	if err := r.Err(); err != nil {
		t.Fatalf("request failed: %v", err)
	}
	return r.Info()
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31) + seed
	}
	return b
}

// pair makes two multi-thread workers, each progressed by its own goroutine, and an
// endpoint from a to b by b's worker address.
func pair(t *testing.T) (a, b *Worker, ep *Endpoint) {
	t.Helper()
	c := newContext(t)
	a = newWorker(t, c, ThreadModeMulti)
	b = newWorker(t, c, ThreadModeMulti)
	addr, err := b.Address()
	if err != nil || len(addr) == 0 {
		t.Fatalf("Address: %v", err)
	}
	stopA, stopB := progress(a), progress(b)
	ep, err = a.NewEndpoint((&EndpointParams{}).SetWorkerAddress(addr))
	if err != nil {
		t.Fatalf("NewEndpoint: %v", err)
	}
	t.Cleanup(func() {
		ep.CloseForce()
		stopA()
		stopB()
		a.Close()
		b.Close()
	})
	return a, b, ep
}

// dial connects an endpoint from a to b by b's worker address and waits until it is up;
// the caller closes it.
func dial(t *testing.T, a, b *Worker) *Endpoint {
	t.Helper()
	addr, err := b.Address()
	if err != nil {
		t.Fatal(err)
	}
	ep, err := a.NewEndpoint((&EndpointParams{}).SetWorkerAddress(addr))
	if err != nil {
		t.Fatal(err)
	}
	if err := ep.WaitConnected(10 * time.Second); err != nil {
		ep.CloseForce()
		t.Fatal(err)
	}
	return ep
}

func TestStatusErrors(t *testing.T) {
	var err error = &Error{Status: ErrRejected, Detail: "no thanks"}
	if !errors.Is(err, ErrRejected) || errors.Is(err, ErrPeerFailure) {
		t.Fatalf("errors.Is does not match statuses: %v", err)
	}
	var ce *Error
	if !errors.As(fmt.Errorf("wrapped: %w", err), &ce) || ce.Status != ErrRejected {
		t.Fatal("errors.As")
	}
	if ErrRejected.Error() != "connection rejected by peer" || ErrTruncated.Error() != "message truncated" {
		t.Fatalf("status strings: %q %q", ErrRejected.Error(), ErrTruncated.Error())
	}
}

func TestLifecycle(t *testing.T) {
	if _, err := NewContext((&ContextParams{}).SetConfig("COURIER_TLS", "pigeon")); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("bad config: got %v", err)
	}
	if len(ConfigVars()) == 0 {
		t.Fatal("no configuration variables")
	}
	c := newContext(t)
	if c.Name() != t.Name() {
		t.Fatalf("name %q", c.Name())
	}
	for _, mode := range []ThreadMode{ThreadModeSingle, ThreadModeMulti} {
		runtime.LockOSThread()
		w := newWorker(t, c, mode)
		a, err := w.Address()
		if err != nil || len(a) == 0 {
			t.Fatalf("Address: %v", err)
		}
		if fd, err := w.EventFD(); err != nil || fd < 0 {
			t.Fatalf("EventFD: %d %v", fd, err)
		}
		if _, err := w.Arm(); err != nil {
			t.Fatalf("Arm: %v", err)
		}
		if err := w.Signal(); err != nil {
			t.Fatalf("Signal: %v", err)
		}
		if err := w.Wait(10 * time.Millisecond); err != nil {
			t.Fatalf("Wait: %v", err)
		}
		w.Progress()
		l, err := w.NewListener(&ListenerParams{Address: "127.0.0.1:0", ConnectionHandler: func(r *ConnRequest) { r.Reject() }})
		if err != nil {
			t.Fatalf("NewListener: %v", err)
		}
		if l.Addr() == nil || l.Addr().Port == 0 {
			t.Fatalf("listener address %v", l.Addr())
		}
		ep, err := w.NewEndpoint((&EndpointParams{}).SetWorkerAddress(a))
		if err != nil {
			t.Fatalf("NewEndpoint: %v", err)
		}
		if err := ep.WaitConnected(5 * time.Second); err != nil {
			t.Fatalf("WaitConnected: %v", err)
		}
		for i := 0; i < 2; i++ {
			if err := ep.Close(); err != nil {
				t.Fatalf("ep.Close #%d: %v", i, err)
			}
			if err := l.Close(); err != nil {
				t.Fatalf("l.Close #%d: %v", i, err)
			}
			if err := w.Close(); err != nil {
				t.Fatalf("w.Close #%d: %v", i, err)
			}
		}
		if _, err := ep.SendTag([]byte("x"), 1, nil); !errors.Is(err, ErrInvalidParam) {
			t.Fatalf("send after close: %v", err)
		}
		if _, err := w.Address(); err == nil {
			t.Fatal("Address after close")
		}
		if w.Progress() != 0 {
			t.Fatal("Progress after close")
		}
		runtime.UnlockOSThread()
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NewWorker(nil); err == nil {
		t.Fatal("NewWorker after Close")
	}
}

func TestTagRoundTrip(t *testing.T) {
	_, b, ep := pair(t)
	if err := ep.WaitConnected(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("transport %s", ep.Transport())
	ctx := context.Background()
	for _, n := range []int{0, 1, 100, 65536, 3 << 20} {
		data := pattern(n, byte(n))
		buf := make([]byte, n)
		var calls atomic.Int32
		rr, err := b.RecvTag(buf, 42, ^uint64(0), func(info Info, err error) {
			if err == nil && info.Length == n && info.Tag == 42 {
				calls.Add(1)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		maybeGC()
		sr, err := ep.SendTag(data, 42, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := sr.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		info := wait(t, rr)
		if info.Length != n || !bytes.Equal(buf, data) {
			t.Fatalf("size %d: got %d bytes, equal=%v", n, info.Length, bytes.Equal(buf, data))
		}
		if calls.Load() != 1 {
			t.Fatalf("size %d: callback ran %d times", n, calls.Load())
		}
	}

	// Gathered send into a scattered receive, and a synchronous send.
	parts := [][]byte{pattern(10, 1), pattern(70000, 2), pattern(5, 3)}
	want := bytes.Join(parts, nil)
	got := [][]byte{make([]byte, 40000), make([]byte, len(want)-40000)}
	rr, err := b.RecvTagIOV(got, 7, ^uint64(0), nil)
	if err != nil {
		t.Fatal(err)
	}
	sr, err := ep.SendTagIOV(parts, 7, nil)
	if err != nil {
		t.Fatal(err)
	}
	wait(t, sr)
	if info := wait(t, rr); info.Length != len(want) || !bytes.Equal(bytes.Join(got, nil), want) {
		t.Fatal("iov round trip differs")
	}
	sync1 := pattern(1000, 9)
	sr, err = ep.SendTagSync(sync1, 8, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Probe sees it before it is received.
	deadline := time.Now().Add(testTimeout)
	for {
		info, ok, err := b.ProbeTag(8, ^uint64(0))
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if info.Length != 1000 || info.Tag != 8 {
				t.Fatalf("probe: %+v", info)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("probe found nothing")
		}
		runtime.Gosched()
	}
	// Too small a buffer: truncated.
	small := make([]byte, 10)
	rr, err = b.RecvTag(small, 8, ^uint64(0), nil)
	if err == nil {
		<-rr.Done()
		err = rr.Err()
	}
	if !errors.Is(err, ErrTruncated) {
		t.Fatalf("short receive: %v", err)
	}
	wait(t, sr)
}

// Many goroutines send on one multi-thread worker while another goroutine progresses it:
// small sends (copied into slots) and large ones (pinned, completing later, possibly on the
// progress goroutine before the sender registered its request) all arrive intact, and
// every callback runs once.
func TestConcurrentSends(t *testing.T) {
	_, b, ep := pair(t)
	if err := ep.WaitConnected(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	const senders, each = 8, 50
	sizes := []int{8, 256, 257, 70000}
	var cbs atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for g := 0; g < senders; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			ctx := context.Background()
			for i := 0; i < each; i++ {
				n := sizes[i%len(sizes)]
				tag := uint64(g)<<32 | uint64(i)
				r, err := ep.SendTag(pattern(n, byte(tag)), tag, func(_ Info, err error) {
					if err == nil {
						cbs.Add(1)
					}
				})
				if err == nil {
					err = r.Wait(ctx)
				}
				if err != nil {
					errs <- err
					return
				}
				maybeGC()
			}
		}(g)
	}
	for k := 0; k < senders*each; k++ {
		buf := make([]byte, 70000)
		r, err := b.RecvTag(buf, 0, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		info := wait(t, r)
		want := pattern(sizes[int(uint32(info.Tag))%len(sizes)], byte(info.Tag))
		if !bytes.Equal(buf[:info.Length], want) {
			t.Fatalf("message with tag %#x: wrong contents (%d bytes)", info.Tag, info.Length)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := cbs.Load(); got != senders*each {
		t.Fatalf("%d send callbacks, want %d", got, senders*each)
	}
}

// A posted tag receive can be canceled: it completes with ErrCanceled (callback and
// Wait), and a message sent afterwards is left for the next receive.
func TestCancelTagReceive(t *testing.T) {
	_, b, ep := pair(t)
	if err := ep.WaitConnected(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	cbErr := make(chan error, 1)
	r, err := b.RecvTag(buf, 7, ^uint64(0), func(_ Info, err error) { cbErr <- err })
	if err != nil {
		t.Fatal(err)
	}
	maybeGC()
	if err := r.Cancel(); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := r.Wait(ctx); !errors.Is(err, ErrCanceled) {
		t.Fatalf("Wait after Cancel: %v, want ErrCanceled", err)
	}
	if err := <-cbErr; !errors.Is(err, ErrCanceled) {
		t.Fatalf("callback after Cancel: %v, want ErrCanceled", err)
	}
	if err := r.Cancel(); err != nil {
		t.Fatalf("Cancel of a completed request: %v", err)
	}
	if _, err := ep.SendTag([]byte("after"), 7, nil); err != nil {
		t.Fatal(err)
	}
	r2, err := b.RecvTag(buf, 7, ^uint64(0), nil)
	if err != nil {
		t.Fatal(err)
	}
	if info := wait(t, r2); string(buf[:info.Length]) != "after" {
		t.Fatalf("received %q", buf[:info.Length])
	}
}

func TestStreamRoundTrip(t *testing.T) {
	_, b, ep := pair(t)
	if err := ep.WaitConnected(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	// The first bytes make b's side of the connection known to b.
	first, err := ep.SendStream([]byte("hello, "), nil)
	if err != nil {
		t.Fatal(err)
	}
	wait(t, first)
	var bep *Endpoint
	deadline := time.Now().Add(testTimeout)
	for bep == nil {
		if bep, err = b.IncomingEndpoint(); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("no incoming endpoint")
		}
		runtime.Gosched()
	}
	defer bep.CloseForce()

	payload := append([]byte("hello, "), pattern(2<<20, 4)...)
	rest := payload[7:]
	got := make([]byte, len(payload))
	rr, err := bep.RecvStream(got, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	s1, err := ep.SendStreamIOV([][]byte{rest[:1000], rest[1000:5000]}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := ep.SendStream(rest[5000:], nil)
	if err != nil {
		t.Fatal(err)
	}
	maybeGC()
	wait(t, s1)
	wait(t, s2)
	if info := wait(t, rr); info.Length != len(payload) || !bytes.Equal(got, payload) {
		t.Fatalf("stream: %d bytes, equal=%v", info.Length, bytes.Equal(got, payload))
	}

	// Echo back, received in whatever pieces arrive.
	es, err := bep.SendStream(got, nil)
	if err != nil {
		t.Fatal(err)
	}
	echo := make([]byte, 0, len(got))
	for len(echo) < len(got) {
		chunk := make([]byte, 1<<20)
		r, err := ep.RecvStream(chunk, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		info := wait(t, r)
		echo = append(echo, chunk[:info.Length]...)
	}
	wait(t, es)
	if !bytes.Equal(echo, payload) {
		t.Fatal("echo differs")
	}
}

type amReply struct {
	which byte
	data  []byte
}

func TestListenerAM(t *testing.T) {
	c := newContext(t)
	server := newWorker(t, c, ThreadModeMulti)
	client := newWorker(t, c, ThreadModeMulti)
	defer server.Close()
	defer client.Close()

	var mu sync.Mutex
	var accepted *Endpoint
	var clientID uint64
	l, err := server.NewListener(&ListenerParams{
		Address: "127.0.0.1:0",
		ConnectionHandler: func(r *ConnRequest) {
			ep, err := r.Accept(nil)
			if err != nil {
				t.Errorf("Accept: %v", err)
				return
			}
			mu.Lock()
			accepted, clientID = ep, r.ClientID()
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	big := pattern(1<<20, 5)
	kept := make(chan *AMMessage, 1)
	errs := make(chan error, 10)
	if err := server.SetAMHandler(1, func(m *AMMessage) {
		switch {
		case !m.IsRndv():
			if string(m.Header) != "eager" || !bytes.Equal(m.Data, []byte("small data")) {
				errs <- fmt.Errorf("eager message: %q %q", m.Header, m.Data)
				return
			}
			rep := m.ReplyEndpoint()
			if rep == nil {
				errs <- errors.New("no reply endpoint")
				return
			}
			if _, err := rep.SendAM(2, []byte{0}, []byte("got eager"), 0, nil); err != nil {
				errs <- err
			}
		case string(m.Header) == "now":
			buf := make([]byte, m.DataLen)
			_, err := m.ReceiveData(buf, func(info Info, err error) {
				if err != nil || info.Length != len(big) || !bytes.Equal(buf, big) {
					errs <- fmt.Errorf("rndv data: %v %d", err, info.Length)
					return
				}
				mu.Lock()
				ep := accepted
				mu.Unlock()
				if _, err := ep.SendAM(2, []byte{1}, []byte("got rndv"), 0, nil); err != nil {
					errs <- err
				}
			})
			if err != nil {
				errs <- err
			}
		default:
			m.Keep()
			kept <- m
		}
	}); err != nil {
		t.Fatal(err)
	}
	replies := make(chan amReply, 10)
	if err := client.SetAMHandler(2, func(m *AMMessage) {
		replies <- amReply{m.Header[0], m.Data}
	}); err != nil {
		t.Fatal(err)
	}

	stopS, stopC := progress(server), progress(client)
	defer stopC()
	defer stopS()

	ep, err := client.NewEndpoint((&EndpointParams{}).SetSocketAddress(l.Addr()).SetClientID(7))
	if err != nil {
		t.Fatal(err)
	}
	defer ep.CloseForce()
	if err := ep.WaitConnected(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	r1, err := ep.SendAM(1, []byte("eager"), []byte("small data"), AMReply, nil)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := ep.SendAM(1, []byte("now"), big, AMRndv, nil)
	if err != nil {
		t.Fatal(err)
	}
	big2 := pattern(1<<20, 6)
	r3, err := ep.SendAMIOV(1, []byte("later"), [][]byte{big2[:1000], big2[1000:]}, AMRndv, nil)
	if err != nil {
		t.Fatal(err)
	}
	maybeGC()
	wait(t, r1)

	var m *AMMessage
	select {
	case m = <-kept:
	case err := <-errs:
		t.Fatal(err)
	case <-time.After(testTimeout):
		t.Fatal("kept message did not arrive")
	}
	buf := make([]byte, m.DataLen)
	rr, err := m.ReceiveData(buf, nil)
	if err != nil {
		t.Fatal(err)
	}
	if info := wait(t, rr); info.Length != len(big2) || !bytes.Equal(buf, big2) {
		t.Fatal("kept rendezvous data differs")
	}
	wait(t, r2)
	wait(t, r3)

	seen := map[byte]string{}
	for len(seen) < 2 {
		select {
		case r := <-replies:
			seen[r.which] = string(r.data)
		case err := <-errs:
			t.Fatal(err)
		case <-time.After(testTimeout):
			t.Fatalf("replies so far: %v", seen)
		}
	}
	if seen[0] != "got eager" || seen[1] != "got rndv" {
		t.Fatalf("replies: %v", seen)
	}
	mu.Lock()
	if clientID != 7 {
		t.Fatalf("client id %d", clientID)
	}
	acc := accepted
	mu.Unlock()
	stopS()
	acc.CloseForce()
}

func TestRejected(t *testing.T) {
	c := newContext(t)
	server := newWorker(t, c, ThreadModeMulti)
	client := newWorker(t, c, ThreadModeMulti)
	defer server.Close()
	defer client.Close()
	var asked atomic.Uint64
	l, err := server.NewListener((&ListenerParams{Address: "127.0.0.1:0"}).SetConnectionHandler(func(r *ConnRequest) {
		asked.Store(r.ClientID())
		if err := r.Reject(); err != nil {
			t.Errorf("Reject: %v", err)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	stopS, stopC := progress(server), progress(client)
	defer stopC()
	defer stopS()

	failed := make(chan error, 1)
	ep, err := client.NewEndpoint((&EndpointParams{}).SetSocketAddress(l.Addr()).SetClientID(99).
		SetErrorHandler(func(ep *Endpoint, err error) { failed <- err }))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-failed:
		if !errors.Is(err, ErrRejected) {
			t.Fatalf("error handler got %v", err)
		}
	case <-time.After(testTimeout):
		ok, cerr := ep.Connected()
		t.Fatalf("no error for a rejected connection (listener asked: %d, connected: %v %v)", asked.Load(), ok, cerr)
	}
	if asked.Load() != 99 {
		t.Fatalf("listener saw client id %d", asked.Load())
	}
	if _, err := ep.Connected(); !errors.Is(err, ErrRejected) {
		t.Fatalf("Connected: %v", err)
	}
	ep.Close()
	ep.Close()
}

// owner is a goroutine locked to its OS thread that owns a single-thread worker: it
// progresses the worker and runs, between progress calls, whatever is handed to it.
type owner struct {
	w    *Worker
	do   chan func()
	stop chan struct{}
	done chan struct{}
}

func newOwner(t *testing.T, c *Context) *owner {
	t.Helper()
	o := &owner{do: make(chan func()), stop: make(chan struct{}), done: make(chan struct{})}
	ready := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer close(o.done)
		w, err := c.NewWorker(&WorkerParams{ThreadMode: ThreadModeSingle})
		o.w = w
		ready <- err
		if err != nil {
			return
		}
		defer w.Close()
		for i := 0; ; i++ {
			select {
			case f := <-o.do:
				f()
			case <-o.stop:
				return
			default:
				if w.Progress() == 0 {
					runtime.Gosched()
				}
				if gcStress && i%64 == 0 {
					runtime.GC()
				}
			}
		}
	}()
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	return o
}

// run runs f on the owner's thread and waits for it.
func (o *owner) run(f func()) {
	ran := make(chan struct{})
	o.do <- func() { f(); close(ran) }
	<-ran
}

func (o *owner) close() {
	close(o.stop)
	<-o.done
}

// Single-thread workers, each owned and progressed by a goroutine locked to its thread.
func TestSingleThreadMode(t *testing.T) {
	c := newContext(t)
	a, b := newOwner(t, c), newOwner(t, c)
	defer a.close()
	defer b.close()
	var addr []byte
	var err error
	b.run(func() { addr, err = b.w.Address() })
	if err != nil {
		t.Fatal(err)
	}
	var ep *Endpoint
	a.run(func() { ep, err = a.w.NewEndpoint(&EndpointParams{WorkerAddress: addr}) })
	if err != nil {
		t.Fatal(err)
	}
	defer a.run(func() { ep.CloseForce() })
	for round, n := range []int{10, 300000} {
		data := pattern(n, byte(round))
		buf := make([]byte, n)
		var rr, sr *Request
		b.run(func() { rr, err = b.w.RecvTag(buf, 5, ^uint64(0), nil) })
		if err != nil {
			t.Fatal(err)
		}
		a.run(func() { sr, err = ep.SendTag(data, 5, nil) })
		if err != nil {
			t.Fatal(err)
		}
		maybeGC()
		wait(t, sr)
		if info := wait(t, rr); info.Length != n || !bytes.Equal(buf, data) {
			t.Fatalf("size %d differs", n)
		}
	}

	made := make(chan *Worker)
	release := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		w, err := c.NewWorker(&WorkerParams{ThreadMode: ThreadModeSingle})
		if err != nil {
			t.Error(err)
			close(made)
			return
		}
		made <- w
		<-release
		w.Close()
	}()
	w := <-made
	defer close(release)
	if w == nil {
		return
	}
	other := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		_, err := w.Arm()
		other <- err
		other <- w.Signal() // waking a worker is allowed from any thread
	}()
	if err := <-other; !errors.Is(err, ErrInvalidParam) {
		t.Fatalf("use from another thread: %v", err)
	}
	if err := <-other; err != nil {
		t.Fatalf("signal from another thread: %v", err)
	}
}

func TestCallbackPanicIsRecovered(t *testing.T) {
	c := newContext(t)
	w := newWorker(t, c, ThreadModeMulti)
	defer w.Close()
	addr, _ := w.Address()
	ep, err := w.NewEndpoint(&EndpointParams{WorkerAddress: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.CloseForce()
	if err := w.SetAMHandler(3, func(m *AMMessage) { panic("boom") }); err != nil {
		t.Fatal(err)
	}
	if _, err := ep.SendAM(3, nil, []byte("x"), 0, nil); err != nil {
		t.Fatal(err)
	}
	var got any
	deadline := time.Now().Add(testTimeout)
	for got == nil && time.Now().Before(deadline) {
		func() {
			defer func() { got = recover() }()
			w.Progress()
		}()
	}
	if got != "boom" {
		t.Fatalf("recovered %v", got)
	}
	// The worker goes on.
	buf := make([]byte, 2)
	rr, err := w.RecvTag(buf, 1, ^uint64(0), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ep.SendTag([]byte("ok"), 1, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := rr.Wait(ctx); err != nil || string(buf) != "ok" {
		t.Fatalf("after panic: %v %q", err, buf)
	}
}

func TestWaitHonoursContext(t *testing.T) {
	c := newContext(t)
	w := newWorker(t, c, ThreadModeMulti)
	defer w.Close()
	buf := make([]byte, 8)
	r, err := w.RecvTag(buf, 77, ^uint64(0), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := r.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait: %v", err)
	}
}

// An operation in flight keeps its endpoint reachable until it completes: the endpoint's
// finalizer (CloseForce) must not run under it. Before, a request held only the worker, so
// a send whose caller dropped the endpoint failed with "endpoint closed locally" once the
// collector ran.
func TestInFlightRequestKeepsEndpoint(t *testing.T) {
	a, b, _, _ := progressedPair(t)
	const size = 1 << 20
	data := pattern(size, 5)
	// A synchronous send completes only once the receiver matched it, which it has not.
	r, ref := func() (*Request, weak.Pointer[Endpoint]) {
		ep := dial(t, a, b)
		r, err := ep.SendTagSync(data, 7, nil)
		if err != nil || r == nil {
			t.Fatalf("SendTagSync: %v, %v", r, err)
		}
		return r, weak.Make(ep)
	}()
	runtime.GC()
	runtime.GC()
	if ref.Value() == nil {
		t.Fatal("the endpoint of a send in flight was collected")
	}
	buf := make([]byte, size)
	rr, err := b.RecvTag(buf, 7, ^uint64(0), nil)
	if err != nil {
		t.Fatal(err)
	}
	wait(t, rr)
	wait(t, r)
	if !bytes.Equal(buf, data) {
		t.Fatal("data differs")
	}
	// Completed: the request lets go of the endpoint.
	runtime.GC()
	runtime.GC()
	if ref.Value() != nil {
		t.Fatal("a completed request still holds its endpoint")
	}
	runtime.KeepAlive(r)
}
