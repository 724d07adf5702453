package courier

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"net"
	"runtime"
	"runtime/cgo"
	"sync/atomic"
	"time"
	"unsafe"
)

// EndpointParams are the parameters of Worker.NewEndpoint and ConnRequest.Accept. Set
// either a worker address or a socket address.
type EndpointParams struct {
	// WorkerAddress is a peer worker's address (Worker.Address).
	WorkerAddress []byte
	// SocketAddress is a listener's address, "ip:port".
	SocketAddress string
	// ClientID is shown to the listener's connection handler.
	ClientID uint64
	// ErrorHandler is called once, inside progress, when the endpoint fails (the peer
	// died, closed, or rejected the connection). Not called after Close.
	ErrorHandler func(ep *Endpoint, err error)
}

// SetWorkerAddress connects to a worker by its address.
func (p *EndpointParams) SetWorkerAddress(a []byte) *EndpointParams { p.WorkerAddress = a; return p }

// SetSocketAddress connects to a listener.
func (p *EndpointParams) SetSocketAddress(a *net.TCPAddr) *EndpointParams {
	p.SocketAddress = a.String()
	return p
}

// SetClientID sets the id the listener sees.
func (p *EndpointParams) SetClientID(id uint64) *EndpointParams { p.ClientID = id; return p }

// SetErrorHandler sets the error handler.
func (p *EndpointParams) SetErrorHandler(f func(ep *Endpoint, err error)) *EndpointParams {
	p.ErrorHandler = f
	return p
}

// Endpoint is a connection to one peer worker.
type Endpoint struct {
	w   *Worker
	ptr *C.courier_ep_t
	// refs counts the calls into the library on this endpoint that are under way, with
	// epClosed (and epForce) set once it is closed: a Close racing a Read on a net.Conn
	// must not free the handle under the Read's call (see enter and release).
	refs     atomic.Int64
	released atomic.Bool
	borrowed bool // a reply endpoint lent to an active-message handler
	onError  func(ep *Endpoint, err error)
	handle   cgo.Handle
}

func newEndpoint(w *Worker, ptr *C.courier_ep_t, e *Endpoint) *Endpoint {
	if e == nil {
		e = &Endpoint{w: w}
	}
	e.ptr = ptr
	runtime.SetFinalizer(e, func(e *Endpoint) { e.CloseForce() })
	return e
}

// fill prepares C endpoint params; the returned func frees what it allocated.
func (e *Endpoint) fill(p *EndpointParams, cp *C.courier_ep_params_t) func() {
	var frees []unsafe.Pointer
	if p != nil {
		if len(p.WorkerAddress) > 0 {
			a := C.CBytes(p.WorkerAddress)
			frees = append(frees, a)
			cp.field_mask |= C.COURIER_EP_FIELD_REMOTE_ADDRESS
			cp.address = a
			cp.address_length = C.size_t(len(p.WorkerAddress))
		}
		if p.SocketAddress != "" {
			s := C.CString(p.SocketAddress)
			frees = append(frees, unsafe.Pointer(s))
			cp.field_mask |= C.COURIER_EP_FIELD_SOCK_ADDR | C.COURIER_EP_FIELD_CLIENT_ID
			cp.sockaddr = s
			cp.client_id = C.uint64_t(p.ClientID)
		}
		if p.ErrorHandler != nil {
			e.onError = p.ErrorHandler
			e.handle = cgo.NewHandle(e)
			C.cg_ep_err(cp, C.uintptr_t(e.handle))
		}
	}
	return func() {
		for _, f := range frees {
			C.free(f)
		}
	}
}

func (e *Endpoint) dropHandle() {
	if e.handle != 0 {
		e.handle.Delete()
		e.handle = 0
	}
}

// NewEndpoint connects to a peer. It returns at once; operations queue until the
// connection is up (WaitConnected waits for it).
func (w *Worker) NewEndpoint(params *EndpointParams) (*Endpoint, error) {
	if !w.enter() {
		return nil, errClosed("worker")
	}
	defer w.leave()
	e := &Endpoint{w: w}
	var cp C.courier_ep_params_t
	free := e.fill(params, &cp)
	defer free()
	var ptr *C.courier_ep_t
	_, err := call(func() C.courier_status_t { return C.courier_ep_create(w.ptr, &cp, &ptr) })
	runtime.KeepAlive(w)
	if err != nil {
		e.dropHandle()
		return nil, err
	}
	return newEndpoint(w, ptr, e), nil
}

// Bits of Endpoint.refs above the count of calls under way.
const (
	epClosed = int64(1) << 40 // closed: no new call may start
	epForce  = int64(1) << 41 // closed with CloseForce
)

