//! api — the objects applications use: `Context` → `Worker` → `Endpoint`, `Listener`,
//! `Memory` and `RemoteKey`, `Request` and `Scope`, `Semaphore`. Thin wrappers: they own lifetimes,
//! borrow the caller's buffers for a request's life, take the worker's state cell, and
//! call the protocol layer, which does the work (progress, matching, rendezvous,
//! one-sided routes) and owns the state. No file here reads `proto::State`'s fields.

mod context;
mod endpoint;
mod listener;
mod memory;
mod onesided;
mod request;
mod scope;
mod semaphore;
mod worker;

pub use crate::base::lock::ThreadMode;
pub use context::{Context, ContextParams, Features};
pub use endpoint::{Endpoint, EndpointParams};
pub use listener::{ConnRequest, Listener};
pub use memory::{
    AtomicOp, Cmp, MemAttr, MemMapParams, Memory, MemoryType, SignalOp, access, unshare_in_place,
};
pub use onesided::RemoteKey;
pub use request::{Backoff, Request};
pub use scope::Scope;
pub use semaphore::{SEM_MAX, SemTaken, Semaphore, SemaphoreAt, sem_flags};
pub use worker::{AmMessage, Worker, WorkerParams};
