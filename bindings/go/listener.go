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
	"strconv"
	"sync/atomic"
	"unsafe"
)

// ListenerParams are the parameters of Worker.NewListener.
type ListenerParams struct {
	// Address to listen on, "ip:port" (port 0 picks a free one); "" is "0.0.0.0:0".
	Address string
	// ConnectionHandler runs inside progress for each client; it must Accept or Reject the
	// request (now, or later from a goroutine allowed to use the worker).
	ConnectionHandler func(req *ConnRequest)
}

// SetSocketAddress sets the address to listen on.
func (p *ListenerParams) SetSocketAddress(a *net.TCPAddr) *ListenerParams {
	p.Address = a.String()
	return p
}

// SetConnectionHandler sets the connection handler.
func (p *ListenerParams) SetConnectionHandler(f func(req *ConnRequest)) *ListenerParams {
	p.ConnectionHandler = f
	return p
}

// Listener accepts connection requests on a socket address.
type Listener struct {
	w       *Worker
	ptr     *C.courier_listener_t
	handler func(*ConnRequest)
	handle  cgo.Handle
	closed  atomic.Bool
	addr    *net.TCPAddr
}

// NewListener listens on params.Address.
func (w *Worker) NewListener(params *ListenerParams) (*Listener, error) {
	if !w.enter() {
		return nil, errClosed("worker")
	}
	defer w.leave()
	if params == nil || params.ConnectionHandler == nil {
		return nil, &Error{Status: ErrInvalidParam, Detail: "a listener needs a connection handler"}
	}
	l := &Listener{w: w, handler: params.ConnectionHandler}
	var lp C.courier_listener_params_t
	if params.Address != "" {
		s := C.CString(params.Address)
		defer C.free(unsafe.Pointer(s))
		lp.field_mask |= C.COURIER_LISTENER_FIELD_SOCK_ADDR
		lp.sockaddr = s
	}
	l.handle = cgo.NewHandle(l)
	C.cg_listener_handler(&lp, C.uintptr_t(l.handle))
	var ptr *C.courier_listener_t
	_, err := call(func() C.courier_status_t { return C.courier_listener_create(w.ptr, &lp, &ptr) })
	runtime.KeepAlive(w)
	if err != nil {
		l.handle.Delete()
		return nil, err
	}
	l.ptr = ptr
	var buf [C.COURIER_SOCKADDR_STRLEN]C.char
	if C.courier_listener_address(ptr, &buf[0], C.size_t(len(buf))) == C.COURIER_OK {
		l.addr, _ = net.ResolveTCPAddr("tcp", C.GoString(&buf[0]))
	}
	runtime.SetFinalizer(l, (*Listener).Close)
	return l, nil
}

// Addr is the bound address (with the port picked, if 0 was asked for).
func (l *Listener) Addr() *net.TCPAddr { return l.addr }

// Close stops listening. Safe to call twice.
func (l *Listener) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	runtime.SetFinalizer(l, nil)
	C.courier_listener_destroy(l.ptr)
	l.handle.Delete()
	return nil
}

// ConnRequest is a client asking to connect; Accept or Reject it exactly once.
type ConnRequest struct {
	w        *Worker
	ptr      *C.courier_conn_request_t
	answered atomic.Bool
	addr     string
	id       uint64
}

func newConnRequest(w *Worker, ptr *C.courier_conn_request_t) *ConnRequest {
	r := &ConnRequest{w: w, ptr: ptr}
	var a C.courier_conn_request_attr_t
	a.field_mask = C.COURIER_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR | C.COURIER_CONN_REQUEST_ATTR_FIELD_CLIENT_ID
	if C.courier_conn_request_query(ptr, &a) == C.COURIER_OK {
		r.addr = C.GoString(&a.client_address[0])
		r.id = uint64(a.client_id)
	}
	return r
}

// ClientAddr is the client's socket address, "ip:port".
func (r *ConnRequest) ClientAddr() string { return r.addr }

// ClientID is the id the client chose.
func (r *ConnRequest) ClientID() uint64 { return r.id }

// String describes the request.
func (r *ConnRequest) String() string {
	return r.addr + " (client id " + strconv.FormatUint(r.id, 10) + ")"
}

// Accept makes an endpoint to the client (params may be nil; only the error handler is
// used).
func (r *ConnRequest) Accept(params *EndpointParams) (*Endpoint, error) {
	if r.answered.Swap(true) {
		return nil, &Error{Status: ErrInvalidParam, Detail: "connection request already answered"}
	}
	e := &Endpoint{w: r.w}
	var cp C.courier_ep_params_t
	var p *EndpointParams
	if params != nil {
		p = &EndpointParams{ErrorHandler: params.ErrorHandler}
	}
	free := e.fill(p, &cp)
	defer free()
	var ptr *C.courier_ep_t
	_, err := call(func() C.courier_status_t { return C.courier_conn_request_accept(r.ptr, &cp, &ptr) })
	if err != nil {
		e.dropHandle()
		return nil, err
	}
	return newEndpoint(r.w, ptr, e), nil
}

// Reject refuses the client; its endpoint fails with ErrRejected.
func (r *ConnRequest) Reject() error {
	if r.answered.Swap(true) {
		return nil
	}
	_, err := call(func() C.courier_status_t { return C.courier_conn_request_reject(r.ptr) })
	return err
}
