package courier

/*
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"runtime/cgo"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
	"weak"
)

// ThreadMode says which threads may use a worker.
type ThreadMode int

const (
	// ThreadModeSingle: only the OS thread that created the worker may use it (lock the
	// goroutine with runtime.LockOSThread). No locking inside.
	ThreadModeSingle ThreadMode = C.COURIER_THREAD_MODE_SINGLE
	// ThreadModeMulti: any goroutine may use the worker.
	ThreadModeMulti ThreadMode = C.COURIER_THREAD_MODE_MULTI
)

// WorkerParams are the parameters of Context.NewWorker.
type WorkerParams struct {
	ThreadMode ThreadMode
}

// SetThreadMode sets the thread mode.
func (p *WorkerParams) SetThreadMode(m ThreadMode) *WorkerParams { p.ThreadMode = m; return p }

// Worker is a progress engine with its own address and connections.
type Worker struct {
	ptr    *C.courier_worker_t
	closed atomic.Bool // set by Close: no new call may start
	// uses counts the calls using ptr that are under way (Progress, a send, ReceiveData,
	// ...), with wkClosed set by Close: the worker is destroyed when both are true, by
	// Close or by the last call to leave (a Close from inside a callback of a progress call
	// is thereby postponed until that call returns). See enter and leave.
	uses      atomic.Int64
	destroyed atomic.Bool

	// handle is the user_data of the worker's C callbacks: a cgo.Handle of a weak pointer,
	// so the handle does not keep the worker alive (its finalizer stays a backstop).
	handle cgo.Handle
	slab   slab
	// batch collects the events of one progress call at a time (see shim.h); a progress
	// call that finds it taken (another goroutine, or a callback that progresses) makes
	// its own.
	batch     *C.cg_batch_t
	batchBusy atomic.Bool

	// Active-message handlers indexed by id, replaced whole under mu (read without a lock).
	am atomic.Pointer[[]func(*AMMessage)]
	// For the messages of the primary batch, used only by whoever holds it: the messages
	// lent to eager and rendezvous handlers, and a chunk their Header and Data copies are
	// cut from.
	amMsg       AMMessage
	amMsgBusy   bool
	rndvMsg     *AMMessage // replaced when a handler keeps it
	rndvMsgBusy bool
	amBytes     []byte
	mu          sync.Mutex // registrations, not the data path

	// Whether the worker's context has the wakeup feature (Wait can sleep).
	wakeup bool

	// A panic raised by a Go callback inside progress, re-raised when Progress returns.
	panicked atomic.Pointer[panicBox]

	// Progress calls and the events they delivered, and when (since yieldBase) a goroutine
	// calling Progress last yielded.
	polls     atomic.Uint32
	lastYield atomic.Int64
}

// yieldEvery is how often Progress yields the processor to the Go scheduler. A goroutine
// that only calls Progress never blocks, so the runtime preempts it after 10 ms on one
// scheduling tick. Preempted inside the C call, it loses its P to another thread, and the
// runtime's monitor then polls every 20 µs for a while, retaking the P from every C call
// that spans one of its ticks (a large copy): on a process pinned to one CPU, thousands of
// thread switches a second, each taking the CPU from the copy. Yielding in Go code
// first costs one hand-off every few milliseconds (a goroutine locked to its thread
// passes its P to another thread and back) and keeps the monitor asleep.
const yieldEvery = 4 * time.Millisecond

var yieldBase = time.Now()

// maybeYield yields if no goroutine progressing w has for yieldEvery.
func (w *Worker) maybeYield() {
	now := int64(time.Since(yieldBase)) // one monotonic clock read
	last := w.lastYield.Load()
	if now-last < int64(yieldEvery) || !w.lastYield.CompareAndSwap(last, now) {
		return
	}
	runtime.Gosched()
}

type panicBox struct{ v any }

// NewWorker creates a worker (params may be nil: ThreadModeSingle).
func (c *Context) NewWorker(params *WorkerParams) (*Worker, error) {
	if c.closed.Load() {
		return nil, errClosed("context")
	}
	var wp C.courier_worker_params_t
	if params != nil {
		wp.field_mask = C.COURIER_WORKER_FIELD_THREAD_MODE
		wp.thread_mode = C.uint32_t(params.ThreadMode)
	}
	var ptr *C.courier_worker_t
	_, err := call(func() C.courier_status_t { return C.courier_worker_create(c.ptr, &wp, &ptr) })
	runtime.KeepAlive(c)
	if err != nil {
		return nil, err
	}
	w := &Worker{ptr: ptr}
	var f C.uint64_t
	if C.courier_context_features(c.ptr, &f) == C.COURIER_OK {
		w.wakeup = Feature(f)&FeatureWakeup != 0
	}
	runtime.KeepAlive(c)
	w.handle = cgo.NewHandle(weak.Make(w))
	w.slab.worker = uintptr(w.handle)
	w.batch = C.cg_batch_new(C.uintptr_t(w.handle))
	if w.batch == nil {
		C.courier_worker_destroy(ptr)
		w.handle.Delete()
		return nil, &Error{Status: ErrNoMemory, Detail: "no memory for the worker's event batch"}
	}
	runtime.SetFinalizer(w, (*Worker).closeFinal)
	return w, nil
}

// wkClosed is the bit of Worker.uses above the count of calls under way that Close sets.
const wkClosed = int64(1) << 40

// enter starts a call that uses the library's worker; false once the worker is closed.
// Every successful enter is paired with a leave once the call no longer uses it.
func (w *Worker) enter() bool {
	if w.uses.Add(1)&wkClosed != 0 {
		w.leave()
		return false
	}
	return true
}

// leave ends a call started by enter. The last call to leave a closed worker destroys it.
func (w *Worker) leave() {
	if w.uses.Add(-1) == wkClosed {
		w.destroy()
	}
}

// workerOf is the worker behind a callback's user_data (nil once it is gone).
func workerOf(h uintptr) *Worker {
	wp, ok := handleValue(h).(weak.Pointer[Worker])
	if !ok {
		return nil
	}
	return wp.Value()
}

// takeBatch is the worker's batch, or a new one when it is in use (own: free it after).
func (w *Worker) takeBatch() (b *C.cg_batch_t, own bool) {
	if w.batchBusy.CompareAndSwap(false, true) {
		return w.batch, false
	}
	b = C.cg_batch_new(C.uintptr_t(w.handle))
	if b == nil {
		panic("courier: no memory for an event batch")
	}
	return b, true
}

func (w *Worker) putBatch(b *C.cg_batch_t, own bool) {
	if own {
		C.cg_batch_free(b)
		return
	}
	w.batchBusy.Store(false)
}

// deliver runs the events collected in b, in order, and empties it. The cursor lives in
// b and b's fields are read afresh for every event: a callback may deliver the rest of b
// itself (a nested delivery) or add events (moving b's arrays).
func (w *Worker) deliver(b *C.cg_batch_t) {
	primary := b == w.batch
	for b.head < b.n {
		ev := (*C.cg_event_t)(unsafe.Add(unsafe.Pointer(b.ev), uintptr(b.head)*unsafe.Sizeof(C.cg_event_t{})))
		b.head++
		switch ev.kind {
		case C.CG_EV_DONE:
			w.done(uint32(ev.slot), b)
		case C.CG_EV_AM:
			hl, dl := int(ev.header_length), int(ev.data_length)
			src := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(b.arena), uintptr(ev.off))), hl+dl)
			w.runEagerAM(uint16(ev.id), src, hl, primary)
		case C.CG_EV_RNDV:
			hl := int(ev.header_length)
			hdr := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(b.arena), uintptr(ev.off))), hl)
			w.runRndvAM(uint16(ev.id), hdr, int(ev.data_length), ev.desc, primary)
		}
	}
	b.n, b.head, b.used = 0, 0, 0
}

// done delivers the completion of the operation in slot i (b: the batch it came in, or
// nil).
func (w *Worker) done(i uint32, b *C.cg_batch_t) {
	if r := w.slab.completion(i); r != nil {
		r.completed(b)
	}
}

func (w *Worker) notePanic(v any) {
	w.panicked.CompareAndSwap(nil, &panicBox{v})
}

func (w *Worker) rethrow() {
	if w.panicked.Load() == nil { // a load, not a swap, on every progress call
		return
	}
	if p := w.panicked.Swap(nil); p != nil {
		panic(p.v)
	}
}

// Progress handles arrivals, retries queued sends and runs callbacks, in the library's
// order; it returns how many events it handled. A callback that progresses the worker
// itself (Request.Wait) has the events that arrive meanwhile run inside that call, before
// the rest of the events its own call collected. A panic in a callback is re-raised here,
// after the library is done.
// Every few milliseconds of calls it yields the processor (runtime.Gosched), so that a
// goroutine looping on Progress is not preempted inside the library (see yieldEvery).
func (w *Worker) Progress() int {
	if !w.enter() {
		return 0
	}
	b, own := w.takeBatch()
	n := int(C.cg_progress(uptr(unsafe.Pointer(w.ptr)), uptr(unsafe.Pointer(b))))
	events := uint32(b.n)
	if events != 0 {
		w.deliver(b)
	}
	w.putBatch(b, own)
	w.leave() // destroys the worker if a callback closed it
	runtime.KeepAlive(w)
	w.rethrow()
	// The clock is read once every 64 calls and events: an idle call costs little, but an
	// event's handler may make a long C call (a rendezvous ReceiveData copies a piece), and
	// a call that delivers dozens of them would otherwise let the 4 ms run to 10.
	if p := w.polls.Add(1 + events); p>>6 != (p-1-events)>>6 {
		w.maybeYield()
	}
	return n
}

// Arm prepares to sleep: true when nothing is waiting and the event fd will wake on the
// next arrival; false when the caller should progress instead.
func (w *Worker) Arm() (bool, error) {
	if !w.enter() {
		return false, errClosed("worker")
	}
	defer w.leave()
	var armed C.bool
	_, err := call(func() C.courier_status_t { return C.courier_worker_arm(w.ptr, &armed) })
	runtime.KeepAlive(w)
	return bool(armed), err
}

// Wait sleeps until something arrives, Signal is called, or timeout passes (negative: no
// limit). It returns at once when there is work to progress.
func (w *Worker) Wait(timeout time.Duration) error {
	if !w.enter() {
		return errClosed("worker")
	}
	defer w.leave()
	ms := int64(-1)
	if timeout >= 0 {
		ms = timeout.Milliseconds()
	}
	_, err := call(func() C.courier_status_t { return C.courier_worker_wait(w.ptr, C.int64_t(ms)) })
	runtime.KeepAlive(w)
	return err
}

// canSleep says whether a WaitSleep wait can sleep on this worker's event fd.
func (w *Worker) canSleep() bool { return w.wakeup }

// Signal wakes a thread sleeping in Wait; callable from any goroutine, also for a
// ThreadModeSingle worker.
func (w *Worker) Signal() error {
	if !w.enter() {
		return errClosed("worker")
	}
	defer w.leave()
	_, err := call(func() C.courier_status_t { return C.courier_worker_signal(w.ptr) })
	runtime.KeepAlive(w)
	return err
}

// EventFD is an fd that becomes readable when the worker has work (after Arm); the worker
// owns it.
func (w *Worker) EventFD() (int, error) {
	if !w.enter() {
		return -1, errClosed("worker")
	}
	defer w.leave()
	var fd C.int
	_, err := call(func() C.courier_status_t { return C.courier_worker_event_fd(w.ptr, &fd) })
	runtime.KeepAlive(w)
	return int(fd), err
}

// Address is this worker's address, for peers to connect to (EndpointParams.SetWorkerAddress).
func (w *Worker) Address() ([]byte, error) {
	if !w.enter() {
		return nil, errClosed("worker")
	}
	defer w.leave()
	var p unsafe.Pointer
	var n C.size_t
	_, err := call(func() C.courier_status_t { return C.courier_worker_address(w.ptr, &p, &n) })
	runtime.KeepAlive(w)
	if err != nil {
		return nil, err
	}
	defer C.courier_buffer_free(p)
	return C.GoBytes(p, C.int(n)), nil
}

// IncomingEndpoint is the next endpoint a peer opened to this worker by its address, or
// nil if there is none now. (Endpoints made through a Listener go to its handler.)
func (w *Worker) IncomingEndpoint() (*Endpoint, error) {
	if !w.enter() {
		return nil, errClosed("worker")
	}
	defer w.leave()
	var ep *C.courier_ep_t
	s, err := call(func() C.courier_status_t { return C.courier_worker_incoming_ep(w.ptr, &ep) })
	runtime.KeepAlive(w)
	if s == C.COURIER_ERR_NO_MESSAGE {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return newEndpoint(w, ep, nil), nil
}

// Close destroys the worker. Close its endpoints and listeners first. Requests still in
// flight complete with ErrCanceled ("worker closed"); a buffer the library may still use
// (an operation too far along to cancel) stays pinned for good. Every later call on the
// worker fails as closed. Close from inside a callback of a progress call (a handler, a
// completion callback) takes effect at once for new calls, and the worker is destroyed
// when the outermost progress call on it returns; so is a Close that races calls on other
// goroutines. Safe to call twice.
func (w *Worker) Close() error {
	if !w.shut() {
		return nil
	}
	w.rethrow() // a panic of a completion callback run by Close
	return nil
}

// closeFinal is the finalizer: Close, re-raising nothing on the finalizer goroutine.
func (w *Worker) closeFinal() { w.shut() }

// shut closes w to new calls and destroys it now if no call is under way (else the last
// call to leave does); false if it was closed already.
func (w *Worker) shut() bool {
	w.uses.Add(1) // keeps ptr valid for the Signal below
	if w.uses.Or(wkClosed)&wkClosed != 0 {
		w.leave()
		return false
	}
	w.closed.Store(true)
	runtime.SetFinalizer(w, nil)
	if w.uses.Load() != wkClosed|1 {
		// Wake a call sleeping in Wait, so that it returns and the worker goes.
		C.courier_worker_signal(w.ptr)
	}
	w.leave()
	return true
}

// destroy completes the requests still in flight and destroys the library's worker, once;
// no call is using it.
func (w *Worker) destroy() {
	if !w.destroyed.CompareAndSwap(false, true) {
		return
	}
	// Requests in flight: canceled in the library where it still can (the library then
	// no longer touches their buffers); the others keep their buffers pinned, as an
	// endpoint that outlives the worker may still progress them. Their slots stay (the
	// library may still write them). Either way the Go request completes now.
	live := w.slab.close()
	var keep []*Request
	for _, r := range live {
		if !r.closeWorker() {
			keep = append(keep, r)
		}
	}
	if len(keep) > 0 {
		abandoned.Lock()
		abandoned.reqs = append(abandoned.reqs, keep...)
		abandoned.Unlock()
	}
	C.courier_worker_destroy(w.ptr)
	if w.batchBusy.CompareAndSwap(false, true) {
		C.cg_batch_free(w.batch)
	}
	w.handle.Delete()
}

// abandoned holds the requests of closed workers that the library may still use (their
// buffers stay pinned).
var abandoned struct {
	sync.Mutex
	reqs []*Request
}
