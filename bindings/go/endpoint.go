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
	w        *Worker
	ptr      *C.courier_ep_t
	closed   atomic.Bool
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
	if w.closed.Load() {
		return nil, errClosed("worker")
	}
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

func (e *Endpoint) usable() error {
	if e.closed.Load() {
		return errClosed("endpoint")
	}
	return nil
}

// Worker is the endpoint's worker.
func (e *Endpoint) Worker() *Worker { return e.w }

// WaitConnected progresses until the endpoint is connected, failed, or timeout passed.
func (e *Endpoint) WaitConnected(timeout time.Duration) error {
	if err := e.usable(); err != nil {
		return err
	}
	_, err := call(func() C.courier_status_t {
		return C.courier_ep_wait_connected(e.ptr, C.int64_t(timeout.Milliseconds()))
	})
	runtime.KeepAlive(e)
	return err
}

// Connected reports whether the endpoint is connected; an error if it failed.
func (e *Endpoint) Connected() (bool, error) {
	if err := e.usable(); err != nil {
		return false, err
	}
	s, err := call(func() C.courier_status_t { return C.courier_ep_status(e.ptr) })
	runtime.KeepAlive(e)
	return s == C.COURIER_OK, err
}

// Transport is the transport carrying the endpoint ("self", "shm", "tcp"), "" before it
// connects.
func (e *Endpoint) Transport() string {
	if e.usable() != nil {
		return ""
	}
	s := C.GoString(C.courier_ep_transport(e.ptr))
	runtime.KeepAlive(e)
	return s
}

// LocalAddr is this side's socket address for an endpoint made by socket address (also
// after its upgrade to shared memory); nil for one made from a worker address.
func (e *Endpoint) LocalAddr() *net.TCPAddr {
	if e.usable() != nil {
		return nil
	}
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
	if err := e.usable(); err != nil {
		return err
	}
	_, err := call(func() C.courier_status_t { return C.courier_ep_flush(e.ptr) })
	runtime.KeepAlive(e)
	return err
}

// Close flushes, tells the peer and releases the endpoint. Safe to call twice.
func (e *Endpoint) Close() error {
	if e.borrowed || e.closed.Swap(true) {
		return nil
	}
	runtime.SetFinalizer(e, nil)
	_, err := call(func() C.courier_status_t { return C.courier_ep_close(e.ptr) })
	e.dropHandle()
	return err
}

// CloseForce releases the endpoint at once; operations in flight fail. Safe to call twice.
func (e *Endpoint) CloseForce() error {
	if e.borrowed || e.closed.Swap(true) {
		return nil
	}
	runtime.SetFinalizer(e, nil)
	_, err := call(func() C.courier_status_t { return C.courier_ep_close_force(e.ptr) })
	e.dropHandle()
	return err
}
