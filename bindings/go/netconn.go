package courier

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// net.Listener and net.Conn over Courier streams, so Go code written for TCP (net/http,
// gRPC, ...) runs over Courier's transports.
//
// Design: each Listener has one multi-thread worker shared by all connections it accepts;
// each Dial makes a worker of its own. A worker is progressed by one goroutine that sleeps
// on the worker's event fd when idle (the context needs FeatureWakeup for that; without it
// the goroutine polls). Reads receive into a per-connection buffer, so a Read that times out
// leaves its receive posted and the next Read picks it up; Writes wait until the library no
// longer needs the caller's bytes (or, with a write deadline, send a copy).

// Addr is a Courier stream address ("courier", "ip:port").
type Addr struct{ addr string }

// Network is "courier".
func (a Addr) Network() string { return "courier" }

// String is the socket address, "ip:port".
func (a Addr) String() string { return a.addr }

// progressor runs Worker.Progress on its own goroutine until stopped.
type progressor struct {
	w    *Worker
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

func startProgress(w *Worker) *progressor {
	p := &progressor{w: w, stop: make(chan struct{}), done: make(chan struct{})}
	go p.loop()
	return p
}

func (p *progressor) loop() {
	defer close(p.done)
	idle := 0
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		if p.w.Progress() > 0 {
			idle = 0
			continue
		}
		idle++
		if idle < 64 {
			runtime.Gosched()
			continue
		}
		idle = 0
		if armed, err := p.w.Arm(); err == nil && armed {
			// Woken by arrivals and by kick; the timeout bounds a missed wake-up.
			_ = p.w.Wait(5 * time.Millisecond)
		} else {
			runtime.Gosched()
		}
	}
}

// kick wakes the progress goroutine after an operation was posted.
func (p *progressor) kick() { _ = p.w.Signal() }

func (p *progressor) close() {
	p.once.Do(func() {
		close(p.stop)
		p.kick()
		<-p.done
	})
}

// deadline is a settable point in time; waiters learn of changes through a channel.
type deadline struct {
	mu      sync.Mutex
	t       time.Time
	changed chan struct{}
}

func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	d.t = t
	if d.changed != nil {
		close(d.changed)
		d.changed = nil
	}
	d.mu.Unlock()
}

func (d *deadline) get() (time.Time, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.changed == nil {
		d.changed = make(chan struct{})
	}
	return d.t, d.changed
}

