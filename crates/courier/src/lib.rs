//! Courier: one library that moves bytes between threads, processes and hosts by the
//! fastest route it can find.
//!
//! Layers, each using only the ones above it: [`base`] → [`wire`] → [`transport`] →
//! [`proto`] (protocols) → [`api`] (objects) → [`job`] (launchers and wire-up over the
//! objects); surfaces (the C ABI and the `courier` command) live in their own crates.
//!
//! ```no_run
//! use courier::{Context, ContextParams, Worker, WorkerParams, EndpointParams};
//! let ctx = Context::new(ContextParams::default())?;
//! let worker = Worker::new(&ctx, WorkerParams::default())?;
//! let ep = worker.connect(&worker.address()?, EndpointParams::default())?;
//! let mut buf = [0u8; 5];
//! let rx = worker.tag_recv(&mut buf, 7, u64::MAX)?;
//! ep.tag_send(b"hello", 7)?.wait()?;
//! rx.wait()?;
//! assert_eq!(&buf, b"hello");
//! # Ok::<(), courier::Error>(())
//! ```
#![warn(missing_docs)]
// Nested `if let` reads more plainly here than let-chains.
#![allow(clippy::collapsible_if)]

pub mod api;
pub mod base;
pub mod job;
pub mod proto;
pub mod transport;
pub mod wire;

pub use api::*;
pub use base::cuda::{Driver as CudaDriver, load as cuda_driver};
pub use base::{Config, Error, Result, Status};
pub use job::{Job, JobWorld, LauncherKind};
pub use proto::am::{AmFlags, AmRndv};
pub use proto::state::{Buf, Callback, Info, RawFn, RndvCopies};
pub use proto::tag::{ProbeInfo, Started};
