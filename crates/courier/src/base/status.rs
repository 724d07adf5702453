//! Status codes and the error type.
//!
//! `Status` is the small `Copy` value used on hot paths and across the C ABI: its numbers
//! are stable and never reused. `Error` is a status plus a sentence that says what went
//! wrong and why; it is built only on failure paths, so its allocation never touches the
//! fast path.

use std::borrow::Cow;
use std::fmt;

/// Stable status codes. Non-negative values are not failures.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// The operation was started and completes later.
    InProgress = 1,
    /// A probe or poll found nothing.
    NoMessage = -1,
    /// No resource right now (a full queue): try again after progress.
    NoResource = -2,
    /// A system call failed.
    IoError = -3,
    /// Out of memory.
    NoMemory = -4,
    /// An argument is not acceptable.
    InvalidParam = -5,
    /// No transport can reach that peer.
    Unreachable = -6,
    /// A worker or socket address could not be parsed or used.
    InvalidAddress = -7,
    /// The operation is not supported here.
    Unsupported = -8,
    /// C ABI: a handle that is NULL, of another kind, already destroyed, or a request
    /// already released (never a use of freed memory).
    InvalidHandle = -9,
    /// The message was longer than the receive buffer; the real length is reported.
    MessageTruncated = -10,
    /// The request was canceled.
    Canceled = -16,
    /// The peer's connection handler rejected the connection.
    Rejected = -17,
    /// The operation timed out.
    Timeout = -20,
    /// The peer failed: it died, closed its side, or stopped answering keepalives.
    PeerFailure = -25,
    /// The endpoint was closed locally.
    EndpointClosed = -26,
    /// A remote access without the right permission.
    AccessDenied = -30,
    /// A remote access outside the region a key covers.
    OutOfRange = -31,
    /// A remote key that is forged, malformed, or stale (its region was unmapped).
    InvalidKey = -32,
    /// Bytes from a peer that are not Courier's protocol.
    ProtocolError = -40,
    /// A `COURIER_*` configuration value is not acceptable.
    BadConfig = -50,
    /// A memory type whose driver or device is not present.
    NoDevice = -51,
}

impl Status {
    /// All codes, for tables and round-trip tests.
    pub const ALL: [Status; 23] = [
        Status::Ok,
        Status::InProgress,
        Status::NoMessage,
        Status::NoResource,
        Status::IoError,
        Status::NoMemory,
        Status::InvalidParam,
        Status::Unreachable,
        Status::InvalidAddress,
        Status::Unsupported,
        Status::InvalidHandle,
        Status::MessageTruncated,
        Status::Canceled,
        Status::Rejected,
        Status::Timeout,
        Status::PeerFailure,
        Status::EndpointClosed,
        Status::AccessDenied,
        Status::OutOfRange,
        Status::InvalidKey,
        Status::ProtocolError,
        Status::BadConfig,
        Status::NoDevice,
    ];

    /// The stable number.
    pub fn code(self) -> i32 {
        self as i32
    }

    /// The status for a stable number, if it is one.
    pub fn from_code(code: i32) -> Option<Status> {
        Status::ALL.iter().copied().find(|s| s.code() == code)
    }

    /// A short, fixed description.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "success",
            Status::InProgress => "operation in progress",
            Status::NoMessage => "no message",
            Status::NoResource => "no resource now, try again",
            Status::IoError => "input/output error",
            Status::NoMemory => "out of memory",
            Status::InvalidParam => "invalid parameter",
            Status::Unreachable => "destination unreachable",
            Status::InvalidAddress => "invalid address",
            Status::Unsupported => "operation not supported",
            Status::InvalidHandle => "invalid handle",
            Status::MessageTruncated => "message truncated",
            Status::Canceled => "request canceled",
            Status::Rejected => "connection rejected by peer",
            Status::Timeout => "timed out",
            Status::PeerFailure => "peer failure",
            Status::EndpointClosed => "endpoint closed",
            Status::AccessDenied => "remote access denied",
            Status::OutOfRange => "remote access out of range",
            Status::InvalidKey => "invalid remote key",
            Status::ProtocolError => "protocol error",
            Status::BadConfig => "bad configuration value",
            Status::NoDevice => "no such device",
        }
    }

    /// Whether this status is a failure.
    pub fn is_err(self) -> bool {
        (self as i32) < 0
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failure: a status and a sentence that says what and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    status: Status,
    detail: Cow<'static, str>,
}

impl Error {
    /// An error with a fixed sentence.
    pub const fn new(status: Status, detail: &'static str) -> Error {
        Error {
            status,
            detail: Cow::Borrowed(detail),
        }
    }

    /// An error with a formatted sentence.
    pub fn msg(status: Status, detail: impl Into<String>) -> Error {
        Error {
            status,
            detail: Cow::Owned(detail.into()),
        }
    }

    /// An error from a system call, naming what was being done.
    pub fn io(what: &str, err: impl fmt::Display) -> Error {
        Error::msg(Status::IoError, format!("{what}: {err}"))
    }

    /// The status code.
    pub fn status(&self) -> Status {
        self.status
    }

    /// The sentence.
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.detail.is_empty() {
            write!(f, "{}", self.status)
        } else {
            write!(f, "{}: {}", self.status, self.detail)
        }
    }
}

impl std::error::Error for Error {}

impl From<Status> for Error {
    fn from(status: Status) -> Error {
        Error {
            status,
            detail: Cow::Borrowed(""),
        }
    }
}

impl From<rustix::io::Errno> for Error {
    fn from(e: rustix::io::Errno) -> Error {
        Error::msg(Status::IoError, e.to_string())
    }
}

/// Result with Courier's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for s in Status::ALL {
            assert!(seen.insert(s.code()), "duplicate code {}", s.code());
            assert_eq!(Status::from_code(s.code()), Some(s));
            assert!(!s.as_str().is_empty());
        }
        assert_eq!(Status::from_code(12345), None);
        assert!(Status::PeerFailure.is_err());
        assert!(!Status::InProgress.is_err());
    }

    #[test]
    fn display_names_status_and_detail() {
        let e = Error::msg(
            Status::OutOfRange,
            "offset 4096 + 8 beyond region of 4096 bytes",
        );
        assert_eq!(
            e.to_string(),
            "remote access out of range: offset 4096 + 8 beyond region of 4096 bytes"
        );
        assert_eq!(
            Error::from(Status::Canceled).to_string(),
            "request canceled"
        );
    }
}
