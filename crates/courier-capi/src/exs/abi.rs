//! The C types and constants of `include/exs.h` (written by hand; these must agree, and
//! the layout asserts below and in the C tests check that they do).

use std::ffi::{c_int, c_void};

/// `exs_init`'s version.
pub const EXS_VERSION: c_int = 1;

/// An event queue (`exs_qcreate`).
pub type exs_qhandle_t = c_int;
/// No queue / `exs_qcreate` failed.
pub const EXS_QHANDLE_INVALID: exs_qhandle_t = -1;
/// A memory registration (`exs_mregister`).
pub type exs_mhandle_t = u64;
/// No registration / `exs_mregister` failed.
pub const EXS_MHANDLE_INVALID: exs_mhandle_t = 0;
/// The caller's word, returned in the operation's event.
pub type exs_ahandle_t = *mut c_void;

/// Event types.
pub const EXS_EVT_CONNECT: c_int = 1;
pub const EXS_EVT_ACCEPT: c_int = 2;
pub const EXS_EVT_SEND: c_int = 3;
pub const EXS_EVT_RECV: c_int = 4;
pub const EXS_EVT_SENDMSG: c_int = 5;
pub const EXS_EVT_RECVMSG: c_int = 6;
pub const EXS_EVT_SHUTDOWN: c_int = 7;
pub const EXS_EVT_CLOSE: c_int = 8;

/// `exs_evt_flags` of a RECV/RECVMSG completed by the end of the stream (the peer shut
/// its writing side down or closed, or we shut our reading side down): the result (0, or
/// what a `MSG_WAITALL` STREAM receive got before it) is final. Not a kernel `MSG_*` bit.
pub const EXS_MSG_EOF: c_int = 0x1000_0000;

/// Most iovecs in one `msghdr` of `exs_sendmsg`/`exs_recvmsg` (Linux's `IOV_MAX`).
pub const EXS_IOV_MAX: usize = 1024;

/// One completed operation.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct exs_event_t {
    /// `EXS_EVT_*`.
    pub exs_evt_type: c_int,
    /// The descriptor the operation was started on.
    pub exs_evt_fd: c_int,
    /// The caller's word.
    pub exs_evt_ahandle: exs_ahandle_t,
    /// Bytes moved (SEND, RECV; 0 for RECV at end of stream), the new descriptor (ACCEPT),
    /// 0 (CONNECT, CLOSE), or `-errno` on failure.
    pub exs_evt_result: isize,
    /// 0, or the errno of a failure.
    pub exs_evt_errno: c_int,
    /// `MSG_TRUNC` (a SEQPACKET message longer than the buffer), `MSG_EOR`.
    pub exs_evt_flags: c_int,
    /// The operation's buffer (SEND, RECV), else NULL.
    pub exs_evt_buf: *mut c_void,
    /// The length asked for (SEND, RECV), else 0.
    pub exs_evt_len: usize,
}

// SAFETY: the pointers are the caller's words, only carried back to it.
unsafe impl Send for exs_event_t {}

const _: () = {
    assert!(std::mem::size_of::<exs_event_t>() == 48);
    assert!(std::mem::offset_of!(exs_event_t, exs_evt_ahandle) == 8);
    assert!(std::mem::offset_of!(exs_event_t, exs_evt_result) == 16);
    assert!(std::mem::offset_of!(exs_event_t, exs_evt_errno) == 24);
    assert!(std::mem::offset_of!(exs_event_t, exs_evt_flags) == 28);
    assert!(std::mem::offset_of!(exs_event_t, exs_evt_buf) == 32);
    assert!(std::mem::offset_of!(exs_event_t, exs_evt_len) == 40);
};

/// Queue attributes (`exs_qmodify`, `exs_qstatus`).
pub const EXS_QATTR_DEPTH: c_int = 1;
pub const EXS_QATTR_SIGNAL: c_int = 2;
pub const EXS_QATTR_EVENTS: c_int = 3;
pub const EXS_QATTR_WAIT: c_int = 4;
pub const EXS_QATTR_FD: c_int = 5;
pub const EXS_QATTR_RESERVED: c_int = 6;

/// Wait modes of `exs_qdequeue` (`EXS_QATTR_WAIT`).
pub const EXS_WAIT_DEFAULT: i64 = 0;
pub const EXS_WAIT_NOTIFY: i64 = 1;
pub const EXS_WAIT_BUSY_POLL: i64 = 2;
pub const EXS_WAIT_ADAPTIVE: i64 = 3;

/// `exs_fcntl` commands.
pub const EXS_F_SMALL_MAX: c_int = 1;
pub const EXS_F_INLINE_MAX: c_int = 2;
pub const EXS_F_CPU: c_int = 3;
pub const EXS_F_BUSY_POLL: c_int = 4;
pub const EXS_F_RCVBUF: c_int = 5;
pub const EXS_F_NO_RCVBUF: c_int = 6;
pub const EXS_F_ADV_CREDITS: c_int = 7;
pub const EXS_F_SMALL_SLOTS: c_int = 8;
pub const EXS_F_SPLIT_MIN: c_int = 9;
/// OR'ed into a command: read the value instead of setting it.
pub const EXS_F_GET: c_int = 0x100;

/// `exs_mregister` flags.
pub const EXS_MREG_READ: c_int = 1;
pub const EXS_MREG_WRITE: c_int = 2;

/// `exs_getsockopt` level for EXS's own options.
pub const SOL_EXS: c_int = 0x4558;
/// The transport carrying a connection: a string, "shm", "tcp", "self" or "kernel".
pub const EXS_SO_TRANSPORT: c_int = 1;
