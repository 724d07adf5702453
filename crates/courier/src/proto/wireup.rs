//! Wireup: making connections, choosing the transport, and saying what was chosen.
//!
//! - By worker address: the same worker → `self`; the same host and shm allowed → `shm`;
//!   otherwise `tcp`. The initiator sends `Wireup(NEW)` with its own address on the new
//!   link; the peer's worker makes a passive endpoint for it.
//! - By socket address through a listener: the client connects over TCP and sends
//!   `ConnReq`. The server's handler accepts (`ConnAccept` with the server's address) or
//!   rejects (`ConnReject`). If both sides offer shared memory and share a host, the client
//!   then opens a shm link and sends `Wireup(UPGRADE)` on it, and both sides move to it; if
//!   that fails it sends `Wireup(NO_UPGRADE)` on the TCP link and both stay there. Neither
//!   side sends user data before the choice is settled, so ordering is never at risk.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::epoll;

use super::endpoint::EpStatus;
use super::progress::{Deferred, token};
use super::rndv::RndvCopies;
use super::{Slab, State};
use crate::base::sys::{host_id, pid, random_u64};
use crate::base::{Config, Error, Result, Status};
use crate::transport::dial::{self, Acceptors, Connecting, Dialed, Dialer, SocketListener};
use crate::transport::{LinkRx, LinkTx};
use crate::wire::address::WorkerAddress;
use crate::wire::frame::{Frame, Header, Kind};

/// A listener's connection handler.
pub type ConnHandler = Box<dyn FnMut(ConnRequest) + Send>;

pub(crate) struct ListenerSlot {
    pub live: bool,
    pub generation: u32,
    pub socket: SocketListener,
    pub handler: Option<ConnHandler>,
}

pub(crate) struct PendingConn {
    pub live: bool,
    pub generation: u32,
    pub tx: Option<LinkTx>,
    pub rx: Option<LinkRx>,
    /// Which user listener accepted it (None: the worker's own acceptors).
    pub listener: Option<u32>,
    pub peer: String,
    pub since: Instant,
    /// The connection handler has it and has not answered yet.
    pub offered: bool,
    pub client_id: u64,
    pub client_addr: Option<WorkerAddress>,
}

/// Wireup purposes.
pub(crate) mod purpose {
    pub const NEW: u32 = 0;
    pub const UPGRADE: u32 = 1;
    pub const NO_UPGRADE: u32 = 2;
}

/// How long an accepted connection may take to say who it is.
const WIREUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection request waiting for the listener's handler, as the protocol layer sees it.
#[derive(Debug)]
pub struct ConnRequest {
    pub(crate) pending: u32,
    pub(crate) pending_generation: u32,
    /// The client's socket address.
    pub client_addr: String,
    /// The id the client chose.
    pub client_id: u64,
}

fn locality(peer: &WorkerAddress, me: u64) -> &'static str {
    if peer.worker_id == me {
        "self"
    } else if peer.host_id == host_id() {
        "intra-node"
    } else {
        "inter-node"
    }
}

/// A link this side is setting up for endpoint `e` over several steps (`Connecting`):
/// progress moves it on, and then goes on as `then` says.
pub(crate) struct LinkSetup {
    e: u32,
    generation: u32,
    conn: Connecting,
    then: AfterSetup,
    /// Its socket is in the worker's epoll set, so that a sleeping worker wakes for the
    /// reply (`arm` lets it sleep only then).
    pub(crate) watched: bool,
}

/// What follows a link setup.
enum AfterSetup {
    /// A connection to a worker address (`connect_address`): on failure, the next
    /// transport that may reach the same worker.
    New {
        conn_id: u64,
        dialer: Box<Dialer>,
        loc: &'static str,
    },
    /// The upgrade of a connection a listener accepted: on failure, it stays on the link
    /// it came on.
    Upgrade {
        conn_id: u64,
        pid: u32,
        loc: &'static str,
    },
}

