package courier

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// MemoryType is the kind of memory a region lives in.
type MemoryType uint32

// Memory types.
const (
	MemoryTypeHost MemoryType = C.COURIER_MEMORY_TYPE_HOST
	MemoryTypeCuda MemoryType = C.COURIER_MEMORY_TYPE_CUDA
	MemoryTypeNic  MemoryType = C.COURIER_MEMORY_TYPE_NIC
)

func (t MemoryType) String() string {
	switch t {
	case MemoryTypeHost:
		return "host"
	case MemoryTypeCuda:
		return "cuda"
	case MemoryTypeNic:
		return "nic"
	}
	return "unknown"
}

// Access is the set of rights peers get on a region.
type Access uint32

// Access rights.
const (
	AccessRead   Access = C.COURIER_ACCESS_READ
	AccessWrite  Access = C.COURIER_ACCESS_WRITE
	AccessAtomic Access = C.COURIER_ACCESS_ATOMIC
	AccessAll    Access = C.COURIER_ACCESS_ALL
)

// MemMapParams are the parameters of Context.MemMap: Allocate a Length, or register a
// Buffer.
type MemMapParams struct {
	// Buffer is an existing Go buffer to register (pinned while mapped).
	Buffer []byte
	// Length in bytes (for Allocate; a registered Buffer's length by default).
	Length int
	// Alloc lets the library allocate the memory (host memory goes in a shared segment
	// same-host peers map and reach without this process).
	Alloc bool
	// MemoryType asked for (default host).
	MemoryType MemoryType
	// Access given to peers (0: AccessAll).
	Access Access
}

// SetMemoryType sets the memory type.
func (p *MemMapParams) SetMemoryType(t MemoryType) *MemMapParams { p.MemoryType = t; return p }

// Allocate asks the library to allocate the memory.
func (p *MemMapParams) Allocate() *MemMapParams { p.Alloc = true; return p }

// SetLength sets the length.
func (p *MemMapParams) SetLength(n int) *MemMapParams { p.Length = n; return p }

// SetBuffer registers an existing buffer.
func (p *MemMapParams) SetBuffer(b []byte) *MemMapParams { p.Buffer = b; return p }

// SetAccess sets the rights peers get.
func (p *MemMapParams) SetAccess(a Access) *MemMapParams { p.Access = a; return p }

// MemAttr is what Memory.Query reports.
type MemAttr struct {
	// Address is the start in this process (peers use it as the remote address).
	Address uint64
	// Length in bytes.
	Length int
	// MemoryType actually given.
	MemoryType MemoryType
}

// Memory is a mapped region peers can reach with its remote key.
type Memory struct {
	ptr    *C.courier_mem_t
	closed atomic.Bool
	attr   MemAttr
	pinner runtime.Pinner // a registered Go buffer
	buf    []byte
	// hostAlloc: host memory the library allocated (in hostAllocs while mapped).
	hostAlloc bool
}

// MemMap registers or allocates memory.
func (c *Context) MemMap(params *MemMapParams) (*Memory, error) {
	if c.closed.Load() {
		return nil, errClosed("context")
	}
	if params == nil {
		return nil, &Error{Status: ErrInvalidParam, Detail: "MemMap needs params (a length to allocate or a buffer)"}
	}
	m := &Memory{}
	var mp C.courier_mem_map_params_t
	mp.field_mask = C.COURIER_MEM_MAP_FIELD_LENGTH | C.COURIER_MEM_MAP_FIELD_MEMORY_TYPE
	mp.memory_type = C.uint32_t(params.MemoryType)
	mp.length = C.size_t(params.Length)
	if params.Alloc {
		mp.field_mask |= C.COURIER_MEM_MAP_FIELD_FLAGS
		mp.flags = C.COURIER_MEM_MAP_FLAG_ALLOCATE
	}
	if params.Buffer != nil {
		if params.Length == 0 || params.Length > len(params.Buffer) {
			mp.length = C.size_t(len(params.Buffer))
		}
		if len(params.Buffer) > 0 {
			m.pinner.Pin(&params.Buffer[0])
			m.buf = params.Buffer
		}
		mp.field_mask |= C.COURIER_MEM_MAP_FIELD_ADDRESS
		mp.address = bytePtr(params.Buffer)
	}
	if params.Access != 0 {
		mp.field_mask |= C.COURIER_MEM_MAP_FIELD_ACCESS
		mp.access = C.uint32_t(params.Access)
	}
	_, err := call(func() C.courier_status_t { return C.courier_mem_map(c.ptr, &mp, &m.ptr) })
	runtime.KeepAlive(c)
	if err != nil {
		m.pinner.Unpin()
		return nil, err
	}
	var a C.courier_mem_attr_t
	if _, err := call(func() C.courier_status_t { return C.courier_mem_query(m.ptr, &a) }); err != nil {
		C.courier_mem_unmap(m.ptr)
		m.pinner.Unpin()
		return nil, err
	}
	m.attr = MemAttr{Address: uint64(uintptr(a.address)), Length: int(a.length), MemoryType: MemoryType(a.memory_type)}
	switch {
	case m.attr.MemoryType == MemoryTypeCuda:
		devices.add(m.attr.Address, m.attr.Length)
	case params.Alloc && m.buf == nil && m.attr.Length > 0:
		hostAllocs.add(m.attr.Address, m.attr.Length)
		m.hostAlloc = true
	}
	runtime.SetFinalizer(m, (*Memory).Close)
	return m, nil
}

