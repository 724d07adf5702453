//! What every export shares: the panic boundary and the last error's sentence, argument
//! checks (pointers, strings, byte buffers, field masks and flags), buffers as the library
//! takes them (one segment, an iov), and results handed back (a C string into the caller's
//! buffer, a malloc'd copy). Every object module uses this one; it uses none of them.

use std::cell::{Cell, RefCell};
use std::ffi::{CStr, CString, c_char, c_void};
use std::net::{SocketAddr, ToSocketAddrs};
use std::panic::{AssertUnwindSafe, catch_unwind};

use courier_core::{Buf, Error, Status};

use crate::status::{COURIER_ERR_PANIC, courier_status_t};

thread_local! {
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
    static CALLBACK_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// The last failure's sentence on this thread, as a C string ("" if none).
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|e| match &*e.borrow() {
        Some(s) => s.as_ptr(),
        None => c"".as_ptr(),
    })
}

pub(crate) fn set_last_error(text: &str) {
    let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = Some(c));
}

/// Keep `err`'s sentence for `courier_last_error_detail`: the detail alone, since the status
/// is the call's result and `courier_status_string` names it (the status's name when there
/// is no sentence).
pub(crate) fn record(err: &Error) -> courier_status_t {
    let detail = err.detail();
    set_last_error(if detail.is_empty() {
        err.status().as_str()
    } else {
        detail
    });
    err.status().code()
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_string()
    }
}

/// Run an export's body behind the panic boundary.
pub(crate) fn boundary(f: impl FnOnce() -> Result<courier_status_t, Error>) -> courier_status_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => record(&e),
        Err(p) => {
            set_last_error(&format!(
                "panic caught at the C boundary: {}",
                panic_text(&*p)
            ));
            COURIER_ERR_PANIC
        }
    }
}

/// Like `boundary` for exports that return a value instead of a status.
pub(crate) fn boundary_or<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            set_last_error(&format!(
                "panic caught at the C boundary: {}",
                panic_text(&*p)
            ));
            fallback
        }
    }
}

/// Call into user code (a C callback) from inside the library. A panic or foreign unwind
/// out of the callback stops here, so the library's own state is never unwound through.
pub(crate) fn call_user<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    CALLBACK_DEPTH.with(|d| d.set(d.get() + 1));
    let r = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            set_last_error(&format!(
                "a callback panicked; the panic was stopped at the C boundary: {}",
                panic_text(&*p)
            ));
            fallback
        }
    };
    CALLBACK_DEPTH.with(|d| d.set(d.get() - 1));
    r
}

/// Whether this thread is inside a user callback (where waiting cannot progress).
pub(crate) fn in_callback() -> bool {
    CALLBACK_DEPTH.with(|d| d.get() > 0)
}

pub(crate) fn invalid(what: &str) -> Error {
    Error::msg(Status::InvalidParam, what.to_string())
}

/// A required pointer argument.
pub(crate) unsafe fn arg<'a, T>(p: *const T, name: &str) -> Result<&'a T, Error> {
    // SAFETY: non-NULL pointers are the caller's promise of a valid object.
    unsafe { p.as_ref() }.ok_or_else(|| invalid(&format!("argument `{name}` is NULL")))
}

/// A required output pointer, checked before any work is done.
pub(crate) fn out_arg<T>(p: *mut T, name: &str) -> Result<*mut T, Error> {
    if p.is_null() {
        Err(invalid(&format!("output argument `{name}` is NULL")))
    } else {
        Ok(p)
    }
}

/// A required NUL-terminated UTF-8 string.
pub(crate) unsafe fn str_arg<'a>(p: *const c_char, name: &str) -> Result<&'a str, Error> {
    if p.is_null() {
        return Err(invalid(&format!("string `{name}` is NULL")));
    }
    // SAFETY: the caller promises a NUL-terminated string.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| invalid(&format!("string `{name}` is not UTF-8")))
}

/// A byte buffer argument: NULL is accepted only with length 0.
pub(crate) unsafe fn bytes_arg<'a>(
    p: *const std::ffi::c_void,
    len: usize,
    name: &str,
) -> Result<&'a [u8], Error> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(invalid(&format!(
            "buffer `{name}` is NULL with length {len}"
        )));
    }
    // SAFETY: the caller promises `len` readable bytes at `p`.
    Ok(unsafe { std::slice::from_raw_parts(p as *const u8, len) })
}

