//! proto — protocols built on transport capabilities, never on a transport's name:
//! wireup and lane selection, eager and rendezvous, tag matching, active messages, streams,
//! flush and close, peer-failure handling.
//!
//! Everything a worker keeps lives in one [`State`], inside the worker's state cell
//! (`base::lock`), and is touched only while the cell is held. The progress loop
//! (`progress`) is the only place that releases it in the middle of its work: to run user
//! callbacks.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::base::{Config, Error};
use crate::wire::address::WorkerAddress;

pub mod am;
pub(crate) mod buf;
pub(crate) mod endpoint;
pub(crate) mod fdpoll;
pub mod memreg;
pub mod onesided;
pub(crate) mod pieces;
pub(crate) mod place;
pub(crate) mod progress;
pub(crate) mod recv;
pub(crate) mod request;
pub(crate) mod rndv;
pub(crate) mod send;
pub(crate) mod stage;
pub(crate) mod stream;
pub mod tag;
pub mod wireup;

use endpoint::EpSlot;
use progress::Deferred;
use request::ReqSlot;
use rndv::{RndvCopies, SplitWait};
use tag::{Posted, Unexpected};
use wireup::{ListenerSlot, PendingConn};

/// Slots of one kind of object (requests, endpoints, listeners), with the free ones listed.
pub(crate) struct Slab<T> {
    pub slots: Vec<T>,
    pub free: Vec<u32>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

/// A worker's protocol state.
pub(crate) struct State {
    pub cfg: Arc<Config>,
    pub mem: Arc<memreg::MemRegistry>,
    pub ctx_name: String,
    pub worker_id: u64,
    pub address: WorkerAddress,
    pub address_bytes: Vec<u8>,
    pub reqs: Slab<ReqSlot>,
    pub eps: Slab<EpSlot>,
    /// Endpoints with a link, polled by progress.
    pub active: Vec<u32>,
    /// Posted tag receives, oldest first (every one is live: cancel and endpoint
    /// failure remove theirs).
    pub expected: VecDeque<Posted>,
    pub unexpected: VecDeque<Unexpected>,
    /// Emptied buffers of unexpected eager messages, reused for the next ones: a sender
    /// that runs ahead of its receiver's posts otherwise costs an allocation per message.
    pub unexp_pool: Vec<Vec<u8>>,
    pub am_handlers: Vec<Option<am::AmHandlerFn>>,
    pub deferred: Vec<Deferred>,
    /// An emptied `deferred`, swapped in when the callbacks run.
    pub deferred_spare: Vec<Deferred>,
    /// The worker's acceptors (one per transport that peers reach by worker address).
    pub acceptors: crate::transport::dial::Acceptors,
    pub listeners: Slab<ListenerSlot>,
    pub pending_conns: Slab<PendingConn>,
    /// Links this side is setting up over several steps (their acceptors' replies awaited).
    pub setups: Vec<wireup::LinkSetup>,
    pub epoll: OwnedFd,
    pub eventfd: OwnedFd,
    pub ep_configs: Vec<String>,
    pub progress_calls: u64,
    /// Flushes that found nothing to wait for, and when one of them last read epoll (at
    /// most once a `FLUSH_LOOK_GAP`, looked at every `FLUSH_LOOKS_EVERY`th), so that a
    /// caller that only puts and flushes still learns that a peer died.
    pub idle_flushes: u32,
    pub idle_flush_look: Option<std::time::Instant>,
    pub in_progress: bool,
    pub fd_links: usize,
    /// Whether the fds of fd links are in the epoll set (`fdpoll`: only while the worker
    /// may sleep or watches too many links to read each one).
    pub fd_watched: bool,
    /// `progress_calls` at the last `arm`.
    pub armed_at: u64,
    /// Endpoints whose links must be dropped once no handler runs on them.
    pub reap: Vec<u32>,
    pub excluded: Vec<String>,
    /// Links that failed while frames were still buffered: fail after those are handled.
    pub link_errors: Vec<(u32, Error)>,
    /// Endpoints peers created to this worker, not yet taken by the application.
    pub incoming: VecDeque<(u32, u32)>,
    /// Split rendezvous receives waiting for the sender's part.
    pub splits: Vec<SplitWait>,
    /// Rendezvous copies with pieces still to make, oldest first.
    pub copies: VecDeque<pieces::CopyJob>,
    /// Bytes a piece of a copy takes about `pieces::PIECE_TIME` to copy (`pieces`).
    pub piece_bytes: usize,
    /// Copies that could have sized the pieces since the last one timed (`pieces`).
    pub copies_untimed: u32,
    /// Bytes copied since the current (or last) progress call began; `usize::MAX` after a
    /// copy of device memory (`pieces`).
    pub copy_spent: usize,
    /// How this worker's single-copy rendezvous copies went.
    pub rndv_copies: RndvCopies,
    /// Scratch for the ids of zero-copy sends a link reports written.
    pub written: Vec<u64>,
    /// A host copy of device memory waiting for the request the operation being started
    /// allocates first (`proto::stage`).
    pub parked: Option<Box<stage::Stage>>,
}
