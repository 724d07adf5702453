package courier

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"runtime"
	"runtime/cgo"
	"sync"
)

// Info is what a completed operation reports.
type Info struct {
	// Length is the number of bytes moved (for a receive: the message's length).
	Length int
	// Tag is the message's tag (tag receives).
	Tag uint64
	// Value is the word's old value (fetching atomics: Endpoint.Atomic).
	Value uint64
}

func infoOf(i *C.courier_request_info_t) Info {
	return Info{Length: int(i.length), Tag: uint64(i.tag), Value: uint64(i.value)}
}

// Callback is called once when an operation completes: inside Worker.Progress for
// operations that completed later, or before the starting method returns for those that
// completed at once.
type Callback func(info Info, err error)

// Request is an operation in flight. It completes while the worker progresses; Wait
// progresses until it does. Its buffers stay pinned until completion.
type Request struct {
	w    *Worker
	done chan struct{}
	cb   Callback

	mu       sync.Mutex
	ptr      *C.courier_request_t // the C request while in flight
	finished bool
	inCancel int  // Cancel calls using ptr outside the lock
	freeLate bool // completed during a Cancel: the last Cancel frees ptr
	info     Info
	err      error

	handle cgo.Handle
	pinner runtime.Pinner
	op     *opBlock
}

// opBlock is what the C call reads and writes: kept apart from Request so the memory C
// sees holds no Go pointer but its own (pinned) one.
type opBlock struct {
	params C.courier_op_params_t
	info   C.courier_request_info_t
}

// newRequest pins the C-visible block and the buffers.
func newRequest(w *Worker, cb Callback, bufs ...[]byte) *Request {
	r := &Request{w: w, done: make(chan struct{}), cb: cb, op: new(opBlock)}
	r.pinner.Pin(r.op)
	for _, b := range bufs {
		if len(b) > 0 {
			r.pinner.Pin(&b[0])
		}
	}
	r.handle = cgo.NewHandle(r)
	r.op.params = C.cg_op(C.uintptr_t(r.handle))
	r.op.params.info = &r.op.info
	return r
}

// start runs the C operation with the request's params and settles what it returned.
func (r *Request) start(op func(p *C.courier_op_params_t, out **C.courier_request_t) C.courier_status_t) (*Request, error) {
	var out *C.courier_request_t
	r.mu.Lock() // a completion on another thread waits until ptr is stored
	s, err := call(func() C.courier_status_t { return op(&r.op.params, &out) })
	switch {
	case err != nil:
		r.mu.Unlock()
		r.release()
		return nil, err
	case s == C.COURIER_INPROGRESS:
		r.ptr = out
		r.mu.Unlock()
		return r, nil
	default:
		r.mu.Unlock()
		r.complete(infoOf(&r.op.info), nil)
		return r, nil
	}
}

func (r *Request) release() {
	r.pinner.Unpin()
	r.handle.Delete()
}

// complete records the result, frees the C request, unpins, and runs the callback.
func (r *Request) complete(info Info, err error) {
	r.mu.Lock()
	if r.finished {
		r.mu.Unlock()
		return
	}
	r.finished = true
	r.info, r.err = info, err
	ptr := r.ptr
	r.ptr = nil
	if r.inCancel > 0 {
		r.freeLate, r.ptr, ptr = true, ptr, nil
	}
	r.mu.Unlock()
	if ptr != nil {
		C.courier_request_free(ptr)
	}
	r.release()
	// Done closes after the callback, so a waiter sees the callback's effects.
	defer close(r.done)
	if r.cb != nil {
		defer func() {
			if v := recover(); v != nil {
				r.w.notePanic(v)
			}
		}()
		r.cb(info, err)
	}
}

// Done is closed when the request has completed (after its callback returned).
func (r *Request) Done() <-chan struct{} { return r.done }

// Err is the request's result once Done is closed (nil on success).
func (r *Request) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Info is what the request reported once Done is closed.
func (r *Request) Info() Info {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.info
}

// Wait progresses the worker until the request completes or ctx ends. With another
// goroutine progressing the worker it only waits. A ThreadModeSingle worker progresses only
// on its own thread: wait there, or have that thread progress.
func (r *Request) Wait(ctx context.Context) error {
	idle := 0
	for {
		select {
		case <-r.done:
			return r.Err()
		default:
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if r.w.Progress() > 0 {
			idle = 0
			continue
		}
		idle++
		if idle > 16 {
			idle = 0
			runtime.Gosched()
		}
	}
}

// Cancel asks the library to cancel the request; it then completes with ErrCanceled. The
// library cancels only some kinds of requests (ErrUnsupported for the others).
func (r *Request) Cancel() error {
	r.mu.Lock()
	if r.finished || r.ptr == nil {
		r.mu.Unlock()
		return nil
	}
	ptr := r.ptr
	r.inCancel++
	r.mu.Unlock()
	// Without the lock: a cancel completes the request, which runs complete() here.
	_, err := call(func() C.courier_status_t { return C.courier_request_cancel(ptr) })
	r.mu.Lock()
	r.inCancel--
	if r.inCancel == 0 && r.freeLate {
		r.freeLate = false
		C.courier_request_free(r.ptr)
		r.ptr = nil
	}
	r.mu.Unlock()
	return err
}
