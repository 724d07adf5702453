//! `shmemx.h`'s semaphores and semaphore-signalling puts (see `crate::sem`).

use std::ffi::{c_int, c_void};

use crate::error::guard;

/// `shmemx_sem_t`: an opaque 64-bit handle (0 is `SHMEMX_SEM_NULL`).
pub type SemHandle = u64;

#[unsafe(no_mangle)]
pub extern "C" fn shmemx_sem_alloc(flags: c_int) -> SemHandle {
    guard("shmemx_sem_alloc", || {
        crate::sem::alloc("shmemx_sem_alloc", flags)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmemx_sem_free(sem: SemHandle) {
    guard("shmemx_sem_free", || {
        crate::sem::free("shmemx_sem_free", sem)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmemx_sem_pe(sem: SemHandle) -> c_int {
    guard("shmemx_sem_pe", || crate::sem::owner("shmemx_sem_pe", sem))
}

#[unsafe(no_mangle)]
pub extern "C" fn shmemx_sem_post(sem: SemHandle, n: usize) {
    guard("shmemx_sem_post", || {
        crate::sem::post("shmemx_sem_post", sem, n)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmemx_sem_wait(sem: SemHandle, n: usize) {
    guard("shmemx_sem_wait", || {
        crate::sem::wait("shmemx_sem_wait", sem, n)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmemx_sem_try(sem: SemHandle, n: usize) -> c_int {
    guard("shmemx_sem_try", || {
        crate::sem::try_take("shmemx_sem_try", sem, n)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmemx_sem_value(sem: SemHandle) -> usize {
    guard("shmemx_sem_value", || {
        crate::sem::value("shmemx_sem_value", sem) as usize
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmemx_putmem_signal_sem(
    dest: *mut c_void,
    source: *const c_void,
    nbytes: usize,
    sem: SemHandle,
    n: usize,
) {
    const N: &str = "shmemx_putmem_signal_sem";
    guard(N, || {
        crate::sem::put_signal(N, dest.cast(), source.cast(), nbytes, sem, n, false)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmemx_putmem_signal_sem_nbi(
    dest: *mut c_void,
    source: *const c_void,
    nbytes: usize,
    sem: SemHandle,
    n: usize,
) {
    const N: &str = "shmemx_putmem_signal_sem_nbi";
    guard(N, || {
        crate::sem::put_signal(N, dest.cast(), source.cast(), nbytes, sem, n, true)
    })
}
