//! Status codes, the per-thread error sentence, and the panic boundary every export uses.

use std::ffi::{CString, c_char};
use std::sync::OnceLock;

use courier_core::Status;

/// A status code: `COURIER_OK` (0), `COURIER_INPROGRESS` (1), or a negative error. The
/// numbers are those of `courier::Status` and never change meaning.
pub type courier_status_t = i32;

/// Success.
pub const COURIER_OK: courier_status_t = 0;
/// The operation started and completes later (a request was returned).
pub const COURIER_INPROGRESS: courier_status_t = 1;
/// A probe or poll found nothing.
pub const COURIER_ERR_NO_MESSAGE: courier_status_t = -1;
/// No resource right now: try again after progress.
pub const COURIER_ERR_NO_RESOURCE: courier_status_t = -2;
/// A system call failed.
pub const COURIER_ERR_IO_ERROR: courier_status_t = -3;
/// Out of memory.
pub const COURIER_ERR_NO_MEMORY: courier_status_t = -4;
/// An argument is not acceptable (a NULL pointer, a field out of range).
pub const COURIER_ERR_INVALID_PARAM: courier_status_t = -5;
/// No transport can reach that peer.
pub const COURIER_ERR_UNREACHABLE: courier_status_t = -6;
/// A worker or socket address could not be parsed or used.
pub const COURIER_ERR_INVALID_ADDRESS: courier_status_t = -7;
/// Not supported here.
pub const COURIER_ERR_UNSUPPORTED: courier_status_t = -8;
/// A handle that is NULL, of another kind, already destroyed (destroy-twice,
/// use-after-destroy), or a request already released: refused, never undefined behaviour.
pub const COURIER_ERR_INVALID_HANDLE: courier_status_t = -9;
/// The message was longer than the receive buffer.
pub const COURIER_ERR_MESSAGE_TRUNCATED: courier_status_t = -10;
/// The request was canceled.
pub const COURIER_ERR_CANCELED: courier_status_t = -16;
/// The peer's connection handler rejected the connection.
pub const COURIER_ERR_REJECTED: courier_status_t = -17;
/// Timed out.
pub const COURIER_ERR_TIMEOUT: courier_status_t = -20;
/// The peer failed: died, closed its side, or stopped answering keepalives.
pub const COURIER_ERR_PEER_FAILURE: courier_status_t = -25;
/// The endpoint was closed locally.
pub const COURIER_ERR_ENDPOINT_CLOSED: courier_status_t = -26;
/// A remote access without the right permission.
pub const COURIER_ERR_ACCESS_DENIED: courier_status_t = -30;
/// A remote access outside the region a key covers.
pub const COURIER_ERR_OUT_OF_RANGE: courier_status_t = -31;
/// A forged, malformed or stale remote key.
pub const COURIER_ERR_INVALID_KEY: courier_status_t = -32;
/// Bytes from a peer that are not Courier's protocol.
pub const COURIER_ERR_PROTOCOL_ERROR: courier_status_t = -40;
/// A `COURIER_*` configuration value is not acceptable.
pub const COURIER_ERR_BAD_CONFIG: courier_status_t = -50;
/// A memory type whose driver or device is not present.
pub const COURIER_ERR_NO_DEVICE: courier_status_t = -51;
/// C ABI only: a Rust panic was caught at the boundary (a bug in Courier or a callback).
pub const COURIER_ERR_PANIC: courier_status_t = -100;

// The C numbers are the library's numbers; a mismatch fails the build.
const _: () = {
    assert!(COURIER_OK == Status::Ok as i32);
    assert!(COURIER_INPROGRESS == Status::InProgress as i32);
    assert!(COURIER_ERR_NO_MESSAGE == Status::NoMessage as i32);
    assert!(COURIER_ERR_NO_RESOURCE == Status::NoResource as i32);
    assert!(COURIER_ERR_IO_ERROR == Status::IoError as i32);
    assert!(COURIER_ERR_NO_MEMORY == Status::NoMemory as i32);
    assert!(COURIER_ERR_INVALID_PARAM == Status::InvalidParam as i32);
    assert!(COURIER_ERR_UNREACHABLE == Status::Unreachable as i32);
    assert!(COURIER_ERR_INVALID_ADDRESS == Status::InvalidAddress as i32);
    assert!(COURIER_ERR_UNSUPPORTED == Status::Unsupported as i32);
    assert!(COURIER_ERR_INVALID_HANDLE == Status::InvalidHandle as i32);
    assert!(COURIER_ERR_MESSAGE_TRUNCATED == Status::MessageTruncated as i32);
    assert!(COURIER_ERR_CANCELED == Status::Canceled as i32);
    assert!(COURIER_ERR_REJECTED == Status::Rejected as i32);
    assert!(COURIER_ERR_TIMEOUT == Status::Timeout as i32);
    assert!(COURIER_ERR_PEER_FAILURE == Status::PeerFailure as i32);
    assert!(COURIER_ERR_ENDPOINT_CLOSED == Status::EndpointClosed as i32);
    assert!(COURIER_ERR_ACCESS_DENIED == Status::AccessDenied as i32);
    assert!(COURIER_ERR_OUT_OF_RANGE == Status::OutOfRange as i32);
    assert!(COURIER_ERR_INVALID_KEY == Status::InvalidKey as i32);
    assert!(COURIER_ERR_PROTOCOL_ERROR == Status::ProtocolError as i32);
    assert!(COURIER_ERR_BAD_CONFIG == Status::BadConfig as i32);
    assert!(COURIER_ERR_NO_DEVICE == Status::NoDevice as i32);
};

static STRINGS: OnceLock<Vec<(i32, CString)>> = OnceLock::new();

/// A short fixed description of `status` (never NULL, static storage).
#[unsafe(no_mangle)]
pub extern "C" fn courier_status_string(status: courier_status_t) -> *const c_char {
    let table = STRINGS.get_or_init(|| {
        let mut v: Vec<(i32, CString)> = Status::ALL
            .iter()
            .map(|s| (s.code(), CString::new(s.as_str()).unwrap_or_default()))
            .collect();
        v.push((
            COURIER_ERR_PANIC,
            c"internal error (panic caught at the C boundary)".into(),
        ));
        v
    });
    match table.iter().find(|(c, _)| *c == status) {
        Some((_, s)) => s.as_ptr(),
        None => c"unknown status".as_ptr(),
    }
}

/// The sentence of the last failure reported on this thread ("" if none). It stays valid
/// until the next failing call on this thread; successful calls leave it alone.
#[unsafe(no_mangle)]
pub extern "C" fn courier_last_error_detail() -> *const c_char {
    crate::ffi::last_error_ptr()
}
