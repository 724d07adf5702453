package courier

// The Go functions C calls. Each finds its Go object through a cgo.Handle passed as the
// callback's user_data and recovers any panic, which the worker re-raises from Progress:
// a Go panic must never unwind through C.

/*
#include <courier.h>
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

// handleValue is h's value, or nil for a handle already deleted (a late completion of an
// operation whose start failed).
func handleValue(ud unsafe.Pointer) (v any) {
	defer func() {
		if recover() != nil {
			v = nil
		}
	}()
	return cgo.Handle(uintptr(ud)).Value()
}

func detailOf(status C.courier_status_t) error {
	if status >= 0 {
		return nil
	}
	return &Error{Status: Status(status), Detail: C.GoString(C.courier_last_error_detail())}
}

//export courierGoCompletion
func courierGoCompletion(status C.courier_status_t, info *C.courier_request_info_t, ud unsafe.Pointer) {
	r, ok := handleValue(ud).(*Request)
	if !ok {
		return
	}
	r.complete(Info{Length: int(info.length), Tag: uint64(info.tag), Value: uint64(info.value)}, detailOf(status))
}

//export courierGoAM
func courierGoAM(param *C.courier_am_recv_param_t, ud unsafe.Pointer) (ret C.courier_status_t) {
	e, ok := handleValue(ud).(*amEntry)
	if !ok {
		return C.COURIER_OK
	}
	ret = C.COURIER_OK
	msg := newAMMessage(e.w, param)
	defer func() {
		if v := recover(); v != nil {
			e.w.notePanic(v)
		}
		ret = msg.endHandler()
	}()
	e.fn(msg)
	return
}

//export courierGoEpError
func courierGoEpError(ep *C.courier_ep_t, status C.courier_status_t, ud unsafe.Pointer) {
	e, ok := handleValue(ud).(*Endpoint)
	if !ok || e.onError == nil {
		return
	}
	err := detailOf(status)
	defer func() {
		if v := recover(); v != nil {
			e.w.notePanic(v)
		}
	}()
	e.onError(e, err)
}

//export courierGoConn
func courierGoConn(cr *C.courier_conn_request_t, ud unsafe.Pointer) {
	l, ok := handleValue(ud).(*Listener)
	if !ok {
		C.courier_conn_request_reject(cr)
		return
	}
	req := newConnRequest(l.w, cr)
	defer func() {
		if v := recover(); v != nil {
			l.w.notePanic(v)
		}
	}()
	l.handler(req)
}