// devices are the CUDA device regions mapped through MemMap: the binding never copies
// from them with the CPU (the library copies device memory with the CUDA driver).
var devices memRanges

// hostAllocs are the host regions the library allocated through MemMap (Alloc): C memory,
// which the garbage collector neither moves nor frees, so an operation on a buffer in one
// needs no pinning.
var hostAllocs memRanges

// memRanges is a set of address ranges, read on every operation without a lock: readers
// load an immutable snapshot, writers (MemMap, Close) replace it under mu.
type memRanges struct {
	mu   sync.Mutex
	snap atomic.Pointer[[][2]uint64] // start, end; nil when empty
}

func (d *memRanges) add(addr uint64, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var r [][2]uint64
	if old := d.snap.Load(); old != nil {
		r = append(r, *old...)
	}
	r = append(r, [2]uint64{addr, addr + uint64(n)})
	d.snap.Store(&r)
}

func (d *memRanges) remove(addr uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	old := d.snap.Load()
	if old == nil {
		return
	}
	r := make([][2]uint64, 0, len(*old))
	for _, x := range *old {
		if x[0] != addr {
			r = append(r, x)
		}
	}
	if len(r) == 0 {
		d.snap.Store(nil)
		return
	}
	d.snap.Store(&r)
}

// holds reports whether b starts in one of the ranges (a slice never spans two
// allocations, so all of it then lies there).
func (d *memRanges) holds(b []byte) bool {
	r := d.snap.Load()
	if r == nil || len(b) == 0 {
		return false
	}
	p := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	for _, x := range *r {
		if p >= x[0] && p < x[1] {
			return true
		}
	}
	return false
}

// Query reports the region's address, length and the memory type actually given.
func (m *Memory) Query() MemAttr { return m.attr }

// Bytes is the region as a byte slice (host memory; valid until Close). For a registered
// buffer it is that buffer.
func (m *Memory) Bytes() []byte {
	if m.buf != nil {
		return m.buf[:m.attr.Length]
	}
	if m.closed.Load() || m.attr.Length == 0 || m.attr.MemoryType == MemoryTypeCuda {
		return nil
	}
	return unsafe.Slice((*byte)(m.addr()), m.attr.Length)
}

// DeviceBytes is a CUDA region as a byte slice to pass to operations (sends, receives,
// puts, gets) and nothing else: the CPU cannot touch device memory, and reading or
// writing the slice in Go faults. Nil for host memory (use Bytes) and after Close.
func (m *Memory) DeviceBytes() []byte {
	if m.closed.Load() || m.attr.Length == 0 || m.attr.MemoryType != MemoryTypeCuda {
		return nil
	}
	return unsafe.Slice((*byte)(m.addr()), m.attr.Length)
}

// addr turns the C address back into a pointer the way C handed it out.
func (m *Memory) addr() unsafe.Pointer {
	var a C.courier_mem_attr_t
	C.courier_mem_query(m.ptr, &a)
	return a.address
}

