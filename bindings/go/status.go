package courier

/*
#include "shim.h"
*/
import "C"

import "fmt"

// Status is one of Courier's stable status codes. Failure statuses are errors and are the
// sentinels to compare with errors.Is (errors.Is(err, courier.ErrRejected)).
type Status int32

// Status codes, the same numbers as the C ABI and the Rust library.
const (
	StatusOK          Status = C.COURIER_OK
	StatusInProgress  Status = C.COURIER_INPROGRESS
	ErrNoMessage      Status = C.COURIER_ERR_NO_MESSAGE
	ErrNoResource     Status = C.COURIER_ERR_NO_RESOURCE
	ErrIO             Status = C.COURIER_ERR_IO_ERROR
	ErrNoMemory       Status = C.COURIER_ERR_NO_MEMORY
	ErrInvalidParam   Status = C.COURIER_ERR_INVALID_PARAM
	ErrUnreachable    Status = C.COURIER_ERR_UNREACHABLE
	ErrInvalidAddress Status = C.COURIER_ERR_INVALID_ADDRESS
	ErrUnsupported    Status = C.COURIER_ERR_UNSUPPORTED
	ErrInvalidHandle  Status = C.COURIER_ERR_INVALID_HANDLE
	ErrTruncated      Status = C.COURIER_ERR_MESSAGE_TRUNCATED
	ErrCanceled       Status = C.COURIER_ERR_CANCELED
	ErrRejected       Status = C.COURIER_ERR_REJECTED
	ErrTimeout        Status = C.COURIER_ERR_TIMEOUT
	ErrPeerFailure    Status = C.COURIER_ERR_PEER_FAILURE
	ErrEndpointClosed Status = C.COURIER_ERR_ENDPOINT_CLOSED
	ErrAccessDenied   Status = C.COURIER_ERR_ACCESS_DENIED
	ErrOutOfRange     Status = C.COURIER_ERR_OUT_OF_RANGE
	ErrInvalidKey     Status = C.COURIER_ERR_INVALID_KEY
	ErrProtocol       Status = C.COURIER_ERR_PROTOCOL_ERROR
	ErrBadConfig      Status = C.COURIER_ERR_BAD_CONFIG
	ErrNoDevice       Status = C.COURIER_ERR_NO_DEVICE
	ErrPanic          Status = C.COURIER_ERR_PANIC
)

// Error implements error with the library's fixed description of the status.
func (s Status) Error() string {
	return C.GoString(C.courier_status_string(C.courier_status_t(s)))
}

// String is the same as Error.
func (s Status) String() string { return s.Error() }

// Error is a failure: a status and the library's sentence about what went wrong.
type Error struct {
	Status Status
	Detail string
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return "courier: " + e.Status.Error()
	}
	return fmt.Sprintf("courier: %s: %s", e.Status.Error(), e.Detail)
}

// Unwrap makes errors.Is(err, courier.ErrX) work.
func (e *Error) Unwrap() error { return e.Status }

// errClosed is returned by methods of an object after Close.
func errClosed(what string) error {
	return &Error{Status: ErrInvalidParam, Detail: what + " is closed"}
}
