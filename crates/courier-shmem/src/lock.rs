//! Distributed locks (`shmem_set_lock`, `shmem_test_lock`, `shmem_clear_lock`): a ticket
//! lock in the symmetric `long` on PE 0. Its low 32 bits are the next ticket, its high 32
//! bits the ticket being served (both start at 0, as the specification's zeroed lock
//! requires); PEs are served in the order they asked, so no one starves.

use courier::AtomicOp;

use crate::amo::{self, Op};
use crate::ctx::DEFAULT;
use crate::error::fatal;
use crate::wait::block_until;

fn check(call: &'static str, lock: *mut i64) -> &'static crate::init::World {
    let w = crate::init::world(call);
    if !(lock as usize).is_multiple_of(8) {
        fatal(call, format_args!("lock={lock:p}: not aligned to a long"))
    }
    if w.locate(lock as usize, 8).is_none() {
        crate::rma::not_symmetric(w, call, "lock", lock as usize, 8)
    }
    w
}

/// The two halves of the lock word (little-endian: the next ticket comes first).
fn halves(lock: *mut i64) -> (*mut u32, *mut u32) {
    (lock as *mut u32, (lock as *mut u32).wrapping_add(1))
}

/// `shmem_set_lock`: take a ticket, wait until it is served.
pub fn set(call: &'static str, lock: *mut i64) {
    let w = check(call, lock);
    let (next, serving) = halves(lock);
    let mine = amo::fetch::<u32>(call, &DEFAULT, next, Op::Rmw(AtomicOp::Add), 1, 0, 0);
    let mut looks = 0u32;
    block_until(w, || {
        looks = looks.wrapping_add(1);
        // Looking through the owner is a round trip: not at every turn of the loop.
        if 0 != w.me && !w.same_host(0) && !looks.is_multiple_of(16) {
            return false;
        }
        amo::fetch::<u32>(call, &DEFAULT, serving, Op::Fetch, 0, 0, 0) == mine
    });
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// `shmem_test_lock`: 0 if the lock was free and is now ours, 1 if it is held.
pub fn test(call: &'static str, lock: *mut i64) -> i32 {
    check(call, lock);
    let word = lock as *mut u64;
    loop {
        let v = amo::fetch::<u64>(call, &DEFAULT, word, Op::Fetch, 0, 0, 0);
        let (next, serving) = (v as u32, (v >> 32) as u32);
        if next != serving {
            return 1;
        }
        let want = (v & !0xffff_ffff) | next.wrapping_add(1) as u64;
        let old = amo::fetch::<u64>(call, &DEFAULT, word, Op::Rmw(AtomicOp::Cswap), want, v, 0);
        if old == v {
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            return 0;
        }
        // Someone else moved it meanwhile: look again.
    }
}

/// `shmem_clear_lock`: complete our writes, then serve the next ticket.
pub fn clear(call: &'static str, lock: *mut i64) {
    let w = check(call, lock);
    crate::rma::quiet_all(w, call);
    let (_, serving) = halves(lock);
    amo::fetch::<u32>(call, &DEFAULT, serving, Op::Rmw(AtomicOp::Add), 1, 0, 0);
}