// PackRkey packs the remote key peers unpack with Endpoint.UnpackRkey.
func (m *Memory) PackRkey() ([]byte, error) {
	if m.closed.Load() {
		return nil, errClosed("memory")
	}
	var p unsafe.Pointer
	var n C.size_t
	_, err := call(func() C.courier_status_t { return C.courier_rkey_pack(m.ptr, &p, &n) })
	runtime.KeepAlive(m)
	if err != nil {
		return nil, err
	}
	defer C.courier_buffer_free(p)
	return C.GoBytes(p, C.int(n)), nil
}

// SignalFetch reads the 8-byte signal word at offset (aligned).
func (m *Memory) SignalFetch(offset int) (uint64, error) {
	if m.closed.Load() {
		return 0, errClosed("memory")
	}
	var v C.uint64_t
	_, err := call(func() C.courier_status_t { return C.courier_signal_fetch(m.ptr, C.size_t(offset), &v) })
	runtime.KeepAlive(m)
	return uint64(v), err
}

// Cmp compares a signal word with a value.
type Cmp uint32

// Comparisons (OpenSHMEM's SHMEM_CMP_*).
const (
	CmpEQ Cmp = C.COURIER_CMP_EQ
	CmpNE Cmp = C.COURIER_CMP_NE
	CmpGT Cmp = C.COURIER_CMP_GT
	CmpGE Cmp = C.COURIER_CMP_GE
	CmpLT Cmp = C.COURIER_CMP_LT
	CmpLE Cmp = C.COURIER_CMP_LE
)

func (c Cmp) holds(a, b uint64) bool {
	switch c {
	case CmpEQ:
		return a == b
	case CmpNE:
		return a != b
	case CmpGT:
		return a > b
	case CmpGE:
		return a >= b
	case CmpLT:
		return a < b
	case CmpLE:
		return a <= b
	}
	return false
}

// WaitOption changes how SignalWaitUntil and Semaphore.Wait wait.
type WaitOption int

const (
	// WaitSleep: after a short spin, sleep instead of spinning. With a worker whose
	// context has the wakeup feature, the wait sleeps on the worker's event fd and a
	// peer's put-with-signal to that worker wakes it (framed, or written directly by a
	// same-host peer); other writes (a local Post, a peer's atomic) are seen within
	// COURIER_SIGNAL_NAP. The sleep is cut into slices of at most SleepSlice, after each
	// of which ctx is looked at. Without a worker, or without the wakeup feature, the
	// wait naps between looks (up to 1 ms).
	WaitSleep WaitOption = 1 << iota
)

// SleepSlice is the longest a WaitSleep wait sleeps before it looks at its context: a
// canceled context ends such a wait within about this long (one whose deadline passes
// ends it on time).
const SleepSlice = 10 * time.Millisecond

func sleeps(opts []WaitOption) bool {
	for _, o := range opts {
		if o&WaitSleep != 0 {
			return true
		}
	}
	return false
}

// SignalWaitUntil waits until the signal word at offset satisfies word <cmp> value and
// returns the value that did, progressing w meanwhile (nil: another goroutine progresses
// it), until ctx ends. It spins unless WaitSleep is given.
func (m *Memory) SignalWaitUntil(ctx context.Context, w *Worker, offset int, cmp Cmp, value uint64, opts ...WaitOption) (uint64, error) {
	if cmp > CmpLE {
		return 0, &Error{Status: ErrInvalidParam, Detail: "unknown comparison"}
	}
	check := func() (uint64, bool, error) {
		v, err := m.SignalFetch(offset)
		return v, err == nil && cmp.holds(v, value), err
	}
	if !sleeps(opts) {
		return pollUntil(ctx, w, check)
	}
	if w == nil || !w.canSleep() {
		return napUntil(ctx, w, check)
	}
	return sleepUntil(ctx, func(ms int64) (uint64, error) {
		if m.closed.Load() {
			return 0, errClosed("memory")
		}
		if !w.enter() {
			return 0, errClosed("worker")
		}
		defer w.leave()
		var v C.uint64_t
		_, err := call(func() C.courier_status_t {
			return C.courier_signal_wait_until(m.ptr, w.ptr, C.size_t(offset), C.uint32_t(cmp),
				C.uint64_t(value), C.COURIER_SIGNAL_WAIT_FLAG_SLEEP, C.int64_t(ms), &v)
		})
		runtime.KeepAlive(m)
		runtime.KeepAlive(w)
		return uint64(v), err
	})
}