// enter starts a call into the library on e; every successful enter is paired with a
// leave once the call has returned. It fails once e or its worker is closed (an operation
// on an endpoint whose worker is closed would never complete); the worker is not destroyed
// while the call is under way.
func (e *Endpoint) enter() error {
	if e.refs.Add(1)&epClosed != 0 {
		e.unref()
		return errClosed("endpoint")
	}
	if !e.w.enter() {
		e.unref()
		return errClosed("worker")
	}
	return nil
}

// leave ends a call started by enter.
func (e *Endpoint) leave() {
	e.w.leave()
	e.unref()
}

// unref drops a call's count. The last call to leave a closed endpoint releases its
// handle, which its closer left in place while the call was under way.
func (e *Endpoint) unref() {
	if e.refs.Add(-1)&^epForce == epClosed {
		e.release()
	}
}

// shut closes e to new calls and releases the handle now if no call is under way, else
// leaves that to the last call to return (which then cannot report the close's error).
func (e *Endpoint) shut(force bool) error {
	if e.borrowed {
		return nil
	}
	bits := epClosed
	if force {
		bits |= epForce
	}
	for {
		old := e.refs.Load()
		if old&epClosed != 0 {
			return nil
		}
		if e.refs.CompareAndSwap(old, old|bits) {
			runtime.SetFinalizer(e, nil)
			if old == 0 {
				return e.release()
			}
			return nil
		}
	}
}

// release closes the library's endpoint, once.
func (e *Endpoint) release() error {
	if e.borrowed || !e.released.CompareAndSwap(false, true) {
		return nil
	}
	var err error
	if e.refs.Load()&epForce != 0 {
		_, err = call(func() C.courier_status_t { return C.courier_ep_close_force(e.ptr) })
	} else {
		_, err = call(func() C.courier_status_t { return C.courier_ep_close(e.ptr) })
	}
	e.dropHandle()
	return err
}

// Worker is the endpoint's worker.
func (e *Endpoint) Worker() *Worker { return e.w }

// WaitConnected progresses until the endpoint is connected, failed, or timeout passed. A
// timeout of 0 or less (a deadline already past) only looks: ErrTimeout unless the
// endpoint is connected or failed.
func (e *Endpoint) WaitConnected(timeout time.Duration) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	ms := max(timeout.Milliseconds(), 0) // the library reads a negative timeout as a day
	_, err := call(func() C.courier_status_t {
		return C.courier_ep_wait_connected(e.ptr, C.int64_t(ms))
	})
	runtime.KeepAlive(e)
	return err
}

// Connected reports whether the endpoint is connected; an error if it failed.
func (e *Endpoint) Connected() (bool, error) {
	if err := e.enter(); err != nil {
		return false, err
	}
	defer e.leave()
	s, err := call(func() C.courier_status_t { return C.courier_ep_status(e.ptr) })
	runtime.KeepAlive(e)
	return s == C.COURIER_OK, err
}

// Transport is the transport carrying the endpoint ("self", "shm", "tcp"), "" before it
// connects.
func (e *Endpoint) Transport() string {
	if e.enter() != nil {
		return ""
	}
	defer e.leave()
	s := C.GoString(C.courier_ep_transport(e.ptr))
	runtime.KeepAlive(e)
	return s
}

// LocalAddr is this side's socket address for an endpoint made by socket address (also
// after its upgrade to shared memory); nil for one made from a worker address.
func (e *Endpoint) LocalAddr() *net.TCPAddr {
	if e.enter() != nil {
		return nil
	}
	defer e.leave()
	var buf [C.COURIER_SOCKADDR_STRLEN]C.char
	st := C.courier_ep_local_address(e.ptr, &buf[0], C.size_t(len(buf)))
	runtime.KeepAlive(e)
	if st != C.COURIER_OK {
		return nil
	}
	a, err := net.ResolveTCPAddr("tcp", C.GoString(&buf[0]))
	if err != nil {
		return nil
	}
	return a
}

// Flush progresses until every send on the endpoint has left this process.
func (e *Endpoint) Flush() error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	_, err := call(func() C.courier_status_t { return C.courier_ep_flush(e.ptr) })
	runtime.KeepAlive(e)
	return err
}

// Close flushes, tells the peer and releases the endpoint. Safe to call twice, and while
// other goroutines use the endpoint: their calls then fail as closed, and one under way
// when Close is called finishes first (the last of them releases the endpoint).
func (e *Endpoint) Close() error { return e.shut(false) }

// CloseForce releases the endpoint at once; operations in flight fail. Safe to call twice,
// and concurrently, as Close.
func (e *Endpoint) CloseForce() error { return e.shut(true) }
