package courier

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
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
// completed at once (or, for those still in flight when the worker closes, with
// ErrCanceled as it is destroyed).
type Callback func(info Info, err error)

// Request is an operation in flight. It completes while the worker progresses; Wait
// progresses until it does. Its buffers stay pinned until completion.
//
// A send that completed at once (its callback, if any, already ran) returns a nil
// *Request and a nil error, so that the common case allocates nothing; every method works
// on a nil *Request as on a request that completed successfully (Info is then zero).
type Request struct {
	w *Worker
	// ep is the endpoint of an endpoint's operation while it is in flight: the worker's
	// slab holds the request, so the endpoint stays reachable (its finalizer would close it
	// under the operation) until the operation completes.
	ep   *Endpoint
	cb   Callback
	sl   *C.cg_slot_t // the slot while in flight
	slot uint32

	finished atomic.Bool // after the callback returned

	mu       sync.Mutex
	done     chan struct{} // made by Done
	ptr      *C.courier_request_t
	inCancel int  // Cancel calls using ptr outside the lock
	freeLate bool // finished during a Cancel: the last Cancel frees ptr
	info     Info
	err      error

	pinner *runtime.Pinner // from pinners, while buffers are pinned
}

// pinners keeps Pinners for reuse: a Pinner used for the first time sets a finalizer,
// which costs more than the pinning itself.
var pinners = sync.Pool{New: func() any { return new(runtime.Pinner) }}

// pendingOp is an operation between taking its slot and settling its starting call.
type pendingOp struct {
	w    *Worker
	ep   *Endpoint // the endpoint of an endpoint's operation
	cb   Callback
	sl   *C.cg_slot_t
	slot uint32
	r    *Request // made before the call when it pins buffers or must report Info
}

// newOp takes a slot for an operation.
func (w *Worker) newOp(cb Callback) (pendingOp, error) {
	sl, i, err := w.slab.get()
	if err != nil {
		return pendingOp{}, err
	}
	return pendingOp{w: w, cb: cb, sl: sl, slot: i}, nil
}

// newOp takes a slot for an operation on e (see Request.ep).
func (e *Endpoint) newOp(cb Callback) (pendingOp, error) {
	o, err := e.w.newOp(cb)
	o.ep = e
	return o, err
}

// request makes o's Request now (before the call): an operation that pins buffers, or
// whose Info matters even when it completes at once (receives, atomics).
func (o *pendingOp) request() *Request {
	if o.r == nil {
		o.r = &Request{w: o.w, cb: o.cb}
	}
	return o.r
}

// pin pins the buffers the library will keep using after the starting call returns, except
// those in host memory the library allocated (C memory: nothing to pin).
func (o *pendingOp) pin(bufs ...[]byte) {
	for _, b := range bufs {
		if len(b) > 0 && !hostAllocs.holds(b) {
			r := o.request()
			if r.pinner == nil {
				r.pinner = pinners.Get().(*runtime.Pinner)
			}
			r.pinner.Pin(&b[0])
		}
	}
}

// copyIn copies a small send's header and data into the slot's scratch, header first, so
// the library gets no Go pointer and nothing needs pinning; false when they do not fit.
func (o *pendingOp) copyIn(header, data []byte) bool {
	n := len(header) + len(data)
	if n > C.CG_SCRATCH || devices.holds(data) {
		return false // device memory goes to the library as it is
	}
	if n > 0 {
		dst := unsafe.Slice((*byte)(unsafe.Pointer(&o.sl.scratch[0])), n)
		copy(dst[copy(dst, header):], data)
	}
	return true
}

// stage hands a send's bytes over: copied into the slot when small (true: pass none),
// otherwise `data` stays pinned until the operation completes.
func (o *pendingOp) stage(header, data []byte) bool {
	if o.copyIn(header, data) {
		return true
	}
	o.pin(data)
	return false
}

func (r *Request) unpin() {
	if r.pinner != nil {
		r.pinner.Unpin()
		pinners.Put(r.pinner)
		r.pinner = nil
	}
}

// call runs a C starting call that takes the slot's params and request pointer; the OS
// thread stays the same so that the failure detail can be read.
func (o *pendingOp) call(f func(p *C.courier_op_params_t, out **C.courier_request_t) C.courier_status_t) (*Request, error) {
	runtime.LockOSThread()
	s := f(&o.sl.params, &o.sl.req)
	if s < 0 {
		C.cg_slot_fail(o.sl, s)
	}
	runtime.UnlockOSThread()
	return o.started(s)
}

// started settles what the starting call returned (its failure detail is in the slot).
func (o *pendingOp) started(s C.courier_status_t) (*Request, error) {
	w := o.w
	switch {
	case s == C.COURIER_INPROGRESS:
		r := o.request()
		r.sl, r.slot, r.ptr, r.ep = o.sl, o.slot, o.sl.req, o.ep
		if !w.slab.register(o.slot, r) {
			r.completed(nil) // delivered by another thread before r was registered
		}
		return r, nil
	case s >= 0:
		// Completed at once: no completion will come.
		info := infoOf(&o.sl.info)
		w.slab.put(o.sl)
		r := o.r
		if r == nil {
			callback(w, o.cb, info, nil)
			return nil, nil
		}
		r.unpin()
		r.info = info
		callback(w, r.cb, info, nil)
		r.finished.Store(true)
		return r, nil
	default:
		err := &Error{Status: Status(s), Detail: takeDetail(o.sl)}
		w.slab.put(o.sl)
		if o.r != nil {
			o.r.unpin()
		}
		return nil, err
	}
}

