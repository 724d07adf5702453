package courier

/*
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
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

// SetAMHandler registers the handler for active-message id (replacing any earlier one);
// nil drops every message with that id. The handler runs inside Progress.
func (w *Worker) SetAMHandler(id uint16, fn func(msg *AMMessage)) error {
	if !w.enter() {
		return errClosed("worker")
	}
	defer w.leave()
	w.mu.Lock()
	defer w.mu.Unlock()
	var err error
	if fn == nil {
		_, err = call(func() C.courier_status_t { return C.courier_worker_set_am_handler(w.ptr, C.uint16_t(id), nil, nil) })
	} else {
		_, err = call(func() C.courier_status_t { return C.cg_set_am_handler(w.ptr, C.uint16_t(id), C.uintptr_t(w.handle)) })
	}
	runtime.KeepAlive(w)
	if err != nil {
		return err
	}
	var t []func(*AMMessage)
	if old := w.am.Load(); old != nil {
		t = *old
	}
	t = append([]func(*AMMessage){}, t...)
	for len(t) <= int(id) {
		t = append(t, nil)
	}
	t[id] = fn
	w.am.Store(&t)
	return nil
}

func (w *Worker) amHandler(id uint16) func(*AMMessage) {
	if t := w.am.Load(); t != nil && int(id) < len(*t) {
		return (*t)[id]
	}
	return nil
}

// runEagerAM runs the handler of a batched eager message: src (C memory, valid until the
// batch is emptied) holds its header (the first hl bytes) and data. primary: the batch is
// the worker's own, whose holder may lend the worker's message and cut copies from its
// chunk instead of allocating.
func (w *Worker) runEagerAM(id uint16, src []byte, hl int, primary bool) {
	fn := w.amHandler(id)
	if fn == nil {
		return // unregistered since: dropped, as the library drops it
	}
	var b []byte
	var m *AMMessage
	lent := primary && !w.amMsgBusy
	if lent {
		b = w.amCopy(src)
		m = &w.amMsg
		w.amMsgBusy = true
	} else {
		b = append(make([]byte, 0, len(src)), src...)
		m = new(AMMessage)
	}
	// No reply endpoint, no descriptor: nothing to settle when the handler returns, so the
	// message is not marked as in its handler (ReplyEndpoint is nil, Keep does nothing).
	*m = AMMessage{ID: id, Header: b[:hl:hl], Data: b[hl:], DataLen: len(src) - hl, w: w}
	defer w.endEagerAM(lent)
	fn(m)
}

// endEagerAM ends an eager message's handler (deferred: it recovers a panic).
func (w *Worker) endEagerAM(lent bool) {
	if lent {
		w.amMsgBusy = false
	}
	if v := recover(); v != nil {
		w.notePanic(v)
	}
}

// amCopy copies src into the worker's chunk: one allocation for many small messages. The
// copies are the handlers' to keep (a kept one keeps its chunk alive).
func (w *Worker) amCopy(src []byte) []byte {
	const chunk = 32 << 10
	if len(src) > chunk/8 {
		return append(make([]byte, 0, len(src)), src...)
	}
	if len(src) > len(w.amBytes) {
		w.amBytes = make([]byte, chunk)
	}
	b := w.amBytes[:len(src):len(src)]
	copy(b, src)
	w.amBytes = w.amBytes[len(src):]
	return b
}

// runRndvAM runs the handler of a batched rendezvous message: hdr (C memory, valid until
// the batch is emptied) is its header, desc the descriptor the library kept for it. What
// the handler neither received nor kept is released, which tells the sender. primary: as
// for runEagerAM (the lent message is replaced when the handler keeps it).
func (w *Worker) runRndvAM(id uint16, hdr []byte, dataLen int, desc *C.courier_am_desc_t, primary bool) {
	fn := w.amHandler(id)
	if fn == nil { // unregistered since: declined, as the library does
		w.releaseDesc(desc)
		return
	}
	var m *AMMessage
	var h []byte
	lent := primary && !w.rndvMsgBusy
	if lent {
		if w.rndvMsg == nil {
			w.rndvMsg = new(AMMessage)
		}
		m, h = w.rndvMsg, w.amCopy(hdr)
		w.rndvMsgBusy = true
	} else {
		m, h = new(AMMessage), append([]byte(nil), hdr...)
	}
	*m = AMMessage{ID: id, Header: h, DataLen: dataLen, w: w, rndv: true, desc: desc, inHandler: true}
	w.callAMHandler(fn, m)
	d, kept := m.settle()
	if lent {
		w.rndvMsgBusy = false
		if kept {
			w.rndvMsg = nil // the handler's now
		}
	}
	w.releaseDesc(d)
}

// callAMHandler runs fn(m), recovering a panic.
func (w *Worker) callAMHandler(fn func(*AMMessage), m *AMMessage) {
	defer func() {
		if v := recover(); v != nil {
			w.notePanic(v)
		}
	}()
	fn(m)
}

// releaseDesc declines a rendezvous message nobody received or kept (nil: nothing to do).
// The caller (a delivery inside a progress or cancel call) holds a use of the worker, which
// may be closed meanwhile but is not destroyed.
func (w *Worker) releaseDesc(d *C.courier_am_desc_t) {
	if d == nil {
		return
	}
	C.courier_worker_am_desc_release(w.ptr, d)
	runtime.KeepAlive(w)
}

// runAM runs the handler of a message delivered by a direct call from the library
// (rendezvous, reply, or large messages): what it returns tells the library whether the
// rendezvous descriptor is kept.
func (w *Worker) runAM(p *C.courier_am_recv_param_t) (ret C.courier_status_t) {
	fn := w.amHandler(uint16(p.id))
	if fn == nil {
		return C.COURIER_OK
	}
	ret = C.COURIER_OK
	m := newAMMessage(w, p)
	defer func() {
		if v := recover(); v != nil {
			w.notePanic(v)
		}
		ret = m.endHandler()
	}()
	fn(m)
	return
}

// SendAM sends an active message to handler id on the peer. header is copied at once; data
// must not change until the request completes.
func (e *Endpoint) SendAM(id uint16, header, data []byte, flags AMFlags, cb Callback) (*Request, error) {
	if err := e.enter(); err != nil {
		return nil, err
	}
	defer e.leave()
	o, err := e.newOp(cb)
	if err != nil {
		return nil, err
	}
	hl, dl := len(header), len(data)
	copied := o.stage(header, data)
	if copied {
		header, data = nil, nil // passed in the slot
	}
	s := C.cg_am_send(uptr(unsafe.Pointer(e.ptr)), C.uint16_t(id), uptr(bytePtr(header)), C.size_t(hl),
		uptr(bytePtr(data)), C.size_t(dl), C.uint32_t(flags), uptr(unsafe.Pointer(o.sl)), cbool(copied))
	runtime.KeepAlive(e)
	runtime.KeepAlive(header)
	runtime.KeepAlive(data)
	return o.started(s)
}

// SendAMIOV sends an active message whose data is gathered from several buffers.
func (e *Endpoint) SendAMIOV(id uint16, header []byte, bufs [][]byte, flags AMFlags, cb Callback) (*Request, error) {
	if err := e.enter(); err != nil {
		return nil, err
	}
	defer e.leave()
	o, err := e.newOp(cb)
	if err != nil {
		return nil, err
	}
	o.pin(bufs...)
	v, n, free := iov(bufs)
	defer free()
	defer runtime.KeepAlive(e)
	return o.call(func(p *C.courier_op_params_t, out **C.courier_request_t) C.courier_status_t {
		return C.courier_ep_am_send_iov(e.ptr, C.uint16_t(id), bytePtr(header), C.size_t(len(header)), v, n, C.uint32_t(flags), p, out)
	})
}

// AMMessage is an active message as its handler sees it. The *AMMessage is lent to the
// handler: do not use it after the handler returned, except a rendezvous message kept with
// Keep (the worker reuses the struct of the others). Header and Data are copies the
// handler may keep.
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

	mu        sync.Mutex
	desc      *C.courier_am_desc_t
	inHandler bool
	keep      bool
	ended     chan struct{} // made by Keep, closed when the handler has returned
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
	}
	if !m.rndv {
		m.Data = C.GoBytes(p.data, C.int(p.data_length))
	}
	if p.reply_ep != nil {
		m.reply = &Endpoint{w: w, ptr: p.reply_ep, borrowed: true}
	}
	return m
}

// endHandler settles a message delivered by a direct call when its handler returns: what
// to tell the library (which releases a descriptor not kept).
func (m *AMMessage) endHandler() C.courier_status_t {
	if _, kept := m.settle(); kept {
		return C.COURIER_INPROGRESS
	}
	return C.COURIER_OK
}

// settle ends the handler's turn: a reply endpoint is no longer lent; kept says whether
// the handler kept the descriptor, release is the descriptor it neither received nor kept
// (forgotten here, for the caller to release).
func (m *AMMessage) settle() (release *C.courier_am_desc_t, kept bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.inHandler = false
	if m.reply != nil {
		m.reply.refs.Or(epClosed) // lent for the handler only
	}
	if m.keep {
		close(m.ended)
		return nil, true
	}
	d := m.desc
	m.desc = nil
	return d, false
}

// takeDesc hands out the descriptor once. A kept message's descriptor is handed out only
// after its handler returned, so another goroutine never races the handler.
func (m *AMMessage) takeDesc() *C.courier_am_desc_t {
	m.mu.Lock()
	if m.keep {
		ended := m.ended
		m.mu.Unlock()
		<-ended
		m.mu.Lock()
	}
	d := m.desc
	m.desc = nil
	m.mu.Unlock()
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
	if m.inHandler && m.desc != nil && !m.keep {
		m.keep = true
		m.ended = make(chan struct{})
	}
}

// ReceiveData receives a rendezvous message's data into buf (at least DataLen bytes):
// inside the handler, or later after Keep.
func (m *AMMessage) ReceiveData(buf []byte, cb Callback) (*Request, error) {
	// The worker is not destroyed while the call uses it (a Close meanwhile waits).
	if !m.w.enter() {
		return nil, errClosed("worker")
	}
	defer m.w.leave()
	desc := m.takeDesc()
	if desc == nil {
		return nil, &Error{Status: ErrInvalidParam, Detail: "no rendezvous data to receive (eager message, already received, or not kept)"}
	}
	o, err := m.w.newOp(cb)
	if err != nil {
		m.mu.Lock()
		m.desc = desc // still the caller's to receive or release
		m.mu.Unlock()
		return nil, err
	}
	o.request() // its Info matters even when it completes at once
	o.pin(buf)  // so its address may pass as an integer
	s := C.cg_am_recv_data(uptr(unsafe.Pointer(m.w.ptr)), uptr(unsafe.Pointer(desc)), uptr(bytePtr(buf)),
		C.size_t(len(buf)), uptr(unsafe.Pointer(o.sl)))
	runtime.KeepAlive(m.w)
	runtime.KeepAlive(buf)
	return o.started(s)
}

// Release drops a kept rendezvous message's data (the sender's request completes).
func (m *AMMessage) Release() error {
	// The worker is not destroyed while the call uses it (a Close meanwhile waits); once
	// it is closed, the library dropped the descriptor with it.
	if !m.w.enter() {
		return errClosed("worker")
	}
	defer m.w.leave()
	desc := m.takeDesc()
	if desc == nil {
		return nil
	}
	_, err := call(func() C.courier_status_t { return C.courier_worker_am_desc_release(m.w.ptr, desc) })
	runtime.KeepAlive(m.w)
	return err
}
