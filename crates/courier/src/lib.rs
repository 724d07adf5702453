//! Courier: one library that moves bytes between threads, processes and hosts by the
//! fastest route it can find.
//!
//! Layers, each using only the ones above it: [`base`] → [`wire`] → [`transport`] →
//! [`proto`] (protocols) → [`api`] (objects); surfaces (the C ABI and the `courier`
//! command) live in their own crates.
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
pub mod proto;
pub mod transport;
pub mod wire;

pub use api::*;
pub use base::config;
pub use base::cuda::{Driver as CudaDriver, load as cuda_driver};
pub use base::sys::poll_gap;
pub use base::{Config, Error, Result, Status};
pub use proto::am::{AmFlags, AmRndv};
pub use proto::buf::Buf;
pub use proto::onesided;
pub use proto::request::{Callback, Info, RawFn};
pub use proto::rndv::RndvCopies;
pub use proto::tag::{ProbeInfo, Started};
pub use transport::{Caps, DeviceInfo, RndvMode, TransportInfo, probe_transport, transports};
