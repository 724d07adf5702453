//! The typed C entry points (`shmem_int_put`, `shmem_ctx_long_atomic_fetch_add`, ...):
//! thin functions that run the generic code behind `guard`, generated into the files
//! beside this one by `gen/generate.py`, which writes `include/shmem.h` from the same
//! tables. Do not edit those files: edit the generator and run it.
#![allow(clippy::missing_safety_doc)]

use std::ffi::c_int;

use crate::error::fatal;

mod amo;
mod coll;
mod reduce;
mod rma;
mod signal;
mod wait;

/// `n` elements of `size` bytes, in bytes (a fatal error of `call` if that overflows).
#[inline(always)]
pub(crate) fn bytes(call: &'static str, n: usize, size: usize) -> usize {
    n.checked_mul(size).unwrap_or_else(|| {
        fatal(
            call,
            format_args!("nelems={n}: {n} elements of {size} bytes overflow"),
        )
    })
}

/// A C `int` count (the deprecated `_to_all` forms), checked.
#[inline(always)]
pub(crate) fn count(call: &'static str, n: c_int) -> usize {
    if n < 0 {
        fatal(call, format_args!("nreduce={n}: negative"))
    }
    n as usize
}
