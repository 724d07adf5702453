//! Errors: a message that names the call, the argument and why, then the failure the
//! specification defines (a NULL for allocations, decided by the caller) or, where it
//! leaves the behaviour undefined, an abort of the whole job with that message.
//!
//! Every C entry point runs its body through [`guard`]: a Rust panic never unwinds into C;
//! it becomes a fatal error of that call.

use std::fmt::Display;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Run an entry point's body; a panic inside it is a fatal error of `call`.
#[inline(always)]
pub fn guard<T>(call: &'static str, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            fatal(call, format_args!("internal error (panic: {what})"))
        }
    }
}

/// Print `call: why` on stderr, prefixed with this PE, and abort the job (exit status 1
/// for every PE). Never returns.
#[cold]
#[inline(never)]
pub fn fatal(call: &str, why: impl Display) -> ! {
    let me = crate::init::my_pe_or_none();
    let who = match me {
        Some(pe) => format!("PE {pe}"),
        None => format!("pid {}", std::process::id()),
    };
    eprintln!("courier-shmem: {who}: {call}: {why}");
    crate::init::abort_job(1, &format!("{call}: {why}"))
}

/// Print a warning (`call: why`) on stderr, prefixed with this PE, and go on.
#[cold]
pub fn warn(call: &str, why: impl Display) {
    let who = match crate::init::my_pe_or_none() {
        Some(pe) => format!("PE {pe}"),
        None => format!("pid {}", std::process::id()),
    };
    eprintln!("courier-shmem: {who}: warning: {call}: {why}");
}

/// A debug line (`SHMEM_DEBUG`), on stderr.
pub fn debug(why: impl Display) {
    if crate::init::debug_enabled() {
        let who = match crate::init::my_pe_or_none() {
            Some(pe) => format!("PE {pe}"),
            None => format!("pid {}", std::process::id()),
        };
        eprintln!("courier-shmem: {who}: debug: {why}");
    }
}