// pollUntil calls check until it reports done, progressing w (if any) between calls.
func pollUntil(ctx context.Context, w *Worker, check func() (uint64, bool, error)) (uint64, error) {
	return lookUntil(ctx, w, false, check)
}

// napUntil is pollUntil that sleeps between idle looks, longer each time up to 1 ms: a
// WaitSleep wait with nothing to sleep on.
func napUntil(ctx context.Context, w *Worker, check func() (uint64, bool, error)) (uint64, error) {
	return lookUntil(ctx, w, true, check)
}

// lookUntil is pollUntil (nap false: yield now and then) and napUntil (nap true).
func lookUntil(ctx context.Context, w *Worker, nap bool, check func() (uint64, bool, error)) (uint64, error) {
	idle := 0
	sleep := 20 * time.Microsecond
	for {
		v, ok, err := check()
		if err != nil || ok {
			return v, err
		}
		if err := ctx.Err(); err != nil {
			return v, err
		}
		if w != nil && w.Progress() > 0 {
			idle = 0
			sleep = 20 * time.Microsecond
			continue
		}
		idle++
		switch {
		case nap && idle > 1:
			time.Sleep(sleep)
			sleep = min(2*sleep, time.Millisecond)
		case idle > 16:
			idle = 0
			runtime.Gosched()
		}
	}
}

// sleepUntil runs a sleeping C wait (wait(ms): the library's spin then sleep, for at most
// ms milliseconds; a COURIER_ERR_TIMEOUT when they pass) in slices of SleepSlice, looking
// at ctx between them.
func sleepUntil(ctx context.Context, wait func(ms int64) (uint64, error)) (uint64, error) {
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		slice := SleepSlice
		if d, ok := ctx.Deadline(); ok {
			// Round up: a deadline less than a millisecond away is still waited for.
			slice = min(slice, time.Until(d)+time.Millisecond-1)
		}
		v, err := wait(max(slice.Milliseconds(), 0))
		if !errors.Is(err, ErrTimeout) {
			return v, err
		}
	}
}

// Close unmaps the region; keys made from it stop working. Safe to call twice.
func (m *Memory) Close() error {
	if m.closed.Swap(true) {
		return nil
	}
	runtime.SetFinalizer(m, nil)
	switch {
	case m.attr.MemoryType == MemoryTypeCuda:
		devices.remove(m.attr.Address)
	case m.hostAlloc:
		hostAllocs.remove(m.attr.Address)
	}
	C.courier_mem_unmap(m.ptr)
	m.pinner.Unpin()
	m.buf = nil
	return nil
}

// ----- remote keys -------------------------------------------------------------------

// RemoteKey is a peer's remote key unpacked on the endpoint to that peer.
type RemoteKey struct {
	ptr    *C.courier_rkey_t
	ep     *Endpoint
	closed atomic.Bool
}

// UnpackRkey unpacks a peer's packed remote key for operations on e.
func (e *Endpoint) UnpackRkey(packed []byte) (*RemoteKey, error) {
	if err := e.enter(); err != nil {
		return nil, err
	}
	defer e.leave()
	k := &RemoteKey{ep: e}
	_, err := call(func() C.courier_status_t {
		return C.courier_ep_rkey_unpack(e.ptr, bytePtr(packed), C.size_t(len(packed)), &k.ptr)
	})
	runtime.KeepAlive(e)
	runtime.KeepAlive(packed)
	if err != nil {
		return nil, err
	}
	runtime.SetFinalizer(k, (*RemoteKey).Close)
	return k, nil
}

// Bounds is the region's start address and length in the owner's process.
func (k *RemoteKey) Bounds() (base, length uint64) {
	if k.closed.Load() {
		return 0, 0
	}
	var b, l C.uint64_t
	C.courier_rkey_bounds(k.ptr, &b, &l)
	runtime.KeepAlive(k)
	return uint64(b), uint64(l)
}

