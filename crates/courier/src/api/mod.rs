//! api — the objects applications use: `Context` → `Worker` → `Endpoint`, `Listener`,
//! `Request`. Thin wrappers over the protocol layer's state; they own lifetimes and locking.

mod context;
mod endpoint;
mod listener;
mod memory;
mod onesided;
mod request;
mod semaphore;
mod worker;

pub use crate::base::lock::ThreadMode;
pub use context::{Context, ContextParams, Features};
pub use endpoint::{Endpoint, EndpointParams};
pub use listener::{ConnRequest, Listener};
pub use memory::{AtomicOp, Cmp, MemAttr, MemMapParams, Memory, MemoryType, SignalOp, access};
pub use onesided::RemoteKey;
pub use request::Request;
pub use semaphore::{SEM_MAX, Semaphore, sem_flags};
pub use worker::{AmMessage, Worker, WorkerParams};
