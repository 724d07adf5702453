// Package courier is the Go binding of Courier, over its C ABI (libcourier.a).
//
// The flow is the one UCX's Go binding made familiar: a Context (features, configuration),
// Workers (progress engines with an address), Listeners and Endpoints, and non-blocking
// operations (tag-matched messages, active messages, streams, one-sided put/get/atomics) that
// return a *Request; Listen and Dial give net.Listener and net.Conn over streams.
//
// Nothing moves unless a worker progresses: call Worker.Progress in a loop (a goroutine
// per worker is the usual shape), or Request.Wait, which progresses while it waits.
// Callbacks (completion callbacks, active-message handlers, connection and error handlers)
// run inside Progress, on the goroutine that called it.
//
// Thread modes: a ThreadModeSingle worker may be used only from the OS thread that created
// it (create and use it from a goroutine that called runtime.LockOSThread); a
// ThreadModeMulti worker may be used from any goroutine.
//
// Buffers handed to a non-blocking operation are pinned (runtime.Pinner) until the
// operation completes and must not be modified (sends) or read (receives) before then;
// sends of at most 256 bytes are copied at once instead. A send that completed at once
// returns a nil *Request, which every Request method treats as completed.
package courier

// Where the library comes from: link_repo.go (the default: this checkout's
// target/release/libcourier.a, built by `make capi`) or link_system.go (-tags
// courier_system: the installed library, through `pkg-config courier`).

/*
#include <stdlib.h>
#include <courier.h>

#include "shim.h"

// The sends never call back into Go (the library runs callbacks only inside progress).
#cgo nocallback cg_am_send
#cgo nocallback cg_tag_send
#cgo nocallback cg_stream_send
#cgo nocallback cg_am_recv_data
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// LibBuild is set at link time (-ldflags=-X=courier.dev/courier.LibBuild=...) to a digest
// of target/release/libcourier.a by the repository's scripts. Go's build cache does not
// look at that file, so a program or test built after the Rust library changed would
// otherwise be relinked from the cache with the old one; a new digest makes it relink.
var LibBuild string

// lastError builds the Go error for a failed call; it must run on the OS thread that made
// the call (the detail is per thread), which callers ensure with runtime.LockOSThread.
func lastError(s C.courier_status_t) error {
	if s >= 0 {
		return nil
	}
	return &Error{Status: Status(s), Detail: C.GoString(C.courier_last_error_detail())}
}

// call runs one C call and turns its status into an error with the thread's detail.
func call(f func() C.courier_status_t) (C.courier_status_t, error) {
	runtime.LockOSThread()
	s := f()
	err := lastError(s)
	runtime.UnlockOSThread()
	return s, err
}

// uptr is a C object's address as an integer, for the shim calls that take uintptr_t
// (see shim.h).
func uptr(p unsafe.Pointer) C.uintptr_t { return C.uintptr_t(uintptr(p)) }

// bytePtr is the address of b's first byte, or nil for an empty slice.
func bytePtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

// cbool is b as a C int.
func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}
