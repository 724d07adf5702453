//! api — the objects applications use: `Context` → `Worker` → `Endpoint`, `Listener`,
//! `Request`. Thin wrappers over the protocol layer's state; they own lifetimes and locking.

pub mod context;
pub mod endpoint;
pub mod listener;
pub mod memory;
pub mod onesided;
pub mod request;
pub mod semaphore;
pub mod worker;

pub use crate::base::lock::ThreadMode;
pub use context::{Context, ContextParams, Features};
pub use endpoint::{Endpoint, EndpointParams};
pub use listener::{ConnRequest, Listener};
pub use memory::{
    AtomicOp, Cmp, MemAttr, MemMapParams, Memory, MemoryType, RemoteKey, SignalOp, access,
};
pub use request::Request;
pub use semaphore::{SEM_MAX, Semaphore, sem_flags};
pub use worker::{AmMessage, Worker, WorkerParams};
