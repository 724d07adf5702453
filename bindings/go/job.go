package courier

/*
#include <stdlib.h>
#include <courier.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// Job is the job this process belongs to: its rank and size, found from whichever launcher
// started it (courier run, Open MPI's mpirun through PMIx, Slurm's srun with PMI-2 or
// PMIx, MPICH's hydra with PMI-1; without one, a job of one), a key-value exchange, a
// barrier, abort, and the job's random authentication key. One per process: InitJob
// returns handles to the same job.
type Job struct {
	ptr *C.courier_job_t
	mu  sync.Mutex
}

// InitJob joins the job (the first call in a process connects to the launcher).
func InitJob() (*Job, error) {
	var p *C.courier_job_t
	if _, err := call(func() C.courier_status_t { return C.courier_job_init(&p) }); err != nil {
		return nil, err
	}
	j := &Job{ptr: p}
	runtime.SetFinalizer(j, func(j *Job) {
		if j.ptr != nil {
			C.courier_job_destroy(j.ptr)
		}
	})
	return j, nil
}

// Close leaves the launcher's exchange and releases this handle. Call it before the
// program exits: Go's os.Exit skips the C exit handlers that would otherwise do it, and
// mpirun counts a process that never finalized as failed. Exchange calls on any handle of
// the job fail afterwards. Safe to call twice.
func (j *Job) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.ptr != nil {
		C.courier_job_finalize(j.ptr)
		C.courier_job_destroy(j.ptr)
		j.ptr = nil
	}
	return nil
}

func (j *Job) handle() (*C.courier_job_t, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.ptr == nil {
		return nil, errClosed("job")
	}
	return j.ptr, nil
}

func (j *Job) number(f func(*C.courier_job_t, *C.uint32_t) C.courier_status_t) uint32 {
	p, err := j.handle()
	if err != nil {
		return 0
	}
	var n C.uint32_t
	f(p, &n)
	runtime.KeepAlive(j)
	return uint32(n)
}

// Rank is this process's rank, 0 to Size()-1.
func (j *Job) Rank() uint32 {
	return j.number(func(p *C.courier_job_t, n *C.uint32_t) C.courier_status_t { return C.courier_job_rank(p, n) })
}

// Size is the number of ranks.
func (j *Job) Size() uint32 {
	return j.number(func(p *C.courier_job_t, n *C.uint32_t) C.courier_status_t { return C.courier_job_size(p, n) })
}

// LocalRank is the rank among the job's processes on this host.
func (j *Job) LocalRank() uint32 {
	return j.number(func(p *C.courier_job_t, n *C.uint32_t) C.courier_status_t { return C.courier_job_local_rank(p, n) })
}

// LocalSize is the number of the job's processes on this host.
func (j *Job) LocalSize() uint32 {
	return j.number(func(p *C.courier_job_t, n *C.uint32_t) C.courier_status_t { return C.courier_job_local_size(p, n) })
}

// HostID is this host's index in the job.
func (j *Job) HostID() uint32 {
	return j.number(func(p *C.courier_job_t, n *C.uint32_t) C.courier_status_t { return C.courier_job_host_id(p, n) })
}

// Launcher names the launcher: "courier run", "pmix", "pmi2", "pmi1" or "single".
func (j *Job) Launcher() string {
	p, err := j.handle()
	if err != nil {
		return ""
	}
	s := C.GoString(C.courier_job_launcher(p))
	runtime.KeepAlive(j)
	return s
}

// AuthKey is the job's random authentication key, the same in every rank.
func (j *Job) AuthKey() ([32]byte, error) {
	var k [32]byte
	p, err := j.handle()
	if err != nil {
		return k, err
	}
	var ck [C.COURIER_JOB_AUTH_KEY_LEN]C.uint8_t
	_, err = call(func() C.courier_status_t { return C.courier_job_auth_key(p, &ck[0]) })
	runtime.KeepAlive(j)
	for i := range k {
		k[i] = byte(ck[i])
	}
	return k, err
}

func ms(d time.Duration) C.uint64_t {
	if d < 0 {
		return 0
	}
	return C.uint64_t(d / time.Millisecond)
}

// Put publishes value under key for this rank; others see it after Commit or Fence.
func (j *Job) Put(key string, value []byte) error {
	p, err := j.handle()
	if err != nil {
		return err
	}
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	var pin runtime.Pinner
	defer pin.Unpin()
	var vp unsafe.Pointer
	if len(value) > 0 {
		pin.Pin(&value[0])
		vp = unsafe.Pointer(&value[0])
	}
	_, err = call(func() C.courier_status_t { return C.courier_job_put(p, ck, vp, C.size_t(len(value))) })
	runtime.KeepAlive(j)
	return err
}

// Commit makes this rank's puts visible.
func (j *Job) Commit() error {
	p, err := j.handle()
	if err != nil {
		return err
	}
	_, err = call(func() C.courier_status_t { return C.courier_job_commit(p) })
	runtime.KeepAlive(j)
	return err
}

// Fence commits, then waits (at most timeout) until every rank has reached it.
func (j *Job) Fence(timeout time.Duration) error {
	p, err := j.handle()
	if err != nil {
		return err
	}
	_, err = call(func() C.courier_status_t { return C.courier_job_fence(p, ms(timeout)) })
	runtime.KeepAlive(j)
	return err
}

// Barrier waits (at most timeout) until every rank has reached it.
func (j *Job) Barrier(timeout time.Duration) error {
	p, err := j.handle()
	if err != nil {
		return err
	}
	_, err = call(func() C.courier_status_t { return C.courier_job_barrier(p, ms(timeout)) })
	runtime.KeepAlive(j)
	return err
}

// Get is rank's value for key, waiting at most timeout for it to be committed.
func (j *Job) Get(rank uint32, key string, timeout time.Duration) ([]byte, error) {
	p, err := j.handle()
	if err != nil {
		return nil, err
	}
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	var v unsafe.Pointer
	var n C.size_t
	_, err = call(func() C.courier_status_t {
		return C.courier_job_get(p, C.uint32_t(rank), ck, ms(timeout), &v, &n)
	})
	runtime.KeepAlive(j)
	if err != nil {
		return nil, err
	}
	defer C.courier_buffer_free(v)
	return C.GoBytes(v, C.int(n)), nil
}

// Abort ends the whole job, every rank, with exit code code. It does not return.
func (j *Job) Abort(code int, message string) {
	cm := C.CString(message)
	p, _ := j.handle()
	C.courier_job_abort(p, C.int(code), cm)
	panic("courier_job_abort returned")
}

// JobWorld is a worker's view of the job: its address published once, an endpoint to a
// rank made the first time it is asked for (lazily), or to every rank at once
// (ConnectAll).
type JobWorld struct {
	job     *Job
	w       *Worker
	key     string
	timeout time.Duration
	mu      sync.Mutex
	eps     map[uint32]*Endpoint
}

// NewJobWorld publishes w's address and fences: every rank calls it. Lookups and fences
// wait at most timeout.
func NewJobWorld(j *Job, w *Worker, timeout time.Duration) (*JobWorld, error) {
	addr, err := w.Address()
	if err != nil {
		return nil, err
	}
	jw := &JobWorld{job: j, w: w, key: "addr.go", timeout: timeout, eps: map[uint32]*Endpoint{}}
	if err := j.Put(jw.key, addr); err != nil {
		return nil, err
	}
	if err := j.Fence(timeout); err != nil {
		return nil, err
	}
	return jw, nil
}

// Endpoint is the endpoint to rank, connecting on first use. The world owns it: Close
// closes them all.
func (jw *JobWorld) Endpoint(rank uint32) (*Endpoint, error) {
	if rank >= jw.job.Size() {
		return nil, &Error{Status: ErrInvalidParam, Detail: fmt.Sprintf("rank %d is not in this job of %d", rank, jw.job.Size())}
	}
	jw.mu.Lock()
	ep := jw.eps[rank]
	jw.mu.Unlock()
	if ep != nil {
		return ep, nil
	}
	addr, err := jw.job.Get(rank, jw.key, jw.timeout)
	if err != nil {
		return nil, err
	}
	jw.mu.Lock()
	defer jw.mu.Unlock()
	if ep := jw.eps[rank]; ep != nil {
		return ep, nil
	}
	ep, err = jw.w.NewEndpoint((&EndpointParams{}).SetWorkerAddress(addr))
	if err != nil {
		return nil, err
	}
	jw.eps[rank] = ep
	return ep, nil
}

// ConnectAll connects to every rank now and waits until each connection is up.
func (jw *JobWorld) ConnectAll() error {
	n := jw.job.Size()
	me := jw.job.Rank()
	for i := uint32(1); i <= n; i++ {
		ep, err := jw.Endpoint((me + i) % n)
		if err != nil {
			return err
		}
		if err := ep.WaitConnected(jw.timeout); err != nil {
			return err
		}
	}
	return nil
}

// Connected is the number of endpoints made so far.
func (jw *JobWorld) Connected() int {
	jw.mu.Lock()
	defer jw.mu.Unlock()
	return len(jw.eps)
}

// Barrier is a job barrier during which the worker keeps progressing on this goroutine
// (peers waiting on this rank's connections are served meanwhile).
func (jw *JobWorld) Barrier(timeout time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- jw.job.Barrier(timeout) }()
	for {
		select {
		case err := <-done:
			return err
		default:
			if jw.w.Progress() == 0 {
				runtime.Gosched()
			}
		}
	}
}

// Close closes the endpoints the world made.
func (jw *JobWorld) Close() error {
	jw.mu.Lock()
	defer jw.mu.Unlock()
	var first error
	for r, ep := range jw.eps {
		if err := ep.Close(); err != nil && first == nil {
			first = err
		}
		delete(jw.eps, r)
	}
	return first
}
