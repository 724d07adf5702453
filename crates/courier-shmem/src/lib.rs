//! OpenSHMEM 1.5 on Courier (`libcourier_shmem.so`, `.a`, `include/shmem.h`).
//!
//! Every processing element (PE) is one process of a job started by `courier run` (or
//! `oshrun`, mpirun, srun); the job layer gives rank, size, a key-value exchange and
//! endpoints. On top of Courier's one-sided operations:
//!
//! - `init`: the job, one context and worker, the symmetric heap and the program's static
//!   data, their keys exchanged; `shmem_finalize` and `shmem_global_exit`.
//! - `symmetric`: the heap (`SHMEM_SYMMETRIC_SIZE`, one mapping per PE, a deterministic
//!   allocator so that every PE's block sits at the same offset) and the data segment
//!   (the executable's writable ELF segment shared in place), and the translation of a
//!   local symmetric address into a peer's.
//! - `rma`, `amo`, `signal`, `wait`: the data path. Same-host peers are reached with
//!   plain loads, stores and CPU atomics through their mapped segments; others through
//!   Courier endpoints.
//! - `copy`: the copy that a put or get into mapped memory becomes.
//! - `coll`, `team`: teams and collectives (dissemination sync on pairwise counters,
//!   data pulled from peers' symmetric buffers).
//! - `ctx`, `lock`: communication contexts and distributed locks.
//! - `sem`: Berkeley UPC-style semaphores and the put that signals one (`shmemx.h`).
//! - `cpus`: whether this machine's PEs outnumber their CPUs (how waits spin).
//! - `record`: the bytes of what PEs publish to each other (segments and keys, machine
//!   and CPUs), parsed with every length checked.
//! - `error`: the messages that name the call, the argument and why, then the abort.
//! - `ffi`: the hand-written C entry points; `typed`: the typed ones, written by one macro
//!   per family for each type that `typed/list.rs` names (generated with `include/shmem.h`
//!   by `gen/generate.py`). Every entry point is thin and runs its body behind a panic
//!   boundary (`error::guard`).
#![allow(non_camel_case_types)]
#![allow(clippy::missing_safety_doc)]
// Nested `if let` reads more plainly here than let-chains.
#![allow(clippy::collapsible_if)]

mod amo;
mod coll;
mod copy;
mod cpus;
mod ctx;
mod error;
pub mod ffi;
mod heap;
mod init;
mod lock;
mod record;
mod reduce;
mod rma;
mod runtime;
mod sem;
mod signal;
mod symmetric;
mod team;
pub mod typed;
mod wait;

/// The features of the Courier context each PE makes in `shmem_init`: one-sided
/// operations, atomics and wakeups. A program that takes a PE's place by hand (the shmem
/// suite's `examples/lying_pe.rs`) makes the same context.
pub const PE_FEATURES: courier::Features = courier::Features {
    tag: false,
    am: false,
    stream: false,
    rma: true,
    atomics: true,
    wakeup: true,
};

/// Bytes of the CPU set in the record each PE publishes to the others (`record`).
pub use record::SET_BYTES as CPU_SET_BYTES;
