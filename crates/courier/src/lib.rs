//! Courier: one library that moves bytes between threads, processes and hosts by the
//! fastest route it can find.
//!
//! Layers, each using only the ones below it: base → [`wire`] → transport → proto
//! (protocols) → api (objects) → job (launchers and wire-up over the objects); surfaces (the C ABI, the `courier` command, the Go
//! bindings) live in their own crates and use only this public API. `ARCHITECTURE.md` at
//! the repository's root says what each layer holds and where a new thing goes.
//!
//! The public API is at the crate root: the objects (`Context`, `Worker`, `Endpoint`,
//! `Listener`, `Memory`, `RemoteKey`, `Request`, `Scope`, `Semaphore`), what operations take and
//! report (`Buf`, `Callback`, `Info`, `Started`, `AmFlags`, ...), the configuration table
//! ([`config`]), what each transport can do here ([`transports`]), how one-sided
//! operations reach a peer's memory ([`onesided`]), and the byte layouts peers exchange
//! ([`wire`], for fuzz targets and tests that play a hostile peer).
//!
//! ```no_run
//! use courier::{Context, ContextParams, Worker, WorkerParams, EndpointParams};
//! let ctx = Context::new(ContextParams::default())?;
//! let worker = Worker::new(&ctx, WorkerParams::default())?;
//! let ep = worker.connect(&worker.address()?, EndpointParams::default())?;
//! let mut buf = [0u8; 5];
//! worker.scope(|s| {
//!     let rx = s.tag_recv(&mut buf, 7, u64::MAX)?; // lends `buf` until the scope ends
//!     ep.tag_send(b"hello", 7)?; // blocking
//!     rx.wait()
//! })?;
//! assert_eq!(&buf, b"hello");
//! # Ok::<(), courier::Error>(())
//! ```
#![warn(missing_docs)]
// Nested `if let` reads more plainly here than let-chains.
#![allow(clippy::collapsible_if)]

mod api;
mod base;
pub mod job;
mod proto;
mod transport;
pub mod wire;

/// The transports' readers of peer bytes that are state, not a plain layout (a tcp
/// connection's framing, a shared-memory FIFO's cells), run on bytes, for the fuzz
/// targets in `fuzz/`. Not part of the API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::transport::shm::fuzz_consumer;
    pub use crate::transport::tcp::{MAX_FRAME, PREAMBLE, fuzz_framing};
}

pub use api::*;
pub use base::auth;

/// The README's Rust blocks, compiled and run as doctests (`cargo test --doc`), so that the
/// README cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
pub use base::config;
pub use base::cuda::{Driver as CudaDriver, load as cuda_driver};
pub use base::sys::{host_id, machine_id, poll_gap};
pub use base::{Config, Error, Result, Status};
pub use job::{Job, JobWorld, LauncherKind};
pub use proto::am::{AmFlags, AmRndv};
pub use proto::buf::Buf;
pub use proto::onesided;
pub use proto::request::Started;
pub use proto::request::{Callback, Info, RawFn};
pub use proto::rndv::RndvCopies;
pub use proto::tag::ProbeInfo;
pub use transport::{Caps, DeviceInfo, RndvMode, TransportInfo, probe_transport, transports};