// Path is how operations reach the region: "local", "direct", "cma" or "remote".
func (k *RemoteKey) Path() string {
	if k.closed.Load() {
		return ""
	}
	s := C.GoString(C.courier_rkey_path(k.ptr))
	runtime.KeepAlive(k)
	return s
}

// Close releases the key. Safe to call twice.
func (k *RemoteKey) Close() error {
	if k.closed.Swap(true) {
		return nil
	}
	runtime.SetFinalizer(k, nil)
	C.courier_rkey_destroy(k.ptr)
	return nil
}

func (k *RemoteKey) usable() error {
	if k == nil || k.closed.Load() {
		return errClosed("remote key")
	}
	return nil
}

// ----- operations --------------------------------------------------------------------

// AtomicOp is a remote atomic operation.
type AtomicOp uint32

// Atomic operations.
const (
	AtomicAdd   AtomicOp = C.COURIER_ATOMIC_OP_ADD
	AtomicAnd   AtomicOp = C.COURIER_ATOMIC_OP_AND
	AtomicOr    AtomicOp = C.COURIER_ATOMIC_OP_OR
	AtomicXor   AtomicOp = C.COURIER_ATOMIC_OP_XOR
	AtomicSwap  AtomicOp = C.COURIER_ATOMIC_OP_SWAP
	AtomicCswap AtomicOp = C.COURIER_ATOMIC_OP_CSWAP
)

// SignalOp is how a put-with-signal updates its signal word.
type SignalOp uint32

// Signal operations.
const (
	SignalSet SignalOp = C.COURIER_SIGNAL_SET
	SignalAdd SignalOp = C.COURIER_SIGNAL_ADD
)

// Put writes data at raddr in the peer's region. data must not change until the request
// completes.
func (e *Endpoint) Put(data []byte, raddr uint64, k *RemoteKey, cb Callback) (*Request, error) {
	if err := e.enter(); err != nil {
		return nil, err
	}
	defer e.leave()
	if err := k.usable(); err != nil {
		return nil, err
	}
	o, err := e.newOp(cb)
	if err != nil {
		return nil, err
	}
	o.pin(data)
	defer runtime.KeepAlive(e)
	defer runtime.KeepAlive(k)
	return o.call(func(p *C.courier_op_params_t, out **C.courier_request_t) C.courier_status_t {
		return C.courier_ep_put(e.ptr, bytePtr(data), C.size_t(len(data)), C.uint64_t(raddr), k.ptr, p, out)
	})
}

// Get reads len(buf) bytes at raddr in the peer's region into buf.
func (e *Endpoint) Get(buf []byte, raddr uint64, k *RemoteKey, cb Callback) (*Request, error) {
	if err := e.enter(); err != nil {
		return nil, err
	}
	defer e.leave()
	if err := k.usable(); err != nil {
		return nil, err
	}
	o, err := e.newOp(cb)
	if err != nil {
		return nil, err
	}
	o.request() // its Info matters even when it completes at once
	o.pin(buf)
	defer runtime.KeepAlive(e)
	defer runtime.KeepAlive(k)
	return o.call(func(p *C.courier_op_params_t, out **C.courier_request_t) C.courier_status_t {
		return C.courier_ep_get(e.ptr, bytePtr(buf), C.size_t(len(buf)), C.uint64_t(raddr), k.ptr, p, out)
	})
}

// Atomic runs op on the 64-bit word at raddr (8-byte aligned); the word's old value is the
// completed request's Info().Value. compare is used by AtomicCswap only.
func (e *Endpoint) Atomic(op AtomicOp, value, compare, raddr uint64, k *RemoteKey, cb Callback) (*Request, error) {
	return e.atomic(op, 8, value, compare, raddr, k, cb)
}

// Atomic32 runs op on the 32-bit word at raddr (4-byte aligned).
func (e *Endpoint) Atomic32(op AtomicOp, value, compare uint32, raddr uint64, k *RemoteKey, cb Callback) (*Request, error) {
	return e.atomic(op, 4, uint64(value), uint64(compare), raddr, k, cb)
}

