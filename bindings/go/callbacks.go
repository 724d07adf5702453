package courier

// The Go functions C calls (from shim.c). Each finds its Go object through a cgo.Handle
// passed as the callback's user_data and recovers any panic, which the worker re-raises
// from Progress: a Go panic must never unwind through C. Those that run inside a progress
// call first deliver the events batched so far (batch), so that the order is the library's.

/*
#include <stdint.h>
#include <courier.h>
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

// handleValue is h's value, or nil for a handle already deleted (a late callback of an
// object already closed).
func handleValue(h uintptr) (v any) {
	defer func() {
		if recover() != nil {
			v = nil
		}
	}()
	return cgo.Handle(h).Value()
}

// flushBatch delivers the events batched so far by w's progress call (batch belongs to
// the worker whose progress is running on this thread, maybe another one).
func (w *Worker) flushBatch(batch unsafe.Pointer) {
	b := (*cgBatch)(batch)
	if b != nil && uintptr(b.worker) == uintptr(w.handle) && b.n != 0 {
		w.deliver(b)
	}
}

//export courierGoDone
func courierGoDone(slot unsafe.Pointer) {
	s := (*cgSlot)(slot)
	if w := workerOf(uintptr(s.worker)); w != nil {
		w.done(uint32(s.index), nil)
	}
}

//export courierGoAM
func courierGoAM(param unsafe.Pointer, worker C.uintptr_t, batch unsafe.Pointer) C.courier_status_t {
	w := workerOf(uintptr(worker))
	if w == nil {
		return C.COURIER_OK
	}
	w.flushBatch(batch)
	return w.runAM((*C.courier_am_recv_param_t)(param))
}

//export courierGoEpError
func courierGoEpError(ep unsafe.Pointer, status C.courier_status_t, h C.uintptr_t, batch unsafe.Pointer) {
	e, ok := handleValue(uintptr(h)).(*Endpoint)
	if !ok || e.onError == nil || e.refs.Load()&epClosed != 0 {
		return // closed: the handler is not called after Close
	}
	e.w.flushBatch(batch)
	err := detailOf(status)
	defer func() {
		if v := recover(); v != nil {
			e.w.notePanic(v)
		}
	}()
	e.onError(e, err)
}

//export courierGoConn
func courierGoConn(cr unsafe.Pointer, h C.uintptr_t, batch unsafe.Pointer) {
	req := (*C.courier_conn_request_t)(cr)
	l, ok := handleValue(uintptr(h)).(*Listener)
	if !ok {
		C.courier_conn_request_reject(req)
		return
	}
	l.w.flushBatch(batch)
	cq := newConnRequest(l.w, req)
	defer func() {
		if v := recover(); v != nil {
			l.w.notePanic(v)
		}
	}()
	l.handler(cq)
}

func detailOf(status C.courier_status_t) error {
	if status >= 0 {
		return nil
	}
	return &Error{Status: Status(status), Detail: C.GoString(C.courier_last_error_detail())}
}
