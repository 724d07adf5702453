package courier

/*
#include "shim.h"
*/
import "C"

import (
	"sync"
	"sync/atomic"
	"unsafe"
)

// slab is a worker's table of operation slots (see shim.h): C memory for what the library
// reads and writes, indexed by small integers, and beside each index the *Request waiting
// on it. Slots come in chunks that never move, so the library may keep a slot's address
// until the operation completes.
//
// An operation takes a slot before its starting call and registers its *Request only if
// the call returned INPROGRESS (a request that completed at once needs none). On a
// ThreadModeMulti worker another thread may deliver the completion first: it then finds
// no request and marks the slot early, and register hands the completion over instead.
type slab struct {
	// hot is one free slot, taken and given back with one atomic each: a slot whose
	// operation is over goes back here when it is empty, so that an operation started after
	// one ended (the common rhythm) takes no lock for its slot.
	hot atomic.Pointer[C.cg_slot_t]

	mu     sync.Mutex
	free   []uint32
	slots  []*C.cg_slot_t
	reqs   []*Request
	early  []bool
	chunks []*C.cg_slot_t // C allocations, freed by close
	worker uintptr        // the worker's cgo.Handle, stored in every slot
}

const slabChunk = 64

// get takes a free slot (growing the slab by a chunk when none is free).
func (s *slab) get() (*C.cg_slot_t, uint32, error) {
	if sl := s.hot.Swap(nil); sl != nil {
		sl.req = nil
		sl.detail = nil
		return sl, uint32(sl.index), nil
	}
	s.mu.Lock()
	if len(s.free) == 0 {
		first := uint32(len(s.slots))
		c := C.cg_slots_new(C.uint32_t(first), slabChunk, C.uintptr_t(s.worker))
		if c == nil {
			s.mu.Unlock()
			return nil, 0, &Error{Status: ErrNoMemory, Detail: "no memory for operation slots"}
		}
		s.chunks = append(s.chunks, c)
		cs := unsafe.Slice(c, slabChunk)
		for i := range cs {
			s.slots = append(s.slots, &cs[i])
			s.reqs = append(s.reqs, nil)
			s.early = append(s.early, false)
		}
		for i := slabChunk - 1; i >= 0; i-- {
			s.free = append(s.free, first+uint32(i))
		}
	}
	i := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	sl := s.slots[i]
	s.mu.Unlock()
	sl.req = nil
	sl.detail = nil
	return sl, i, nil
}

// register makes r the request of slot i; false if the completion came first (then the
// caller completes r itself).
func (s *slab) register(i uint32, r *Request) bool {
	s.mu.Lock()
	if int(i) >= len(s.early) {
		s.mu.Unlock()
		// The worker was closed while the operation started: it never completes (see
		// Worker.Close), and r is kept with the other abandoned requests.
		abandoned.Lock()
		abandoned.reqs = append(abandoned.reqs, r)
		abandoned.Unlock()
		return true
	}
	early := s.early[i]
	if early {
		s.early[i] = false
	} else {
		s.reqs[i] = r
	}
	s.mu.Unlock()
	return !early
}

// completion is the request of slot i, whose completion the library reported, and
// forgets it; nil if it is not registered yet (the slot is marked early).
func (s *slab) completion(i uint32) *Request {
	s.mu.Lock()
	var r *Request
	if int(i) < len(s.reqs) {
		r = s.reqs[i]
		if r == nil {
			s.early[i] = true
		}
		s.reqs[i] = nil
	}
	s.mu.Unlock()
	return r
}

// put returns slot sl, whose operation is over (no request registered on it); the library
// no longer refers to it.
func (s *slab) put(sl *C.cg_slot_t) {
	if s.hot.CompareAndSwap(nil, sl) {
		return
	}
	s.mu.Lock()
	s.free = append(s.free, uint32(sl.index))
	s.mu.Unlock()
}

// close frees the slab's C memory when no operation uses it, and returns the requests
// still in flight otherwise (the library may still write their slots: the memory stays).
func (s *slab) close() []*Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	var live []*Request
	for _, r := range s.reqs {
		if r != nil {
			live = append(live, r)
		}
	}
	free := len(s.free)
	if s.hot.Load() != nil {
		free++
	}
	if free == len(s.slots) {
		for _, c := range s.chunks {
			C.free(unsafe.Pointer(c))
		}
	}
	s.chunks, s.slots, s.reqs, s.early, s.free = nil, nil, nil, nil, nil
	s.hot.Store(nil)
	return live
}

// takeDetail is the failure detail the C side stored in the slot (freed here).
func takeDetail(sl *C.cg_slot_t) string {
	if sl.detail == nil {
		return ""
	}
	d := C.GoString(sl.detail)
	C.free(unsafe.Pointer(sl.detail))
	sl.detail = nil
	return d
}

// Names for the C types that callbacks.go (which may not include shim.h) works with.
type (
	cgBatch = C.cg_batch_t
	cgSlot  = C.cg_slot_t
)
