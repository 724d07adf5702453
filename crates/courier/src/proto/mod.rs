//! proto — protocols built on transport capabilities, never on a transport's name:
//! wireup and lane selection, eager and rendezvous, tag matching, active messages, streams,
//! flush and close, peer-failure handling.
//!
//! Everything a worker keeps lives in one [`State`], inside the worker's state cell
//! (`base::lock`), and is touched only while the cell is held. The progress loop
//! (`progress`) is the only place that releases it in the middle of its work: to run user
//! callbacks.

use std::sync::Arc;

use rustix::event::epoll;

use crate::base::{Config, Error, Result};

pub mod am;
pub(crate) mod blockq;
pub(crate) mod buf;
pub(crate) mod endpoint;
pub(crate) mod fdpoll;
pub(crate) mod keepalive;
pub(crate) mod limits;
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
pub(crate) mod streamq;
pub mod tag;
pub mod wireup;

use endpoint::EpSlot;
use request::ReqSlot;

/// Slots of one kind of object (requests, endpoints, listeners), with the free ones listed.
pub(crate) struct Slab<T> {
    pub(in crate::proto) slots: Vec<T>,
    pub(in crate::proto) free: Vec<u32>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

/// A worker's protocol state: the request and endpoint tables every protocol shares, then
/// one part per feature, each defined (with its methods) in its room. The fields are
/// private: only `proto` and its rooms reach them; the API asks `State`'s methods.
pub(crate) struct State {
    cfg: Arc<Config>,
    mem: Arc<memreg::MemRegistry>,
    /// Requests in flight (`request.rs`).
    reqs: Slab<ReqSlot>,
    /// How many of them wait on each endpoint (`request.rs`).
    inflight: request::InFlight,
    /// Endpoints (`endpoint.rs`).
    eps: Slab<EpSlot>,
    /// A host copy of device memory waiting for the request the operation being started
    /// allocates first (`stage.rs`).
    parked: Option<Box<stage::Stage>>,
    /// Scratch for the ids of zero-copy sends a link reports written (`send.rs`).
    written: Vec<u64>,
    /// The progress loop's state: epoll, the event fd, what runs outside the lock, the
    /// active endpoints (`progress.rs`, `fdpoll.rs`).
    progress: progress::ProgressState,
    /// Tag matching's queues (`tag.rs`).
    tag: tag::TagQueues,
    /// Active-message handlers (`am.rs`).
    am: am::AmHandlers,
    /// Rendezvous in flight: split receives and copies in pieces (`rndv.rs`, `pieces.rs`).
    rndv: rndv::RndvState,
    /// One-sided operations' worker-wide state (`onesided/`).
    onesided: onesided::OnesidedState,
    /// Wireup: this worker's address, acceptors, listeners, connections being set up
    /// (`wireup/`).
    wireup: wireup::WireupState,
    /// What peers make the worker hold (`limits.rs`).
    limits: limits::LimitState,
    /// Blocks for unreceived stream bytes (`streamq.rs`).
    stream_spares: streamq::Spares,
}

impl State {
    /// A worker state with the default configuration, for unit tests of `proto`'s parts.
    #[cfg(test)]
    pub(crate) fn for_test(name: &str) -> State {
        let cfg = Config::from_env_with(&[]).expect("config");
        State::new(
            Arc::new(cfg),
            name.into(),
            Arc::new(memreg::MemRegistry::new()),
        )
        .expect("worker state")
    }

    /// A fresh worker state: its epoll set and event fd, its acceptors and address.
    pub(crate) fn new(
        cfg: Arc<Config>,
        ctx_name: String,
        mem: Arc<memreg::MemRegistry>,
    ) -> Result<State> {
        let epollfd =
            epoll::create(epoll::CreateFlags::CLOEXEC).map_err(|e| Error::io("epoll_create", e))?;
        let eventfd = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .map_err(|e| Error::io("eventfd", e))?;
        epoll::add(
            &epollfd,
            &eventfd,
            epoll::EventData::new_u64(fdpoll::token::make(fdpoll::token::EVENT, 0)),
            epoll::EventFlags::IN,
        )
        .map_err(|e| Error::io("epoll add", e))?;
        let wireup = wireup::WireupState::open(&cfg, ctx_name, &epollfd)?;
        Ok(State {
            cfg,
            mem,
            reqs: Slab::default(),
            inflight: Default::default(),
            eps: Slab::default(),
            parked: None,
            written: Vec::new(),
            progress: progress::ProgressState::new(epollfd, eventfd),
            tag: Default::default(),
            am: Default::default(),
            rndv: Default::default(),
            onesided: Default::default(),
            wireup,
            limits: Default::default(),
            stream_spares: Default::default(),
        })
    }
}
