//! The CUDA driver, loaded at run time (never linked): `libcuda.so.1`.
//!
//! Courier has no build-time CUDA dependency. Asking for CUDA memory where the driver or a
//! device is missing gives a clear error naming what is missing.

use std::ffi::CStr;

use super::{Error, Status};

type CuInit = unsafe extern "C" fn(u32) -> i32;
type CuDeviceGetCount = unsafe extern "C" fn(*mut i32) -> i32;

/// How many CUDA devices the driver sees, or why none can be used.
pub fn device_count() -> Result<i32, Error> {
    let name = c"libcuda.so.1";
    // SAFETY: dlopen with a valid C string; the handle is kept for the process's life.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a valid C string or null.
        let why = unsafe { libc::dlerror() };
        let why = if why.is_null() {
            "not found".to_string()
        } else {
            unsafe { CStr::from_ptr(why) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(Error::msg(
            Status::NoDevice,
            format!(
                "memory type cuda needs the CUDA driver, and libcuda.so.1 could not be loaded: {why}"
            ),
        ));
    }
    // SAFETY: symbol lookups in a loaded library; types match the driver API.
    let (init, count) = unsafe {
        (
            libc::dlsym(h, c"cuInit".as_ptr()),
            libc::dlsym(h, c"cuDeviceGetCount".as_ptr()),
        )
    };
    if init.is_null() || count.is_null() {
        return Err(Error::new(
            Status::NoDevice,
            "libcuda.so.1 lacks cuInit/cuDeviceGetCount",
        ));
    }
    // SAFETY: the symbols have these signatures in the CUDA driver API.
    let (init, count): (CuInit, CuDeviceGetCount) = unsafe {
        (
            std::mem::transmute::<*mut libc::c_void, CuInit>(init),
            std::mem::transmute::<*mut libc::c_void, CuDeviceGetCount>(count),
        )
    };
    // SAFETY: plain driver calls.
    let rc = unsafe { init(0) };
    if rc != 0 {
        return Err(Error::msg(
            Status::NoDevice,
            format!("cuInit failed with CUDA error {rc} (no usable GPU or driver)"),
        ));
    }
    let mut n = 0;
    // SAFETY: valid out pointer.
    let rc = unsafe { count(&mut n) };
    if rc != 0 || n == 0 {
        return Err(Error::new(
            Status::NoDevice,
            "the CUDA driver sees no device",
        ));
    }
    Ok(n)
}

/// The error for CUDA memory requests on this build.
pub fn unavailable() -> Error {
    match device_count() {
        Err(e) => e,
        Ok(n) => Error::msg(
            Status::Unsupported,
            format!(
                "{n} CUDA device(s) found, but CUDA memory regions are not implemented in this build yet"
            ),
        ),
    }
}
