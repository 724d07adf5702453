package courier

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// iov copies the segment list into C memory (the segments themselves are pinned by the
// request); the library copies the list during the call, so it is freed right after.
func iov(bufs [][]byte) (*C.courier_iov_t, C.size_t, func()) {
	n := len(bufs)
	p := C.cg_iov_alloc(C.size_t(n))
	for i, b := range bufs {
		C.cg_iov_set(p, C.size_t(i), bytePtr(b), C.size_t(len(b)))
	}
	return p, C.size_t(n), func() { C.free(unsafe.Pointer(p)) }
}

// ----- tag ---------------------------------------------------------------------------

// SendTag sends data with tag. data must not change until the request completes.
func (e *Endpoint) SendTag(data []byte, tag uint64, cb Callback) (*Request, error) {
	return e.sendTag(data, tag, false, cb)
}

// SendTagSync sends data with tag; it completes only when the receiver has matched it.
func (e *Endpoint) SendTagSync(data []byte, tag uint64, cb Callback) (*Request, error) {
	return e.sendTag(data, tag, true, cb)
}

func (e *Endpoint) sendTag(data []byte, tag uint64, sync bool, cb Callback) (*Request, error) {
	if err := e.enter(); err != nil {
		return nil, err
	}
	defer e.leave()
	o, err := e.newOp(cb)
	if err != nil {
		return nil, err
	}
	n := len(data)
	copied := o.stage(nil, data)
	if copied {
		data = nil // passed in the slot
	}
	s := C.cg_tag_send(uptr(unsafe.Pointer(e.ptr)), uptr(bytePtr(data)), C.size_t(n), C.uint64_t(tag), cbool(sync),
		uptr(unsafe.Pointer(o.sl)), cbool(copied))
	runtime.KeepAlive(e)
	runtime.KeepAlive(data)
	return o.started(s)
}

// SendTagIOV sends one message gathered from several buffers.
func (e *Endpoint) SendTagIOV(bufs [][]byte, tag uint64, cb Callback) (*Request, error) {
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
		return C.courier_ep_tag_send_iov(e.ptr, v, n, C.uint64_t(tag), p, out)
	})
}

// RecvTag receives the first message whose tag matches (msgTag^tag)&mask == 0 into buf.
// Info reports the message's length and tag; a longer message fails with ErrTruncated.
func (w *Worker) RecvTag(buf []byte, tag, mask uint64, cb Callback) (*Request, error) {
	if !w.enter() {
		return nil, errClosed("worker")
	}
	defer w.leave()
	o, err := w.newOp(cb)
	if err != nil {
		return nil, err
	}
	o.request() // its Info matters even when it completes at once
	o.pin(buf)
	defer runtime.KeepAlive(w)
	return o.call(func(p *C.courier_op_params_t, out **C.courier_request_t) C.courier_status_t {
		return C.courier_worker_tag_recv(w.ptr, bytePtr(buf), C.size_t(len(buf)), C.uint64_t(tag), C.uint64_t(mask), p, out)
	})
}

// RecvTagIOV receives one message scattered into several buffers.
func (w *Worker) RecvTagIOV(bufs [][]byte, tag, mask uint64, cb Callback) (*Request, error) {
	if !w.enter() {
		return nil, errClosed("worker")
	}
	defer w.leave()
	o, err := w.newOp(cb)
	if err != nil {
		return nil, err
	}
	o.request() // its Info matters even when it completes at once
	o.pin(bufs...)
	v, n, free := iov(bufs)
	defer free()
	defer runtime.KeepAlive(w)
	return o.call(func(p *C.courier_op_params_t, out **C.courier_request_t) C.courier_status_t {
		return C.courier_worker_tag_recv_iov(w.ptr, v, n, C.uint64_t(tag), C.uint64_t(mask), p, out)
	})
}

// ProbeTag looks for an arrived, unreceived message matching tag/mask without receiving
// it.
func (w *Worker) ProbeTag(tag, mask uint64) (Info, bool, error) {
	if !w.enter() {
		return Info{}, false, errClosed("worker")
	}
	defer w.leave()
	var info C.courier_request_info_t
	s, err := call(func() C.courier_status_t {
		return C.courier_worker_tag_probe(w.ptr, C.uint64_t(tag), C.uint64_t(mask), &info)
	})
	runtime.KeepAlive(w)
	if s == C.COURIER_ERR_NO_MESSAGE {
		return Info{}, false, nil
	}
	if err != nil {
		return Info{}, false, err
	}
	return Info{Length: int(info.length), Tag: uint64(info.tag)}, true, nil
}

// ----- stream ------------------------------------------------------------------------

// SendStream sends stream bytes.
func (e *Endpoint) SendStream(data []byte, cb Callback) (*Request, error) {
	if err := e.enter(); err != nil {
		return nil, err
	}
	defer e.leave()
	o, err := e.newOp(cb)
	if err != nil {
		return nil, err
	}
	n := len(data)
	copied := o.stage(nil, data)
	if copied {
		data = nil // passed in the slot
	}
	s := C.cg_stream_send(uptr(unsafe.Pointer(e.ptr)), uptr(bytePtr(data)), C.size_t(n), uptr(unsafe.Pointer(o.sl)), cbool(copied))
	runtime.KeepAlive(e)
	runtime.KeepAlive(data)
	return o.started(s)
}

// SendStreamIOV sends stream bytes gathered from several buffers.
func (e *Endpoint) SendStreamIOV(bufs [][]byte, cb Callback) (*Request, error) {
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
		return C.courier_ep_stream_send_iov(e.ptr, v, n, p, out)
	})
}

func streamFlags(waitAll bool) C.uint32_t {
	if waitAll {
		return C.COURIER_STREAM_RECV_FLAG_WAITALL
	}
	return 0
}

// RecvStream receives stream bytes into buf: whatever has arrived (at least one byte), or
// with waitAll exactly len(buf). Info.Length is the count.
func (e *Endpoint) RecvStream(buf []byte, waitAll bool, cb Callback) (*Request, error) {
	if err := e.enter(); err != nil {
		return nil, err
	}
	defer e.leave()
	o, err := e.newOp(cb)
	if err != nil {
		return nil, err
	}
	o.request() // its Info matters even when it completes at once
	o.pin(buf)
	defer runtime.KeepAlive(e)
	return o.call(func(p *C.courier_op_params_t, out **C.courier_request_t) C.courier_status_t {
		return C.courier_ep_stream_recv(e.ptr, bytePtr(buf), C.size_t(len(buf)), streamFlags(waitAll), p, out)
	})
}

// RecvStreamIOV receives stream bytes scattered into several buffers.
func (e *Endpoint) RecvStreamIOV(bufs [][]byte, waitAll bool, cb Callback) (*Request, error) {
	if err := e.enter(); err != nil {
		return nil, err
	}
	defer e.leave()
	o, err := e.newOp(cb)
	if err != nil {
		return nil, err
	}
	o.request() // its Info matters even when it completes at once
	o.pin(bufs...)
	v, n, free := iov(bufs)
	defer free()
	defer runtime.KeepAlive(e)
	return o.call(func(p *C.courier_op_params_t, out **C.courier_request_t) C.courier_status_t {
		return C.courier_ep_stream_recv_iov(e.ptr, v, n, streamFlags(waitAll), p, out)
	})
}
