//! Ordering and synchronization: fence, quiet, barriers and syncs, locks, signal waits.

use std::ffi::{c_int, c_long};

use crate::coll::{self, Members};
use crate::ctx::{self, CtxHandle};
use crate::error::guard;
use crate::init::world;
use crate::team::{self, TeamHandle};

#[unsafe(no_mangle)]
pub extern "C" fn shmem_fence() {
    guard("shmem_fence", || {
        crate::rma::fence_all(world("shmem_fence"), "shmem_fence")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_quiet() {
    guard("shmem_quiet", || {
        crate::rma::quiet_all(world("shmem_quiet"), "shmem_quiet")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_ctx_fence(c: CtxHandle) {
    guard("shmem_ctx_fence", || {
        ctx::from_handle("shmem_ctx_fence", c);
        crate::rma::fence_all(world("shmem_ctx_fence"), "shmem_ctx_fence")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_ctx_quiet(c: CtxHandle) {
    guard("shmem_ctx_quiet", || {
        ctx::from_handle("shmem_ctx_quiet", c);
        crate::rma::quiet_all(world("shmem_ctx_quiet"), "shmem_ctx_quiet")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_barrier_all() {
    guard("shmem_barrier_all", || {
        coll::barrier_world(world("shmem_barrier_all"), "shmem_barrier_all")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_sync_all() {
    guard("shmem_sync_all", || {
        let w = world("shmem_sync_all");
        coll::sync_team(w, "shmem_sync_all", team::world_team())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_barrier(start: c_int, log_stride: c_int, size: c_int, _psync: *mut c_long) {
    guard("shmem_barrier", || {
        let w = world("shmem_barrier");
        let m = Members::active_set(w, "shmem_barrier", start, log_stride, size);
        coll::barrier(w, "shmem_barrier", &m)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_sync(start: c_int, log_stride: c_int, size: c_int, _psync: *mut c_long) {
    guard("shmem_sync", || {
        let w = world("shmem_sync");
        let m = Members::active_set(w, "shmem_sync", start, log_stride, size);
        coll::sync(w, "shmem_sync", &m)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_team_sync(t: TeamHandle) -> c_int {
    guard("shmem_team_sync", || {
        let w = world("shmem_team_sync");
        match team::lookup("shmem_team_sync", t) {
            Some(d) => {
                coll::sync_team(w, "shmem_team_sync", d);
                0
            }
            None => -1,
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_set_lock(lock: *mut c_long) {
    guard("shmem_set_lock", || {
        crate::lock::set("shmem_set_lock", lock)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_clear_lock(lock: *mut c_long) {
    guard("shmem_clear_lock", || {
        crate::lock::clear("shmem_clear_lock", lock)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_test_lock(lock: *mut c_long) -> c_int {
    guard("shmem_test_lock", || {
        crate::lock::test("shmem_test_lock", lock)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_signal_fetch(sig_addr: *const u64) -> u64 {
    guard("shmem_signal_fetch", || {
        crate::signal::fetch("shmem_signal_fetch", sig_addr)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_signal_wait_until(sig_addr: *mut u64, cmp: c_int, value: u64) -> u64 {
    guard("shmem_signal_wait_until", || {
        crate::signal::wait_until("shmem_signal_wait_until", sig_addr, cmp, value)
    })
}