impl State {
    /// A fresh worker state: event fds, acceptors, address.
    pub(crate) fn new(
        cfg: Arc<Config>,
        ctx_name: String,
        mem: Arc<crate::proto::memreg::MemRegistry>,
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
            epoll::EventData::new_u64(token::make(token::EVENT, 0)),
            epoll::EventFlags::IN,
        )
        .map_err(|e| Error::io("epoll add", e))?;
        let worker_id = random_u64();
        let mut excluded = Vec::new();
        for t in crate::base::config::TRANSPORTS {
            if !cfg.tls.allows(t) {
                excluded.push(format!("{t}: excluded by COURIER_TLS={}", cfg.tls.spec));
            }
        }
        let mut address = WorkerAddress {
            worker_id,
            host_id: host_id(),
            pid: pid(),
            uds_name: Vec::new(),
            tcp: Vec::new(),
        };
        let acceptors = Acceptors::open(&cfg, &mut excluded, &mut address, |fd, which| {
            epoll::add(
                &epollfd,
                fd,
                epoll::EventData::new_u64(token::make(token::ACCEPT, which)),
                epoll::EventFlags::IN,
            )
            .map_err(|e| Error::io("epoll add", e))
        })?;
        Ok(State {
            cfg,
            mem,
            ctx_name,
            worker_id,
            address_bytes: address.pack(),
            address,
            reqs: Slab::default(),
            eps: Slab::default(),
            active: Vec::new(),
            expected: Default::default(),
            unexpected: Default::default(),
            unexp_pool: Vec::new(),
            am_handlers: Vec::new(),
            deferred: Vec::new(),
            deferred_spare: Vec::new(),
            acceptors,
            listeners: Slab::default(),
            pending_conns: Slab::default(),
            setups: Vec::new(),
            epoll: epollfd,
            eventfd,
            ep_configs: Vec::new(),
            progress_calls: 0,
            idle_flushes: 0,
            idle_flush_look: None,
            in_progress: false,
            fd_links: 0,
            fd_watched: false,
            armed_at: 0,
            reap: Vec::new(),
            excluded,
            link_errors: Vec::new(),
            incoming: VecDeque::new(),
            splits: Vec::new(),
            copies: VecDeque::new(),
            piece_bytes: usize::MAX,
            copies_untimed: 0,
            copy_spent: 0,
            rndv_copies: RndvCopies::default(),
            written: Vec::new(),
            parked: None,
        })
    }

    /// This worker's address, packed, for peers to connect to.
    pub(crate) fn address_bytes(&self) -> &[u8] {
        &self.address_bytes
    }

    /// Why transports are not usable by this worker (excluded, unavailable).
    pub(crate) fn excluded(&self) -> &[String] {
        &self.excluded
    }

    /// How this worker's single-copy rendezvous copies were made so far.
    pub(crate) fn rndv_copies(&self) -> RndvCopies {
        self.rndv_copies
    }

    /// The next endpoint a peer opened to this worker by its address, not yet taken.
    pub(crate) fn take_incoming(&mut self) -> Option<(u32, u32)> {
        while let Some((idx, generation)) = self.incoming.pop_front() {
            if self.ep_is(idx, generation) {
                return Some((idx, generation));
            }
        }
        None
    }

    /// Print the endpoint configuration line once per distinct configuration.
    pub(crate) fn log_selection(&mut self, e: u32, locality: &str) {
        let Some(caps) = self.ep(e).and_then(|ep| ep.caps.clone()) else {
            return;
        };
        let key = format!("{locality} {}", super::onesided::lanes_line(&caps));
        let n = match self.ep_configs.iter().position(|k| *k == key) {
            Some(n) => n,
            None => {
                self.ep_configs.push(key.clone());
                let n = self.ep_configs.len() - 1;
                let (loc, rest) = key.split_once(' ').unwrap_or((&key, ""));
                tracing::info!("{} {loc} cfg#{n} {rest}", self.ctx_name);
                for why in &self.excluded {
                    tracing::info!("{} cfg#{n}: {why}", self.ctx_name);
                }
                n
            }
        };
        let _ = n;
    }

    /// Connect to a worker address.
    pub(crate) fn connect_address(&mut self, bytes: &[u8]) -> Result<u32> {
        let peer = WorkerAddress::unpack(bytes)
            .map_err(|e| Error::msg(Status::InvalidAddress, e.to_string()))?;
        let loc = locality(&peer, self.worker_id);
        let same_worker = peer.worker_id == self.worker_id;
        let dialer = Box::new(Dialer::new(peer, same_worker));
        let conn_id = random_u64();
        self.dial(dialer, conn_id, loc, None)
    }

    /// Go on dialing the peer of `dialer` for endpoint `existing` (a failed setup's) or a
    /// new one: the first transport that gives a link (or a setup) is taken.
    fn dial(
        &mut self,
        mut dialer: Box<Dialer>,
        conn_id: u64,
        loc: &'static str,
        existing: Option<u32>,
    ) -> Result<u32> {
        let pid = dialer.peer().pid;
        match dialer.next(&self.cfg) {
            Dialed::Pair((atx, arx), (ptx, prx)) => {
                let a = self.ep_alloc(format!("self (pid {pid})"));
                let p = self.ep_alloc(format!("self (pid {pid})"));
                for (e, tx, rx) in [(a, atx, arx), (p, ptx, prx)] {
                    self.ep_install_link(e, tx, rx)?;
                    let me = self.worker_id;
                    if let Some(ep) = self.ep(e) {
                        ep.status = EpStatus::Connected;
                        ep.peer_worker = me;
                    }
                }
                let pg = self.ep(p).map(|ep| ep.generation).unwrap_or(0);
                self.incoming.push_back((p, pg));
                self.log_selection(a, "self");
                Ok(a)
            }
            Dialed::Setup(conn) => {
                // Connecting until the acceptor's worker answers (its progress, maybe
                // on this very thread); sends queue meanwhile.
                let e = match existing {
                    Some(e) => e,
                    None => self.ep_alloc(format!("pid {pid} ({})", conn.name())),
                };
                self.await_setup(
                    e,
                    conn,
                    AfterSetup::New {
                        conn_id,
                        dialer,
                        loc,
                    },
                );
                Ok(e)
            }
            Dialed::Link(tx, rx, reached) => {
                let e = match existing {
                    Some(e) => {
                        if let Some(ep) = self.ep(e) {
                            ep.peer = reached;
                        }
                        e
                    }
                    None => self.ep_alloc(reached),
                };
                let worker = dialer.peer().worker_id;
                self.finish_connect(e, (tx, rx), conn_id, worker, loc)
            }
            Dialed::Unreachable => Err(Error::msg(
                Status::Unreachable,
                format!(
                    "no transport reaches worker pid {pid}: {}",
                    dialer.reasons.join("; ")
                ),
            )),
        }
    }

    /// Let progress finish `conn`, the link setup of endpoint `e`, then go on as `then`
    /// says.
    fn await_setup(&mut self, e: u32, conn: Connecting, then: AfterSetup) {
        let generation = self.ep(e).map(|ep| ep.generation).unwrap_or(0);
        // Level-triggered: a reply already there wakes the next sleep at once.
        let watched = epoll::add(
            &self.epoll,
            conn.fd(),
            epoll::EventData::new_u64(token::make(token::SETUP, 0)),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
        )
        .is_ok();
        self.setups.push(LinkSetup {
            e,
            generation,
            conn,
            then,
            watched,
        });
    }

    /// Move the link setups on: each that is ready is finished, each that failed falls
    /// back (`AfterSetup`). Returns how many ended.
    pub(crate) fn progress_setups(&mut self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < self.setups.len() {
            let c = &mut self.setups[i];
            let gone = self.eps.slots.get(c.e as usize).is_none_or(|ep| {
                !ep.live || ep.generation != c.generation || ep.status != EpStatus::Connecting
            });
            let polled = if gone { Ok(true) } else { c.conn.poll() };
            if let Ok(false) = polled {
                i += 1;
                continue;
            }
            let c = self.setups.swap_remove(i);
            n += 1;
            if c.watched {
                // Before the socket becomes the link's, which may watch it under its own
                // token.
                let _ = epoll::delete(&self.epoll, c.conn.fd());
            }
            if gone {
                // Closed (or failed) while connecting: dropping the setup closes its
                // socket, and the acceptor drops its side.
                continue;
            }
            let name = c.conn.name();
            let link = polled.and_then(|_| c.conn.finish());
            self.after_setup(c.e, c.then, name, link);
        }
        n
    }

    /// A link setup (of transport `name`) for `e` ended with `link` (or why not): go on as
    /// `then` says.
    fn after_setup(
        &mut self,
        e: u32,
        then: AfterSetup,
        name: &str,
        link: Result<(LinkTx, LinkRx)>,
    ) {
        match (then, link) {
            (
                AfterSetup::New {
                    conn_id,
                    mut dialer,
                    loc,
                },
                link,
            ) => {
                let r = match link {
                    Ok(link) => {
                        let worker = dialer.peer().worker_id;
                        self.finish_connect(e, link, conn_id, worker, loc)
                    }
                    Err(err) => {
                        tracing::info!(
                            "{name} to worker pid {} failed ({err}); trying {}",
                            dialer.peer().pid,
                            dialer.next_name()
                        );
                        dialer.setup_failed(name, &err);
                        self.dial(dialer, conn_id, loc, Some(e))
                    }
                };
                // Sends queued while it connected go out now.
                match r {
                    Ok(_) => {
                        self.progress_tx(e);
                    }
                    Err(err) => self.fail_ep(e, err),
                }
            }
            (AfterSetup::Upgrade { conn_id, pid, loc }, Ok((tx, rx))) => {
                self.upgraded(e, conn_id, pid, loc, tx, rx)
            }
            (AfterSetup::Upgrade { conn_id, loc, .. }, Err(err)) => {
                self.stay_on_link(e, conn_id, loc, name, &err);
            }
        }
    }

    /// A connection to a worker address has its link: announce this side on it (a new
    /// connection), and the endpoint is connected.
    fn finish_connect(
        &mut self,
        e: u32,
        (mut tx, rx): (LinkTx, LinkRx),
        conn_id: u64,
        peer_worker: u64,
        loc: &str,
    ) -> Result<u32> {
        let hdr = Header::wireup(conn_id, purpose::NEW);
        let addr = self.address_bytes.clone();
        send_now(&mut tx, &[hdr.as_bytes(), &addr])?;
        self.ep_install_link(e, tx, rx)?;
        if let Some(ep) = self.ep(e) {
            ep.status = EpStatus::Connected;
            ep.conn_id = conn_id;
            ep.peer_worker = peer_worker;
        }
        self.log_selection(e, loc);
        Ok(e)
    }

    /// Connect to a listener's socket address.
    pub(crate) fn connect_sockaddr(&mut self, sa: SocketAddr, client_id: u64) -> Result<u32> {
        let (mut tx, rx) = dial::connect_socket(sa, &self.cfg)?;
        let hdr = Header::conn_req(client_id);
        let addr = self.address_bytes.clone();
        send_now(&mut tx, &[hdr.as_bytes(), &addr])?;
        let e = self.ep_alloc(sa.to_string());
        self.ep_install_link(e, tx, rx)?;
        Ok(e)
    }

    /// Client side: the server accepted.
    pub(crate) fn on_conn_accept(&mut self, e: u32, conn_id: u64, address: &[u8]) {
        let server = match WorkerAddress::unpack(address) {
            Ok(a) => a,
            Err(err) => {
                return self.fail_ep(
                    e,
                    Error::msg(
                        Status::ProtocolError,
                        format!("server sent a bad worker address: {err}"),
                    ),
                );
            }
        };
        let Some(ep) = self.ep(e) else { return };
        if ep.status != EpStatus::Connecting {
            return self.fail_ep(
                e,
                Error::new(Status::ProtocolError, "unexpected connection accept"),
            );
        }
        ep.conn_id = conn_id;
        ep.peer_worker = server.worker_id;
        let loc = locality(&server, self.worker_id);
        if dial::upgrade_possible(&server, &self.address) {
            match dial::upgrade_start(&server, &self.cfg) {
                Ok(conn) => {
                    // Stays connecting on its link until the acceptor's worker answers.
                    let pid = server.pid;
                    self.await_setup(e, conn, AfterSetup::Upgrade { conn_id, pid, loc });
                }
                Err(err) => {
                    self.stay_on_link(e, conn_id, loc, dial::UPGRADE, &err);
                }
            }
            return;
        }
        self.listener_link_connected(e, loc);
    }

    /// The upgrade's link is set up: announce it on the link, keep the listener's link
    /// beside it, and the endpoint is connected.
    fn upgraded(&mut self, e: u32, conn_id: u64, pid: u32, loc: &str, mut tx: LinkTx, rx: LinkRx) {
        let hdr = Header::wireup(conn_id, purpose::UPGRADE);
        let addr = self.address_bytes.clone();
        if let Err(err) = send_now(&mut tx, &[hdr.as_bytes(), &addr]) {
            return self.fail_ep(e, err);
        }
        let old = self.ep_take_link(e);
        let name = tx.caps().name;
        if let Some(ep) = self.ep(e) {
            ep.old = old;
            ep.peer = format!("pid {pid} ({name})");
        }
        if let Err(err) = self.ep_install_link(e, tx, rx) {
            return self.fail_ep(e, err);
        }
        self.set_connected(e, loc);
    }

    /// The upgrade (to transport `name`) failed (`why`): say so in the log, tell the
    /// server, and go on over the link the connection came on.
    fn stay_on_link(&mut self, e: u32, conn_id: u64, loc: &str, name: &str, why: &Error) {
        let link = self.ep_transport(e).unwrap_or("its link");
        tracing::info!("{name} to listener's worker failed ({why}); staying on {link}");
        let hdr = Header::wireup(conn_id, purpose::NO_UPGRADE);
        if let Some(tx) = self.ep(e).and_then(|ep| ep.tx.as_mut()) {
            if let Err(err) = send_now(tx, &[hdr.as_bytes()]) {
                return self.fail_ep(e, err);
            }
        }
        self.listener_link_connected(e, loc);
    }

    /// Whether `COURIER_TLS` allows the transport of `e`'s link (a listener's connection,
    /// which came on a link of the listener's transport whatever the selection says).
    fn link_allowed(&mut self, e: u32) -> bool {
        match self.ep_transport(e) {
            Some(name) => self.cfg.tls.allows(name),
            None => true,
        }
    }

    /// A listener's connection goes on over the link it came on, if its transport is
    /// allowed.
    fn listener_link_connected(&mut self, e: u32, loc: &str) {
        if !self.link_allowed(e) {
            return self.fail_ep(
                e,
                Error::msg(Status::Unreachable, format!("the server is not reachable by shared memory and tcp is excluded by COURIER_TLS={}", self.cfg.tls.spec)),
            );
        }
        self.set_connected(e, loc);
    }

    fn set_connected(&mut self, e: u32, loc: &str) {
        if let Some(ep) = self.ep(e) {
            ep.status = EpStatus::Connected;
        }
        self.log_selection(e, loc);
        self.progress_tx(e);
    }

    /// Server side: a wireup frame on an endpoint's own link.
    pub(crate) fn on_wireup_in_band(&mut self, e: u32, purpose: u32) {
        let connecting = self
            .ep(e)
            .is_some_and(|ep| ep.status == EpStatus::Connecting);
        if purpose == purpose::NO_UPGRADE && connecting {
            if !self.link_allowed(e) {
                return self.fail_ep(
                    e,
                    Error::new(
                        Status::Unreachable,
                        "client could not use shared memory and tcp is excluded by COURIER_TLS",
                    ),
                );
            }
            self.set_connected(e, "intra-node");
        } else {
            self.fail_ep(
                e,
                Error::new(Status::ProtocolError, "unexpected wireup frame"),
            );
        }
    }

    // ----- listeners and accepted connections -------------------------------------------

    pub(crate) fn listener_add(
        &mut self,
        sa: SocketAddr,
        handler: ConnHandler,
    ) -> Result<(u32, SocketAddr)> {
        let l = SocketListener::bind(sa, &self.cfg)?;
        let bound = l.local_addr();
        let idx = match self.listeners.free.pop() {
            Some(i) => i,
            None => {
                self.listeners.slots.push(ListenerSlot {
                    live: false,
                    generation: 0,
                    socket: l,
                    handler: None,
                });
                let i = (self.listeners.slots.len() - 1) as u32;
                let s = &mut self.listeners.slots[i as usize];
                s.live = true;
                s.handler = Some(handler);
                epoll::add(
                    &self.epoll,
                    s.socket.fd(),
                    epoll::EventData::new_u64(token::make(token::LISTENER, i)),
                    epoll::EventFlags::IN,
                )
                .map_err(|e| Error::io("epoll add", e))?;
                return Ok((i, bound));
            }
        };
        let s = &mut self.listeners.slots[idx as usize];
        *s = ListenerSlot {
            live: true,
            generation: s.generation.wrapping_add(1),
            socket: l,
            handler: Some(handler),
        };
        epoll::add(
            &self.epoll,
            s.socket.fd(),
            epoll::EventData::new_u64(token::make(token::LISTENER, idx)),
            epoll::EventFlags::IN,
        )
        .map_err(|e| Error::io("epoll add", e))?;
        Ok((idx, bound))
    }

    pub(crate) fn listener_remove(&mut self, idx: u32) {
        if let Some(s) = self.listeners.slots.get_mut(idx as usize) {
            if s.live {
                let _ = epoll::delete(&self.epoll, s.socket.fd());
                s.live = false;
                s.handler = None;
                // Close the socket now by replacing it with a closed placeholder.
                if let Ok(l) = SocketListener::bind(
                    "127.0.0.1:0"
                        .parse()
                        .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))),
                    &self.cfg,
                ) {
                    s.socket = l;
                }
                self.listeners.free.push(idx);
            }
        }
    }

    fn pending_add(&mut self, tx: LinkTx, rx: LinkRx, listener: Option<u32>, peer: String) {
        let conn = PendingConn {
            live: true,
            generation: 0,
            tx: Some(tx),
            rx: Some(rx),
            listener,
            peer,
            since: Instant::now(),
            offered: false,
            client_id: 0,
            client_addr: None,
        };
        let idx = match self.pending_conns.free.pop() {
            Some(i) => {
                let s = &mut self.pending_conns.slots[i as usize];
                let generation = s.generation.wrapping_add(1);
                *s = PendingConn { generation, ..conn };
                i
            }
            None => {
                self.pending_conns.slots.push(conn);
                (self.pending_conns.slots.len() - 1) as u32
            }
        };
        if let Some(fd) = self.pending_conns.slots[idx as usize]
            .rx
            .as_ref()
            .and_then(|r| r.fd())
        {
            let _ = epoll::add(
                &self.epoll,
                fd,
                epoll::EventData::new_u64(token::make(token::PENDING, idx)),
                epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
            );
        }
    }

    fn pending_drop(&mut self, idx: u32, why: Option<String>) {
        let epfd = &self.epoll;
        if let Some(p) = self.pending_conns.slots.get_mut(idx as usize) {
            if !p.live {
                return;
            }
            if let Some(fd) = p.rx.as_ref().and_then(|r| r.fd()) {
                let _ = epoll::delete(epfd, fd);
            }
            if let Some(why) = why {
                tracing::warn!("dropped connection from {}: {why}", p.peer);
            }
            p.live = false;
            p.tx = None;
            p.rx = None;
            self.pending_conns.free.push(idx);
        }
    }

    /// Accept what the acceptors and listeners have, and read first frames of pending
    /// connections. Returns how many events were handled.
    pub(crate) fn progress_conns(&mut self) -> usize {
        let mut n = 0;
        self.acceptors.expire();
        if !self.setups.is_empty() {
            n += self.progress_setups();
        }
        for i in 0..self.pending_conns.slots.len() as u32 {
            n += self.pending_step(i);
        }
        n
    }

    /// Take the connections waiting on the worker's acceptor `which` (its fd was readable).
    pub(super) fn accept_from(&mut self, which: u32) -> usize {
        let links = self.acceptors.accept(which);
        let n = links.len();
        for (tx, rx, peer) in links {
            self.pending_add(tx, rx, None, peer);
        }
        n
    }

    /// Take the connections waiting on user listener `i`.
    pub(super) fn accept_listener(&mut self, i: u32) -> usize {
        let links = match self.listeners.slots.get_mut(i as usize).filter(|s| s.live) {
            Some(s) => s.socket.accept(),
            None => return 0,
        };
        let n = links.len();
        for (tx, rx, peer) in links {
            self.pending_add(tx, rx, Some(i), peer);
        }
        n
    }

    /// Look at a pending connection's first frame.
    pub(super) fn pending_step(&mut self, i: u32) -> usize {
        let Some(p) = self
            .pending_conns
            .slots
            .get_mut(i as usize)
            .filter(|p| p.live && !p.offered)
        else {
            return 0;
        };
        let Some(rx) = p.rx.as_mut() else { return 0 };
        if let Err(e) = rx.on_readable() {
            let why = e.to_string();
            self.pending_drop(i, Some(why));
            return 1;
        }
        let raw = match rx.peek() {
            Ok(Some(r)) => r,
            Ok(None) => {
                if p.since.elapsed() > WIREUP_TIMEOUT {
                    self.pending_drop(
                        i,
                        Some(format!("no wireup within {}s", WIREUP_TIMEOUT.as_secs())),
                    );
                    return 1;
                }
                return 0;
            }
            Err(e) => {
                self.pending_drop(i, Some(e.to_string()));
                return 1;
            }
        };
        // SAFETY: valid until consume.
        let bytes = unsafe { raw.bytes() };
        let listener = p.listener;
        let peer_s = p.peer.clone();
        let parsed = Frame::parse(bytes);
        let outcome: Result<(), String> = match parsed {
            Ok(Frame::Wireup {
                conn_id,
                purpose,
                address,
            }) if listener.is_none() => {
                let addr = WorkerAddress::unpack(address)
                    .map_err(|e| format!("bad worker address in wireup: {e}"));
                match addr {
                    Err(e) => Err(e),
                    Ok(addr) => {
                        rx.consume();
                        self.adopt(i, conn_id, purpose, addr)
                    }
                }
            }
            Ok(Frame::ConnReq { client_id, address }) if listener.is_some() => {
                match WorkerAddress::unpack(address) {
                    Err(e) => Err(format!("bad worker address in connection request: {e}")),
                    Ok(addr) => {
                        rx.consume();
                        p.offered = true;
                        p.client_id = client_id;
                        p.client_addr = Some(addr);
                        let generation = p.generation;
                        let l = listener.unwrap_or(0);
                        self.deferred.push(Deferred::Conn(
                            l,
                            ConnRequest {
                                pending: i,
                                pending_generation: generation,
                                client_addr: peer_s,
                                client_id,
                            },
                        ));
                        Ok(())
                    }
                }
            }
            Ok(f) => Err(format!("unexpected first frame {:?}", frame_kind(&f))),
            Err(e) => Err(format!("not a Courier wireup: {e}")),
        };
        if let Err(why) = outcome {
            self.pending_drop(i, Some(why));
        }
        1
    }

    /// A pending connection introduced itself with Wireup.
    fn adopt(
        &mut self,
        i: u32,
        conn_id: u64,
        purpose: u32,
        addr: WorkerAddress,
    ) -> Result<(), String> {
        let Some(p) = self.pending_conns.slots.get_mut(i as usize) else {
            return Ok(());
        };
        let (Some(tx), Some(rx)) = (p.tx.take(), p.rx.take()) else {
            return Ok(());
        };
        if let Some(fd) = rx.fd() {
            let _ = epoll::delete(&self.epoll, fd);
        }
        p.live = false;
        let conn_peer = std::mem::take(&mut p.peer);
        self.pending_conns.free.push(i);
        let loc = locality(&addr, self.worker_id);
        // Named by what the kernel says of the connection (the pid of a local process, the
        // address of a tcp peer); the pid a tcp peer gives for itself is only its word.
        let name = tx.caps().name;
        let peer = match tx.peer_pid() {
            Some(pid) => format!("pid {pid} ({name})"),
            None if conn_peer.is_empty() => format!("pid {} ({name})", addr.pid),
            None => format!("{conn_peer} ({name}, pid {})", addr.pid),
        };
        match purpose {
            purpose::NEW => {
                let e = self.ep_alloc(peer);
                self.ep_install_link(e, tx, rx).map_err(|e| e.to_string())?;
                if let Some(ep) = self.ep(e) {
                    ep.status = EpStatus::Connected;
                    ep.conn_id = conn_id;
                    ep.peer_worker = addr.worker_id;
                }
                let g = self.ep(e).map(|ep| ep.generation).unwrap_or(0);
                self.incoming.push_back((e, g));
                self.log_selection(e, loc);
                Ok(())
            }
            purpose::UPGRADE => {
                let found = (0..self.eps.slots.len() as u32).find(|&e| {
                    self.eps.slots[e as usize].live
                        && self.eps.slots[e as usize].conn_id == conn_id
                        && self.eps.slots[e as usize].status == EpStatus::Connecting
                });
                let Some(e) = found else {
                    return Err(format!("upgrade for unknown connection {conn_id:#x}"));
                };
                // The server closes its side of the TCP link; the client keeps its own
                // (unwatched) until the endpoint goes, so the server never mistakes the
                // switch for a failure while the upgrade is still on its way.
                drop(self.ep_take_link(e));
                if let Some(ep) = self.ep(e) {
                    ep.peer = peer;
                }
                self.ep_install_link(e, tx, rx).map_err(|e| e.to_string())?;
                self.set_connected(e, loc);
                Ok(())
            }
            other => Err(format!("unknown wireup purpose {other}")),
        }
    }

    /// The listener's handler accepted a connection request.
    pub(crate) fn conn_accept(&mut self, req: &ConnRequest) -> Result<u32> {
        let p = self
            .pending_conns
            .slots
            .get_mut(req.pending as usize)
            .filter(|p| p.live && p.generation == req.pending_generation && p.offered)
            .ok_or_else(|| {
                Error::new(
                    Status::InvalidParam,
                    "connection request already answered or gone",
                )
            })?;
        let (Some(mut tx), Some(rx)) = (p.tx.take(), p.rx.take()) else {
            return Err(Error::new(
                Status::InvalidParam,
                "connection request already answered",
            ));
        };
        let client = p.client_addr.take();
        let peer = p.peer.clone();
        if let Some(fd) = rx.fd() {
            let _ = epoll::delete(&self.epoll, fd);
        }
        p.live = false;
        self.pending_conns.free.push(req.pending);
        let conn_id = random_u64();
        let hdr = Header::conn_accept(conn_id);
        let addr = self.address_bytes.clone();
        send_now(&mut tx, &[hdr.as_bytes(), &addr])?;
        let e = self.ep_alloc(peer);
        self.ep_install_link(e, tx, rx)?;
        let (upgrade, loc) = match &client {
            Some(c) => (
                dial::upgrade_possible(c, &self.address),
                locality(c, self.worker_id),
            ),
            None => (false, "inter-node"),
        };
        if let Some(ep) = self.ep(e) {
            ep.conn_id = conn_id;
            ep.peer_worker = client.as_ref().map(|c| c.worker_id).unwrap_or(0);
        }
        if !upgrade {
            if !self.link_allowed(e) {
                self.fail_ep(e, Error::new(Status::Unreachable, "client is not reachable by shared memory and tcp is excluded by COURIER_TLS"));
                return Ok(e);
            }
            self.set_connected(e, loc);
        }
        Ok(e)
    }

    /// The listener's handler rejected a connection request.
    pub(crate) fn conn_reject(&mut self, req: &ConnRequest) {
        let Some(p) = self
            .pending_conns
            .slots
            .get_mut(req.pending as usize)
            .filter(|p| p.live && p.generation == req.pending_generation)
        else {
            return;
        };
        if let Some(tx) = p.tx.as_mut() {
            let _ = send_now(tx, &[Header::bare(Kind::ConnReject).as_bytes()]);
            let _ = tx.flush();
        }
        self.pending_drop(req.pending, None);
    }
}

fn frame_kind(f: &Frame<'_>) -> &'static str {
    match f {
        Frame::Wireup { .. } => "wireup",
        Frame::ConnReq { .. } => "connection request",
        _ => "data frame",
    }
}

/// Send a control frame now, waiting briefly for room (wireup only, never on the data path).
fn send_now(tx: &mut LinkTx, parts: &[&[u8]]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match tx.send(parts) {
            Ok(()) => {
                let _ = tx.flush();
                return Ok(());
            }
            Err(crate::transport::TxError::NoResource) if Instant::now() < deadline => {
                std::thread::yield_now()
            }
            Err(crate::transport::TxError::NoResource) => {
                return Err(Error::new(
                    Status::Timeout,
                    "link stayed full during wireup",
                ));
            }
            Err(crate::transport::TxError::Failed(e)) => return Err(e),
        }
    }
}
