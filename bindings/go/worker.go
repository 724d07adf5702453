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
	closed atomic.Bool

	// Registrations, not the data path.
	mu        sync.Mutex
	amHandles map[uint16]cgo.Handle

	// A panic raised by a Go callback inside progress, re-raised when Progress returns.
	panicked atomic.Pointer[panicBox]
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
	w := &Worker{ptr: ptr, amHandles: map[uint16]cgo.Handle{}}
	runtime.SetFinalizer(w, (*Worker).Close)
	return w, nil
}

func (w *Worker) notePanic(v any) {
	w.panicked.CompareAndSwap(nil, &panicBox{v})
}

func (w *Worker) rethrow() {
	if p := w.panicked.Swap(nil); p != nil {
		panic(p.v)
	}
}

// Progress handles arrivals, retries queued sends and runs callbacks; it returns how many
// events it handled. A panic in a callback is re-raised here, after the library is done.
func (w *Worker) Progress() int {
	if w.closed.Load() {
		return 0
	}
	n := int(C.courier_worker_progress(w.ptr))
	runtime.KeepAlive(w)
	w.rethrow()
	return n
}

// Arm prepares to sleep: true when nothing is waiting and the event fd will wake on the
// next arrival; false when the caller should progress instead.
func (w *Worker) Arm() (bool, error) {
	if w.closed.Load() {
		return false, errClosed("worker")
	}
	var armed C.bool
	_, err := call(func() C.courier_status_t { return C.courier_worker_arm(w.ptr, &armed) })
	runtime.KeepAlive(w)
	return bool(armed), err
}

// Wait sleeps until something arrives, Signal is called, or timeout passes (negative: no
// limit). It returns at once when there is work to progress.
func (w *Worker) Wait(timeout time.Duration) error {
	if w.closed.Load() {
		return errClosed("worker")
	}
	ms := int64(-1)
	if timeout >= 0 {
		ms = timeout.Milliseconds()
	}
	_, err := call(func() C.courier_status_t { return C.courier_worker_wait(w.ptr, C.int64_t(ms)) })
	runtime.KeepAlive(w)
	return err
}

// Signal wakes a thread sleeping in Wait; callable from any goroutine, also for a
// ThreadModeSingle worker.
func (w *Worker) Signal() error {
	if w.closed.Load() {
		return errClosed("worker")
	}
	_, err := call(func() C.courier_status_t { return C.courier_worker_signal(w.ptr) })
	runtime.KeepAlive(w)
	return err
}

// EventFD is an fd that becomes readable when the worker has work (after Arm); the worker
// owns it.
func (w *Worker) EventFD() (int, error) {
	if w.closed.Load() {
		return -1, errClosed("worker")
	}
	var fd C.int
	_, err := call(func() C.courier_status_t { return C.courier_worker_event_fd(w.ptr, &fd) })
	runtime.KeepAlive(w)
	return int(fd), err
}

// Address is this worker's address, for peers to connect to (EndpointParams.SetWorkerAddress).
func (w *Worker) Address() ([]byte, error) {
	if w.closed.Load() {
		return nil, errClosed("worker")
	}
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
	if w.closed.Load() {
		return nil, errClosed("worker")
	}
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

// Close destroys the worker. Close its endpoints and listeners first; requests still in
// flight never complete. Safe to call twice.
func (w *Worker) Close() error {
	if w.closed.Swap(true) {
		return nil
	}
	runtime.SetFinalizer(w, nil)
	C.courier_worker_destroy(w.ptr)

	w.mu.Lock()
	for id, h := range w.amHandles {
		h.Delete()
		delete(w.amHandles, id)
	}
	w.mu.Unlock()
	return nil
}