/// Whether `bit` is set in a params struct's mask.
#[inline]
pub(crate) fn has(mask: u64, bit: u64) -> bool {
    mask & bit != 0
}

/// Refuse bits of a flags word or field mask that are not in `known`: a caller built
/// against a newer header (or passing garbage) learns at once that this library ignores
/// them, instead of getting behaviour it did not ask for. One AND and a branch; the error
/// is built out of line.
#[inline]
pub(crate) fn known_bits(what: &str, value: u64, known: u64) -> Result<(), Error> {
    if value & !known != 0 {
        return Err(unknown_bits(what, value, known));
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn unknown_bits(what: &str, value: u64, known: u64) -> Error {
    invalid(&format!(
        "unknown {what} bits {:#x} (known: {known:#x})",
        value & !known
    ))
}

// ----- buffers the library takes --------------------------------------------------------

/// One segment of a gathered send or a scattered receive.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct courier_iov_t {
    /// Start of the segment.
    pub buffer: *mut c_void,
    /// Its length in bytes.
    pub length: usize,
}

/// One segment: NULL only with length 0.
pub(crate) fn one(p: *const c_void, len: usize, name: &str) -> Result<Buf, Error> {
    if p.is_null() && len != 0 {
        return Err(invalid(&format!(
            "buffer `{name}` is NULL with length {len}"
        )));
    }
    Ok(Buf::One((p as usize, len)))
}

/// The segments of an iov (`count` entries; NULL only with count 0).
pub(crate) unsafe fn iov_buf(iov: *const courier_iov_t, count: usize) -> Result<Buf, Error> {
    if count == 0 {
        return Ok(Buf::Many(Vec::new()));
    }
    if iov.is_null() {
        return Err(invalid("argument `iov` is NULL"));
    }
    // SAFETY: the caller promises `count` entries.
    let v = unsafe { std::slice::from_raw_parts(iov, count) };
    let mut segs = Vec::with_capacity(count);
    for (i, s) in v.iter().enumerate() {
        if s.buffer.is_null() && s.length != 0 {
            return Err(invalid(&format!(
                "iov[{i}].buffer is NULL with length {}",
                s.length
            )));
        }
        segs.push((s.buffer as usize, s.length));
    }
    Ok(Buf::Many(segs))
}

// ----- results handed back --------------------------------------------------------------

/// Write `s` and a NUL into the caller's `cap` bytes at `out` (refused when it does not
/// fit).
pub(crate) unsafe fn write_cstr(
    s: &str,
    out: *mut c_char,
    cap: usize,
) -> Result<(), courier_core::Error> {
    if s.len() + 1 > cap {
        return Err(invalid(&format!(
            "buffer of {cap} bytes is too small for {:?}",
            s
        )));
    }
    // SAFETY: `cap` writable bytes at `out`, checked above.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr() as *const c_char, out, s.len());
        *out.add(s.len()) = 0;
    }
    Ok(())
}

/// A copy of `bytes` in memory from `malloc`, for the caller to release with
/// `courier_buffer_free`.
pub(crate) fn malloc_copy(bytes: &[u8]) -> Result<*mut c_void, Error> {
    // SAFETY: plain allocation; released by courier_buffer_free (free).
    let p = unsafe { libc::malloc(bytes.len().max(1)) } as *mut u8;
    if p.is_null() {
        return Err(Error::new(Status::NoMemory, "malloc failed"));
    }
    // SAFETY: `p` is a fresh allocation of at least `bytes.len()` bytes (checked non-NULL).
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
    Ok(p as *mut c_void)
}

/// A socket address: `ip:port`, or a name that resolves to one.
pub(crate) fn parse_sockaddr(s: &str) -> Result<SocketAddr, Error> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    s.to_socket_addrs()
        .ok()
        .and_then(|mut it| it.next())
        .ok_or_else(|| {
            Error::msg(
                Status::InvalidAddress,
                format!("cannot resolve socket address {s:?} (expected \"ip:port\")"),
            )
        })
}