// completed records the completion the library reported in the slot and finishes r;
// b (may be nil) is the batch being delivered, which frees the C request later.
func (r *Request) completed(b *C.cg_batch_t) {
	s := C.courier_status_t(r.sl.status)
	r.info = infoOf(&r.sl.info)
	if s < 0 {
		r.err = &Error{Status: Status(s), Detail: takeDetail(r.sl)}
	}
	r.finish(b)
}

// finish frees the C request and the slot, unpins, and runs the callback. With a batch
// b, the C request is freed by the next progress call instead of a call of its own.
func (r *Request) finish(b *C.cg_batch_t) {
	sl := r.sl
	r.sl, r.ep = nil, nil
	r.w.slab.put(sl)
	r.mu.Lock()
	ptr := r.ptr
	r.ptr = nil
	if r.inCancel > 0 {
		r.freeLate, r.ptr, ptr = true, ptr, nil
	}
	r.mu.Unlock()
	if ptr != nil {
		if b != nil && b.ndead < C.CG_DEAD_MAX {
			b.dead[b.ndead] = ptr
			b.ndead++
		} else {
			C.courier_request_free(ptr)
		}
	}
	r.unpin()
	r.complete()
}

// complete runs r's callback and marks it finished, waking Done's channel.
func (r *Request) complete() {
	callback(r.w, r.cb, r.info, r.err)
	r.mu.Lock()
	r.finished.Store(true)
	ch := r.done
	r.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}

// closeWorker completes r, still in flight when its worker is destroyed (no call uses the
// worker), with ErrCanceled. It cancels the operation in the library first: true if it
// could, so the library no longer uses r's buffers (unpinned); false if the operation was
// too far along, so its buffers stay pinned (the caller keeps r). The slot is not given
// back: the library may still write its completion there.
func (r *Request) closeWorker() bool {
	r.mu.Lock()
	ptr := r.ptr
	r.ptr = nil
	r.mu.Unlock()
	canceled := false
	if ptr != nil {
		canceled = C.courier_request_cancel(ptr) == C.COURIER_OK
		C.courier_request_free(ptr) // an operation not canceled goes on in the library
	}
	r.sl, r.ep = nil, nil
	if canceled {
		r.unpin()
	}
	r.err = &Error{Status: ErrCanceled, Detail: "worker closed"}
	r.complete()
	return canceled
}

func callback(w *Worker, cb Callback, info Info, err error) {
	if cb == nil {
		return
	}
	defer func() {
		if v := recover(); v != nil {
			w.notePanic(v)
		}
	}()
	cb(info, err)
}

// closedChan is Done of a nil request.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// Done is closed when the request has completed (after its callback returned).
func (r *Request) Done() <-chan struct{} {
	if r == nil {
		return closedChan
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done == nil {
		r.done = make(chan struct{})
		if r.finished.Load() {
			close(r.done)
		}
	}
	return r.done
}

// Err is the request's result once Done is closed (nil on success).
func (r *Request) Err() error {
	if r == nil || !r.finished.Load() {
		return nil
	}
	return r.err
}

// Info is what the request reported once Done is closed.
func (r *Request) Info() Info {
	if r == nil || !r.finished.Load() {
		return Info{}
	}
	return r.info
}

// Wait progresses the worker until the request completes or ctx ends. With another
// goroutine progressing the worker it only waits. A ThreadModeSingle worker progresses only
// on its own thread: wait there, or have that thread progress.
func (r *Request) Wait(ctx context.Context) error {
	if r == nil {
		return nil
	}
	idle := 0
	for {
		if r.finished.Load() {
			return r.err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if r.w.closed.Load() {
			// Destroyed: its requests completed. Closed from a callback of a progress
			// call still under way (maybe this goroutine's): nothing progresses here.
			if r.finished.Load() {
				return r.err
			}
			return errClosed("worker")
		}
		if r.w.Progress() > 0 {
			idle = 0
			continue
		}
		idle++
		// Rarely: yielding from a goroutine locked to its thread costs microseconds.
		if idle > 1024 {
			idle = 0
			runtime.Gosched()
		}
	}
}

// Cancel asks the library to cancel the request; it then completes with ErrCanceled
// (callback included) in the next progress. Tag and stream receives and sends queued
// behind earlier ones can be canceled until they start moving data; after that, and for
// other operations (a rendezvous ReceiveData asks for the data as it starts), Cancel
// reports ErrNoResource.
func (r *Request) Cancel() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	if r.finished.Load() || r.ptr == nil {
		r.mu.Unlock()
		return nil
	}
	ptr := r.ptr
	r.inCancel++
	r.mu.Unlock()
	// Without the lock: a cancel may complete the request, which finishes it here.
	w := r.w
	if !w.enter() {
		r.mu.Lock()
		r.inCancel--
		r.mu.Unlock()
		// Closed: the request completes (canceled) as the worker is destroyed.
		return errClosed("worker")
	}
	b, own := w.takeBatch()
	runtime.LockOSThread()
	s := C.cg_cancel(ptr, b)
	err := lastError(s)
	runtime.UnlockOSThread()
	w.deliver(b)
	w.putBatch(b, own)
	r.mu.Lock()
	r.inCancel--
	if r.inCancel == 0 && r.freeLate {
		r.freeLate = false
		C.courier_request_free(r.ptr)
		r.ptr = nil
	}
	r.mu.Unlock()
	w.leave()
	w.rethrow()
	return err
}
