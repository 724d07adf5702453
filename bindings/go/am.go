package courier

/*
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"runtime/cgo"
	"sync"
)

// AMFlags choose how an active message is sent.
type AMFlags uint32

// Active-message send flags.
const (
	// AMEager always sends eagerly (an error if the message does not fit one frame).
	AMEager AMFlags = C.COURIER_AM_SEND_FLAG_EAGER
	// AMRndv always uses rendezvous.
	AMRndv AMFlags = C.COURIER_AM_SEND_FLAG_RNDV
	// AMReply lets the receiver reply on the endpoint the message arrived on.
	AMReply AMFlags = C.COURIER_AM_SEND_FLAG_REPLY
)

type amEntry struct {
	w  *Worker
	fn func(*AMMessage)
}

// SetAMHandler registers the handler for active-message id (replacing any earlier one);
// nil drops every message with that id. The handler runs inside Progress.
func (w *Worker) SetAMHandler(id uint16, fn func(msg *AMMessage)) error {
	if w.closed.Load() {
		return errClosed("worker")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var h cgo.Handle
	var err error
	if fn == nil {
		_, err = call(func() C.courier_status_t { return C.courier_worker_set_am_handler(w.ptr, C.uint16_t(id), nil, nil) })
	} else {
		h = cgo.NewHandle(&amEntry{w: w, fn: fn})
		_, err = call(func() C.courier_status_t { return C.cg_set_am_handler(w.ptr, C.uint16_t(id), C.uintptr_t(h)) })
	}
	runtime.KeepAlive(w)
	if err != nil {
		if h != 0 {
			h.Delete()
		}
		return err
	}
	// The old handler can no longer be called: the library replaced it under its lock.
	if old, ok := w.amHandles[id]; ok {
		old.Delete()
		delete(w.amHandles, id)
	}
	if h != 0 {
		w.amHandles[id] = h
	}
	return nil
}

// SendAM sends an active message to handler id on the peer. header is copied at once; data
// must not change until the request completes.
func (e *Endpoint) SendAM(id uint16, header, data []byte, flags AMFlags, cb Callback) (*Request, error) {
	if err := e.usable(); err != nil {
		return nil, err
	}
	r := newRequest(e.w, cb, data)
	defer runtime.KeepAlive(e)
	defer runtime.KeepAlive(header)
	return r.start(func(p *C.courier_op_params_t, out **C.courier_request_t) C.courier_status_t {
		return C.courier_ep_am_send(e.ptr, C.uint16_t(id), bytePtr(header), C.size_t(len(header)),
			bytePtr(data), C.size_t(len(data)), C.uint32_t(flags), p, out)
	})
}

// SendAMIOV sends an active message whose data is gathered from several buffers.
func (e *Endpoint) SendAMIOV(id uint16, header []byte, bufs [][]byte, flags AMFlags, cb Callback) (*Request, error) {
	if err := e.usable(); err != nil {
		return nil, err
	}
	r := newRequest(e.w, cb, bufs...)
	v, n, free := iov(bufs)
	defer free()
	defer runtime.KeepAlive(e)
	return r.start(func(p *C.courier_op_params_t, out **C.courier_request_t) C.courier_status_t {
		return C.courier_ep_am_send_iov(e.ptr, C.uint16_t(id), bytePtr(header), C.size_t(len(header)), v, n, C.uint32_t(flags), p, out)
	})
}

// AMMessage is an active message as its handler sees it.
type AMMessage struct {
	// ID is the handler id.
	ID uint16
	// Header is a copy of the user header.
	Header []byte
	// Data is a copy of the eager data; nil when IsRndv (use ReceiveData).
	Data []byte
	// DataLen is the data's length, wherever it is.
	DataLen int

	w     *Worker
	rndv  bool
	reply *Endpoint
	ended chan struct{} // closed when the handler has returned

	mu        sync.Mutex
	desc      *C.courier_am_desc_t
	inHandler bool
	keep      bool
}

func newAMMessage(w *Worker, p *C.courier_am_recv_param_t) *AMMessage {
	m := &AMMessage{
		ID:        uint16(p.id),
		Header:    C.GoBytes(p.header, C.int(p.header_length)),
		DataLen:   int(p.data_length),
		w:         w,
		rndv:      p.flags&C.COURIER_AM_RECV_FLAG_RNDV != 0,
		desc:      p.desc,
		inHandler: true,
		ended:     make(chan struct{}),
	}
	if !m.rndv {
		m.Data = C.GoBytes(p.data, C.int(p.data_length))
	}
	if p.reply_ep != nil {
		m.reply = &Endpoint{w: w, ptr: p.reply_ep, borrowed: true}
	}
	return m
}

// endHandler settles the message when its handler returns: what to tell the library.
func (m *AMMessage) endHandler() C.courier_status_t {
	m.mu.Lock()
	defer close(m.ended)
	defer m.mu.Unlock()
	m.inHandler = false
	if m.reply != nil {
		m.reply.closed.Store(true) // lent for the handler only
	}
	if m.desc != nil && m.keep {
		return C.COURIER_INPROGRESS
	}
	m.desc = nil
	return C.COURIER_OK
}

// takeDesc hands out the descriptor once. A kept message's descriptor is handed out only
// after its handler returned, so another goroutine never races the handler.
func (m *AMMessage) takeDesc() *C.courier_am_desc_t {
	m.mu.Lock()
	kept := m.keep
	m.mu.Unlock()
	if kept {
		<-m.ended
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	d := m.desc
	m.desc = nil
	return d
}

// IsRndv reports whether the data is still at the sender.
func (m *AMMessage) IsRndv() bool { return m.rndv }

// ReplyEndpoint is the endpoint to reply on when the sender set AMReply, valid only
// during the handler (do not close it); nil otherwise.
func (m *AMMessage) ReplyEndpoint() *Endpoint {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.inHandler {
		return nil
	}
	return m.reply
}

// Keep keeps a rendezvous message's data at the sender after the handler returns, to
// receive it later with ReceiveData (or drop it with Release), from any goroutine allowed
// to use the worker. Call it in the handler; after Keep, ReceiveData and Release wait for
// the handler to return (so do not call them from the handler itself).
func (m *AMMessage) Keep() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.inHandler {
		m.keep = true
	}
}

// ReceiveData receives a rendezvous message's data into buf (at least DataLen bytes):
// inside the handler, or later after Keep.
func (m *AMMessage) ReceiveData(buf []byte, cb Callback) (*Request, error) {
	if m.w.closed.Load() {
		return nil, errClosed("worker")
	}
	desc := m.takeDesc()
	if desc == nil {
		return nil, &Error{Status: ErrInvalidParam, Detail: "no rendezvous data to receive (eager message, already received, or not kept)"}
	}
	r := newRequest(m.w, cb, buf)
	defer runtime.KeepAlive(m.w)
	return r.start(func(p *C.courier_op_params_t, out **C.courier_request_t) C.courier_status_t {
		return C.courier_worker_am_recv_data(m.w.ptr, desc, bytePtr(buf), C.size_t(len(buf)), p, out)
	})
}

// Release drops a kept rendezvous message's data (the sender's request completes).
func (m *AMMessage) Release() error {
	desc := m.takeDesc()
	if desc == nil {
		return nil
	}
	_, err := call(func() C.courier_status_t { return C.courier_worker_am_desc_release(m.w.ptr, desc) })
	runtime.KeepAlive(m.w)
	return err
}
