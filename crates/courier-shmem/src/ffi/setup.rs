//! Library setup, exit and query.

use std::ffi::{c_char, c_int, c_void};

use crate::error::guard;
use crate::init;

/// `SHMEM_VENDOR_STRING`.
pub const VENDOR: &str = concat!("Courier OpenSHMEM ", env!("CARGO_PKG_VERSION"));
/// `SHMEM_MAX_NAME_LEN`.
pub const MAX_NAME_LEN: usize = 256;

/// The line `SHMEM_VERSION` prints.
pub fn vendor_line() -> String {
    format!("{VENDOR} (OpenSHMEM 1.5)")
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_init() {
    guard("shmem_init", || {
        init::init("shmem_init", init::THREAD_SINGLE);
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmem_init_thread(requested: c_int, provided: *mut c_int) -> c_int {
    guard("shmem_init_thread", || {
        let got = init::init("shmem_init_thread", requested);
        if !provided.is_null() {
            // SAFETY: the caller's int.
            unsafe { *provided = got };
        }
        0
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmem_query_thread(provided: *mut c_int) {
    guard("shmem_query_thread", || {
        let w = init::world("shmem_query_thread");
        if provided.is_null() {
            crate::error::fatal("shmem_query_thread", "provided=NULL")
        }
        // SAFETY: the caller's int.
        unsafe { *provided = w.thread_level };
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_finalize() {
    guard("shmem_finalize", || init::finalize("shmem_finalize"))
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_global_exit(status: c_int) {
    guard("shmem_global_exit", || {
        // SAFETY: flushing every C stream has no preconditions.
        unsafe { libc::fflush(std::ptr::null_mut()) };
        init::abort_job(status, &format!("shmem_global_exit({status})"))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_my_pe() -> c_int {
    guard("shmem_my_pe", || init::world("shmem_my_pe").me as c_int)
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_n_pes() -> c_int {
    guard("shmem_n_pes", || init::world("shmem_n_pes").npes as c_int)
}

#[unsafe(no_mangle)]
pub extern "C" fn _my_pe() -> c_int {
    guard("_my_pe", || init::world("_my_pe").me as c_int)
}

#[unsafe(no_mangle)]
pub extern "C" fn _num_pes() -> c_int {
    guard("_num_pes", || init::world("_num_pes").npes as c_int)
}

#[unsafe(no_mangle)]
pub extern "C" fn start_pes(_npes: c_int) {
    guard("start_pes", || {
        init::init("start_pes", init::THREAD_SINGLE);
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_pe_accessible(pe: c_int) -> c_int {
    guard("shmem_pe_accessible", || {
        let w = init::world("shmem_pe_accessible");
        c_int::from(pe >= 0 && (pe as usize) < w.npes)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_addr_accessible(addr: *const c_void, pe: c_int) -> c_int {
    guard("shmem_addr_accessible", || {
        let w = init::world("shmem_addr_accessible");
        c_int::from(pe >= 0 && (pe as usize) < w.npes && w.locate(addr as usize, 1).is_some())
    })
}

/// A pointer to `dest` on world PE `pe` usable here, or null.
fn ptr_to(call: &'static str, w: &init::World, dest: *const c_void, pe: usize) -> *mut c_void {
    let Some((seg, off)) = w.locate(dest as usize, 1) else {
        return std::ptr::null_mut();
    };
    if pe == w.me {
        return dest as *mut c_void;
    }
    if !w.same_host(pe) {
        return std::ptr::null_mut();
    }
    match w.peer(call, pe).parts[seg as usize].as_ref() {
        // SAFETY: inside the peer's segment mapped here.
        Some(p) if !p.direct.is_null() && (off as u64) < p.len => unsafe {
            p.direct.add(off) as *mut c_void
        },
        _ => std::ptr::null_mut(),
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_ptr(dest: *const c_void, pe: c_int) -> *mut c_void {
    guard("shmem_ptr", || {
        let w = init::world("shmem_ptr");
        let pe = w.check_pe("shmem_ptr", pe);
        ptr_to("shmem_ptr", w, dest, pe)
    })
}

/// `shmem_team_ptr` (OpenSHMEM 1.6): `pe` is a PE of `team`.
#[unsafe(no_mangle)]
pub extern "C" fn shmem_team_ptr(
    team: crate::team::TeamHandle,
    dest: *const c_void,
    pe: c_int,
) -> *mut c_void {
    const CALL: &str = "shmem_team_ptr";
    guard(CALL, || {
        let w = init::world(CALL);
        match crate::team::lookup(CALL, team) {
            Some(t) => ptr_to(CALL, w, dest, t.world_pe(CALL, pe)),
            None => std::ptr::null_mut(),
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmem_info_get_version(major: *mut c_int, minor: *mut c_int) {
    guard("shmem_info_get_version", || {
        if major.is_null() || minor.is_null() {
            crate::error::fatal("shmem_info_get_version", "major or minor is NULL")
        }
        // SAFETY: the caller's ints.
        unsafe {
            *major = 1;
            *minor = 5;
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmem_info_get_name(name: *mut c_char) {
    guard("shmem_info_get_name", || {
        if name.is_null() {
            crate::error::fatal("shmem_info_get_name", "name=NULL")
        }
        let v = VENDOR.as_bytes();
        let n = v.len().min(MAX_NAME_LEN - 1);
        // SAFETY: the specification gives the caller's buffer SHMEM_MAX_NAME_LEN bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(v.as_ptr(), name as *mut u8, n);
            *name.add(n) = 0;
        }
    })
}

/// `shmem_pcontrol(level, ...)`: profiling control; nothing to do (C callers may pass
/// more arguments, which the calling convention lets us ignore).
#[unsafe(no_mangle)]
pub extern "C" fn shmem_pcontrol(_level: c_int) {}

macro_rules! no_cache {
    ($($name:ident),*) => {$(
        /// A deprecated cache-management call: Courier's memory is coherent.
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() {}
    )*};
}
no_cache!(shmem_clear_cache_inv, shmem_set_cache_inv, shmem_udcflush);

macro_rules! no_cache_line {
    ($($name:ident),*) => {$(
        /// A deprecated cache-management call: Courier's memory is coherent.
        #[unsafe(no_mangle)]
        pub extern "C" fn $name(_addr: *mut c_void) {}
    )*};
}
no_cache_line!(
    shmem_clear_cache_line_inv,
    shmem_set_cache_line_inv,
    shmem_udcflush_line
);