func (e *Endpoint) atomic(op AtomicOp, size int, value, compare, raddr uint64, k *RemoteKey, cb Callback) (*Request, error) {
	if err := e.enter(); err != nil {
		return nil, err
	}
	defer e.leave()
	if err := k.usable(); err != nil {
		return nil, err
	}
	o, err := e.newOp(cb)
	if err != nil {
		return nil, err
	}
	o.request() // its Info matters even when it completes at once
	defer runtime.KeepAlive(e)
	defer runtime.KeepAlive(k)
	return o.call(func(p *C.courier_op_params_t, out **C.courier_request_t) C.courier_status_t {
		return C.courier_ep_atomic(e.ptr, C.uint32_t(op), C.uint64_t(value), C.uint64_t(compare),
			C.uint32_t(size), C.uint64_t(raddr), k.ptr, p, out)
	})
}

// AtomicPost runs op (AtomicAdd, AtomicAnd, AtomicOr or AtomicXor) with value on the 64-bit
// word at raddr (8-byte aligned) without fetching the old value: nothing comes back and no
// Request is made. On a region mapped here it is done when AtomicPost returns; otherwise the
// owner answers only if it refuses it, and the next Flush confirms it or reports the
// refusal. AtomicSwap and AtomicCswap need a fetch: ErrInvalidParam (use Atomic).
func (e *Endpoint) AtomicPost(op AtomicOp, value, raddr uint64, k *RemoteKey) error {
	return e.atomicPost(op, 8, value, raddr, k)
}

// AtomicPost32 is AtomicPost on the 32-bit word at raddr (4-byte aligned).
func (e *Endpoint) AtomicPost32(op AtomicOp, value uint32, raddr uint64, k *RemoteKey) error {
	return e.atomicPost(op, 4, uint64(value), raddr, k)
}

func (e *Endpoint) atomicPost(op AtomicOp, size int, value, raddr uint64, k *RemoteKey) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	if err := k.usable(); err != nil {
		return err
	}
	_, err := call(func() C.courier_status_t {
		return C.courier_ep_atomic_post(e.ptr, C.uint32_t(op), C.uint64_t(value), C.uint32_t(size),
			C.uint64_t(raddr), k.ptr)
	})
	runtime.KeepAlive(e)
	runtime.KeepAlive(k)
	return err
}

// PutSignal writes data at raddr, then updates the 8-byte signal word at sigAddr (SignalSet
// or SignalAdd sigValue), as one operation: whoever sees the signal sees the data.
func (e *Endpoint) PutSignal(data []byte, raddr uint64, k *RemoteKey, sigAddr uint64, sigKey *RemoteKey,
	sigValue uint64, op SignalOp, cb Callback) (*Request, error) {
	if err := e.enter(); err != nil {
		return nil, err
	}
	defer e.leave()
	if err := k.usable(); err != nil {
		return nil, err
	}
	if err := sigKey.usable(); err != nil {
		return nil, err
	}
	o, err := e.newOp(cb)
	if err != nil {
		return nil, err
	}
	o.pin(data)
	defer runtime.KeepAlive(e)
	defer runtime.KeepAlive(k)
	defer runtime.KeepAlive(sigKey)
	return o.call(func(p *C.courier_op_params_t, out **C.courier_request_t) C.courier_status_t {
		return C.courier_ep_put_signal(e.ptr, bytePtr(data), C.size_t(len(data)), C.uint64_t(raddr), k.ptr,
			C.uint64_t(sigAddr), sigKey.ptr, C.uint64_t(sigValue), C.uint32_t(op), p, out)
	})
}

// Fence orders e's operations: those issued after it are carried out after those before.
func (e *Endpoint) Fence() error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	_, err := call(func() C.courier_status_t { return C.courier_ep_fence(e.ptr) })
	runtime.KeepAlive(e)
	return err
}

// ----- semaphores --------------------------------------------------------------------

// SemFlags choose a semaphore's kind (Berkeley UPC's bupc_sem_alloc flags).
type SemFlags uint32

// Semaphore flags; 0 is SemInteger|SemMProducer|SemMConsumer.
const (
	SemBoolean   SemFlags = C.COURIER_SEM_FLAG_BOOLEAN
	SemInteger   SemFlags = C.COURIER_SEM_FLAG_INTEGER
	SemSProducer SemFlags = C.COURIER_SEM_FLAG_SPRODUCER
	SemMProducer SemFlags = C.COURIER_SEM_FLAG_MPRODUCER
	SemSConsumer SemFlags = C.COURIER_SEM_FLAG_SCONSUMER
	SemMConsumer SemFlags = C.COURIER_SEM_FLAG_MCONSUMER
)

