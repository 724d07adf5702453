//! One-sided operations: put, get, atomics, put-with-signal, fence, in one room.
//!
//! A peer's memory is reached by one of these routes, chosen when its key is unpacked
//! (`key.rs`) and again per operation (`ops.rs`):
//! - this very context: copies and CPU atomics in this process (`direct.rs`);
//! - a same-host peer's allocated memory, whose shared segment is mapped here: loads,
//!   stores and CPU atomics, checked against the owner's record of the region, without the
//!   owner's CPU (`direct.rs`); its registered memory with CMA; its device memory through
//!   the allocation's CUDA IPC handle;
//! - anywhere else, frames the owner's worker carries out as it progresses (`origin.rs`
//!   sends them and takes the answers, `owner.rs` is the owner's side).
//!
//! Same-host memory is reached only through the shm transport's narrow interface for it
//! (`transport::shm`: CMA, doorbells, a peer's descriptors and segments). What each route
//! does is described as data in `routes.rs` (the public `courier::onesided`), which the
//! tests hold the operations to.

use std::time::Instant;

mod atomic;
mod direct;
mod key;
mod ops;
mod origin;
mod owner;
mod routes;

pub use atomic::{AtomicOp, SignalOp};
pub(crate) use direct::{Dir, copy_local};
pub(crate) use key::Key;
pub(crate) use ops::{SignalTarget, atomic, atomic_post, get, put, put_signal};
pub use routes::*;

/// One-sided operations' worker-wide state.
#[derive(Default)]
pub(crate) struct OnesidedState {
    /// Flushes that found nothing to wait for, and when one of them last read epoll (at
    /// most once a `FLUSH_LOOK_GAP`, looked at every `FLUSH_LOOKS_EVERY`th), so that a
    /// caller that only puts and flushes still learns that a peer died.
    pub(crate) idle_flushes: u32,
    pub(crate) idle_flush_look: Option<Instant>,
    /// Set while some endpoint of this worker has operations through its owner that no
    /// fence or flush waited for and a key that reaches memory without the owner: only
    /// then can a fence have anything to wait for. Written under the worker's lock, read
    /// without it by `Endpoint::fence` (`WorkerInner::rma_mixed` is the same flag).
    pub(crate) mixed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}