// waitReq waits for r, the deadline d, or the connection's close; nil when r is done.
func (c *streamConn) waitReq(r *Request, d *deadline) error {
	for {
		t, changed := d.get()
		var timer *time.Timer
		var expired <-chan time.Time
		if !t.IsZero() {
			left := time.Until(t)
			if left <= 0 {
				select {
				case <-r.Done():
					return nil
				default:
				}
				return os.ErrDeadlineExceeded
			}
			timer = time.NewTimer(left)
			expired = timer.C
		}
		select {
		case <-r.Done():
			if timer != nil {
				timer.Stop()
			}
			return nil
		case <-expired:
			// checked again at the top (the deadline may have moved meanwhile)
		case <-changed:
		case <-c.closed:
			if timer != nil {
				timer.Stop()
			}
			return net.ErrClosed
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

const connReadBuf = 64 << 10

// streamConn is a net.Conn over one endpoint's stream.
type streamConn struct {
	ep            *Endpoint
	prog          *progressor
	release       func() // after Close: let go of the worker (and its goroutine)
	local, remote net.Addr

	readMu  sync.Mutex
	rbuf    []byte
	pending *Request // a receive into rbuf, possibly from a Read that timed out
	left    []byte   // received, not yet read
	rerr    error    // sticky read error (EOF)

	writeMu sync.Mutex

	rd, wd    deadline
	closeOnce sync.Once
	closed    chan struct{}
}

func newStreamConn(ep *Endpoint, prog *progressor, release func(), local, remote net.Addr) *streamConn {
	return &streamConn{ep: ep, prog: prog, release: release, local: local, remote: remote,
		rbuf: make([]byte, connReadBuf), closed: make(chan struct{})}
}

func (c *streamConn) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

func (c *streamConn) opError(op string, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	return &net.OpError{Op: op, Net: "courier", Source: c.local, Addr: c.remote, Err: err}
}

// Read reads what has arrived, blocking until at least one byte has.
func (c *streamConn) Read(b []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	if c.isClosed() {
		return 0, c.opError("read", net.ErrClosed)
	}
	if len(c.left) > 0 {
		n := copy(b, c.left)
		c.left = c.left[n:]
		return n, nil
	}
	if c.rerr != nil {
		return 0, c.opError("read", c.rerr)
	}
	if len(b) == 0 {
		return 0, nil
	}
	if c.pending == nil {
		r, err := c.ep.RecvStream(c.rbuf, false, nil)
		if err != nil {
			return 0, c.opError("read", c.streamErr(err))
		}
		c.pending = r
		c.prog.kick()
	}
	if err := c.waitReq(c.pending, &c.rd); err != nil {
		return 0, c.opError("read", err)
	}
	r := c.pending
	c.pending = nil
	if err := r.Err(); err != nil {
		c.rerr = c.streamErr(err)
		return 0, c.opError("read", c.rerr)
	}
	got := c.rbuf[:r.Info().Length]
	n := copy(b, got)
	c.left = got[n:]
	return n, nil
}

// streamErr maps the library's end of a connection to io.EOF (or net.ErrClosed after a
// local Close).
func (c *streamConn) streamErr(err error) error {
	if c.isClosed() {
		return net.ErrClosed
	}
	if errors.Is(err, ErrPeerFailure) || errors.Is(err, ErrEndpointClosed) || errors.Is(err, ErrCanceled) {
		return io.EOF
	}
	return err
}

// writeErr is streamErr for a write: the peer's end of the connection is a broken pipe
// (as a TCP write after the peer closed), not io.EOF, which a writer does not expect.
func (c *streamConn) writeErr(err error) error {
	if err = c.streamErr(err); err == io.EOF {
		return syscall.EPIPE
	}
	return err
}

// Write sends all of b.
func (c *streamConn) Write(b []byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if c.isClosed() {
		return 0, c.opError("write", net.ErrClosed)
	}
	if len(b) == 0 {
		return 0, nil
	}
	data := b
	if t, _ := c.wd.get(); !t.IsZero() {
		// A write that times out returns while the send goes on: send a copy.
		data = append([]byte(nil), b...)
	}
	r, err := c.ep.SendStream(data, nil)
	if err != nil {
		return 0, c.opError("write", c.writeErr(err))
	}
	c.prog.kick()
	if err := c.waitReq(r, &c.wd); err != nil {
		if errors.Is(err, net.ErrClosed) && &data[0] == &b[0] {
			// The endpoint is closed (forced) below: the send fails and lets go of b.
			<-r.Done()
		}
		return 0, c.opError("write", err)
	}
	if err := r.Err(); err != nil {
		return 0, c.opError("write", c.writeErr(err))
	}
	return len(b), nil
}

// Close closes the connection; blocked Reads and Writes return net.ErrClosed.
func (c *streamConn) Close() error {
	first := false
	c.closeOnce.Do(func() {
		first = true
		close(c.closed)
	})
	if !first {
		return nil
	}
	// Graceful: flush what was written and tell the peer; in flight operations then fail.
	err := c.ep.Close()
	c.prog.kick()
	c.release()
	if err != nil && !errors.Is(err, ErrPeerFailure) && !errors.Is(err, ErrEndpointClosed) {
		return c.opError("close", err)
	}
	return nil
}

func (c *streamConn) LocalAddr() net.Addr  { return c.local }
func (c *streamConn) RemoteAddr() net.Addr { return c.remote }

func (c *streamConn) SetDeadline(t time.Time) error {
	c.rd.set(t)
	c.wd.set(t)
	return nil
}

func (c *streamConn) SetReadDeadline(t time.Time) error  { c.rd.set(t); return nil }
func (c *streamConn) SetWriteDeadline(t time.Time) error { c.wd.set(t); return nil }

// ----- listener ---------------------------------------------------------------------

// streamListener is a net.Listener whose connections are Courier streams.
type streamListener struct {
	l      *Listener
	w      *Worker
	prog   *progressor
	addr   net.Addr
	conns  chan *streamConn
	closed chan struct{}
	once   sync.Once
	mu     sync.Mutex
	refs   int // the listener and its open connections share the worker
}

// Listen listens for Courier stream connections on address ("ip:port"; port 0 picks one)
// with a worker of its own made from ctx (which needs FeatureStream; FeatureWakeup lets
// the listener's goroutine sleep when idle).
func Listen(ctx *Context, address string) (net.Listener, error) {
	w, err := ctx.NewWorker((&WorkerParams{}).SetThreadMode(ThreadModeMulti))
	if err != nil {
		return nil, err
	}
	sl := &streamListener{w: w, conns: make(chan *streamConn, 256), closed: make(chan struct{}), refs: 1}
	l, err := w.NewListener(&ListenerParams{Address: address, ConnectionHandler: sl.onConn})
	if err != nil {
		w.Close()
		return nil, err
	}
	sl.l = l
	sl.addr = Addr{l.Addr().String()}
	sl.prog = startProgress(w)
	return sl, nil
}

// onConn runs inside progress: accept and queue the connection.
func (sl *streamListener) onConn(r *ConnRequest) {
	select {
	case <-sl.closed:
		_ = r.Reject()
		return
	default:
	}
	ep, err := r.Accept(nil)
	if err != nil {
		return
	}
	sl.mu.Lock()
	sl.refs++
	sl.mu.Unlock()
	c := newStreamConn(ep, sl.prog, sl.release, sl.addr, Addr{r.ClientAddr()})
	select {
	case sl.conns <- c:
	default:
		c.Close() // backlog full
	}
}

// Accept waits for the next connection.
func (sl *streamListener) Accept() (net.Conn, error) {
	select {
	case c := <-sl.conns:
		return c, nil
	case <-sl.closed:
		return nil, &net.OpError{Op: "accept", Net: "courier", Addr: sl.addr, Err: net.ErrClosed}
	}
}

// Close stops listening. Connections already accepted stay open; the worker they share
// ends with the last of them.
func (sl *streamListener) Close() error {
	sl.once.Do(func() {
		close(sl.closed)
		sl.l.Close()
	drain:
		for {
			select {
			case c := <-sl.conns:
				c.Close()
			default:
				break drain
			}
		}
		sl.release()
	})
	return nil
}

// release drops one reference to the shared worker: the listener's own, or a connection's.
func (sl *streamListener) release() {
	sl.mu.Lock()
	sl.refs--
	last := sl.refs == 0
	sl.mu.Unlock()
	if last {
		sl.prog.close()
		sl.w.Close()
	}
}

// Addr is the bound address.
func (sl *streamListener) Addr() net.Addr { return sl.addr }

// ----- dial -----------------------------------------------------------------------------

// Dial connects to a Courier stream listener at address ("ip:port") with a worker of its
// own made from ctx; the worker ends with the connection.
func Dial(ctx *Context, address string) (net.Conn, error) {
	return DialContext(context.Background(), ctx, address)
}

// dialTimeout bounds a connection setup whose context has no deadline; dialSlice is how
// long one wait for it lasts before the context is looked at again.
const (
	dialTimeout = 30 * time.Second
	dialSlice   = 20 * time.Millisecond
)

// waitConnected waits until ep is connected, it failed, gctx ended (its error), or
// dialTimeout passed; in slices, so that a canceled context is seen promptly.
func waitConnected(gctx context.Context, ep *Endpoint) error {
	end, byCtx := time.Now().Add(dialTimeout), false
	if d, ok := gctx.Deadline(); ok && d.Before(end) {
		end, byCtx = d, true
	}
	for {
		if err := gctx.Err(); err != nil {
			return err
		}
		left := time.Until(end) // negative once past: the library must not see it
		if left <= 0 {
			if byCtx {
				return context.DeadlineExceeded // the context's, maybe a moment before it says so
			}
			return &Error{Status: ErrTimeout, Detail: "connection setup timed out after " + dialTimeout.String()}
		}
		err := ep.WaitConnected(min(left, dialSlice))
		if !errors.Is(err, ErrTimeout) {
			return err
		}
	}
}

// DialContext is Dial with a Go context bounding the connection setup: it returns the
// context's error (in a *net.OpError) once the context is done.
func DialContext(gctx context.Context, ctx *Context, address string) (net.Conn, error) {
	if err := gctx.Err(); err != nil {
		return nil, &net.OpError{Op: "dial", Net: "courier", Addr: Addr{address}, Err: err}
	}
	w, err := ctx.NewWorker((&WorkerParams{}).SetThreadMode(ThreadModeMulti))
	if err != nil {
		return nil, err
	}
	ep, err := w.NewEndpoint(&EndpointParams{SocketAddress: address})
	if err != nil {
		w.Close()
		return nil, &net.OpError{Op: "dial", Net: "courier", Addr: Addr{address}, Err: err}
	}
	if err := waitConnected(gctx, ep); err != nil {
		ep.CloseForce()
		w.Close()
		return nil, &net.OpError{Op: "dial", Net: "courier", Addr: Addr{address}, Err: err}
	}
	prog := startProgress(w)
	release := func() {
		prog.close()
		w.Close()
	}
	var local net.Addr = Addr{"courier-client"}
	if a := ep.LocalAddr(); a != nil {
		local = a
	}
	return newStreamConn(ep, prog, release, local, Addr{address}), nil
}