// Semaphore lives in this process's memory; peers post to it with Endpoint.Atomic
// (AtomicAdd) or PutSignal (SignalAdd) at the address Remote gives.
type Semaphore struct {
	ptr    *C.courier_sem_t
	closed atomic.Bool
}

// NewSemaphore creates a semaphore at 0.
func (c *Context) NewSemaphore(flags SemFlags) (*Semaphore, error) {
	if c.closed.Load() {
		return nil, errClosed("context")
	}
	s := &Semaphore{}
	_, err := call(func() C.courier_status_t { return C.courier_sem_create(c.ptr, C.uint32_t(flags), &s.ptr) })
	runtime.KeepAlive(c)
	if err != nil {
		return nil, err
	}
	runtime.SetFinalizer(s, (*Semaphore).Close)
	return s, nil
}

// Post adds n (an error if that passes the maximum).
func (s *Semaphore) Post(n uint64) error {
	if s.closed.Load() {
		return errClosed("semaphore")
	}
	_, err := call(func() C.courier_status_t { return C.courier_sem_post(s.ptr, C.uint64_t(n)) })
	runtime.KeepAlive(s)
	return err
}

// TryWait takes n if it is there now.
func (s *Semaphore) TryWait(n uint64) bool {
	if s.closed.Load() {
		return false
	}
	ok := C.courier_sem_try(s.ptr, C.uint64_t(n)) == C.COURIER_OK
	runtime.KeepAlive(s)
	return ok
}

// Wait takes n once it is there, progressing w meanwhile (nil: another goroutine
// progresses it), until ctx ends. It spins unless WaitSleep is given (see there); a wait
// for more than a boolean semaphore holds is refused.
func (s *Semaphore) Wait(ctx context.Context, w *Worker, n uint64, opts ...WaitOption) error {
	check := func() (uint64, bool, error) {
		if s.closed.Load() {
			return 0, false, errClosed("semaphore")
		}
		return 0, s.TryWait(n), nil
	}
	if !sleeps(opts) {
		_, err := pollUntil(ctx, w, check)
		return err
	}
	if w == nil || !w.canSleep() {
		_, err := napUntil(ctx, w, check)
		return err
	}
	_, err := sleepUntil(ctx, func(ms int64) (uint64, error) {
		if s.closed.Load() {
			return 0, errClosed("semaphore")
		}
		if !w.enter() {
			return 0, errClosed("worker")
		}
		defer w.leave()
		_, err := call(func() C.courier_status_t {
			return C.courier_sem_wait_timeout(s.ptr, w.ptr, C.uint64_t(n), C.COURIER_SIGNAL_WAIT_FLAG_SLEEP, C.int64_t(ms))
		})
		runtime.KeepAlive(s)
		runtime.KeepAlive(w)
		return 0, err
	})
	return err
}

// Value is the current value.
func (s *Semaphore) Value() uint64 {
	if s.closed.Load() {
		return 0
	}
	var v C.uint64_t
	C.courier_sem_value(s.ptr, &v)
	runtime.KeepAlive(s)
	return uint64(v)
}

// Remote is what peers need to post: the packed key and the address of the word that
// counts posts. A peer posts n with an atomic add of n or a put-with-signal with
// SignalAdd; the word only rises (the owner counts its takes apart), so any other
// operation on it breaks the count.
func (s *Semaphore) Remote() (key []byte, addr uint64, err error) {
	if s.closed.Load() {
		return nil, 0, errClosed("semaphore")
	}
	var p unsafe.Pointer
	var n C.size_t
	var a C.uint64_t
	_, err = call(func() C.courier_status_t { return C.courier_sem_remote(s.ptr, &p, &n, &a) })
	runtime.KeepAlive(s)
	if err != nil {
		return nil, 0, err
	}
	defer C.courier_buffer_free(p)
	return C.GoBytes(p, C.int(n)), uint64(a), nil
}

// Close destroys the semaphore. Safe to call twice.
func (s *Semaphore) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	runtime.SetFinalizer(s, nil)
	C.courier_sem_destroy(s.ptr)
	return nil
}
