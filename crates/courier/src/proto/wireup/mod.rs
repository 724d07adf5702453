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
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use rustix::event::epoll;

use super::endpoint::EpStatus;
use super::fdpoll::token;
use super::{Slab, State};
use crate::base::sys::{host_id, pid, random_u64};
use crate::base::{Config, Error, Result, Status};
use crate::transport::dial::{self, Acceptors, Connecting, Dialed, Dialer};
use crate::transport::{LinkRx, LinkTx};
use crate::wire::address::WorkerAddress;
use crate::wire::frame::Header;

mod auth;
mod listen;

use auth::AfterAuth;
pub(crate) use auth::{AuthSetup, PendingAuth};
pub use listen::ConnRequest;
pub(crate) use listen::{ListenerSlot, PendingConn};

/// Wireup purposes.
pub(crate) mod purpose {
    pub const NEW: u32 = 0;
    pub const UPGRADE: u32 = 1;
    pub const NO_UPGRADE: u32 = 2;
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

/// Wireup's worker-wide state.
pub(crate) struct WireupState {
    /// The context's name, for log lines.
    pub(crate) ctx_name: String,
    /// This worker's id (in its address).
    pub(crate) worker_id: u64,
    /// This worker's address, and packed.
    pub(crate) address: WorkerAddress,
    pub(crate) address_bytes: Vec<u8>,
    /// The worker's acceptors (one per transport that peers reach by worker address).
    pub(crate) acceptors: Acceptors,
    /// User listeners.
    pub(crate) listeners: Slab<ListenerSlot>,
    /// Connections accepted and waiting for their first frame or their handler's answer.
    pub(crate) pending_conns: Slab<PendingConn>,
    /// Links this side is setting up over several steps (their acceptors' replies awaited).
    pub(crate) setups: Vec<LinkSetup>,
    /// Links this side opened whose authentication handshake is under way.
    pub(crate) auths: Vec<AuthSetup>,
    /// Endpoints peers created to this worker, not yet taken by the application.
    pub(crate) incoming: VecDeque<(u32, u32)>,
    /// Why transports are not usable by this worker.
    pub(crate) excluded: Vec<String>,
    /// The endpoint configurations already logged.
    pub(crate) ep_configs: Vec<String>,
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

impl WireupState {
    /// This worker's wireup: its id and address, and the acceptors `cfg` allows, each
    /// registered in `epoll`; the transports left out and why.
    pub(super) fn open(cfg: &Config, ctx_name: String, epoll: &OwnedFd) -> Result<WireupState> {
        let worker_id = random_u64();
        if cfg.auth == crate::base::auth::AuthMode::Off {
            tracing::warn!(
                "{ctx_name}: COURIER_AUTH=off: this worker accepts unauthenticated connections from any host that can reach it; use it on trusted networks only"
            );
        }
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
            max_frame_k: (cfg.limits.max_frame >> 10) as u16,
        };
        let acceptors = Acceptors::open(cfg, &mut excluded, &mut address, |fd, which| {
            epoll::add(
                epoll,
                fd,
                epoll::EventData::new_u64(token::make(token::ACCEPT, which)),
                epoll::EventFlags::IN,
            )
            .map_err(|e| Error::io("epoll add", e))
        })?;
        Ok(WireupState {
            ctx_name,
            worker_id,
            address_bytes: address.pack(),
            address,
            acceptors,
            listeners: Slab::default(),
            pending_conns: Slab::default(),
            setups: Vec::new(),
            auths: Vec::new(),
            incoming: VecDeque::new(),
            excluded,
            ep_configs: Vec::new(),
        })
    }
}

impl State {
    /// This worker's address, packed, for peers to connect to.
    pub(crate) fn address_bytes(&self) -> &[u8] {
        &self.wireup.address_bytes
    }

    /// Why transports are not usable by this worker (excluded, unavailable).
    pub(crate) fn excluded(&self) -> &[String] {
        &self.wireup.excluded
    }

    /// The next endpoint a peer opened to this worker by its address, not yet taken.
    pub(crate) fn take_incoming(&mut self) -> Option<(u32, u32)> {
        while let Some((idx, generation)) = self.wireup.incoming.pop_front() {
            if self.ep_is(idx, generation) {
                if let Some(ep) = self.ep(idx) {
                    ep.spent.owned = true;
                }
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
        let n = match self.wireup.ep_configs.iter().position(|k| *k == key) {
            Some(n) => n,
            None => {
                self.wireup.ep_configs.push(key.clone());
                let n = self.wireup.ep_configs.len() - 1;
                let (loc, rest) = key.split_once(' ').unwrap_or((&key, ""));
                tracing::info!("{} {loc} cfg#{n} {rest}", self.wireup.ctx_name);
                for why in &self.wireup.excluded {
                    tracing::info!("{} cfg#{n}: {why}", self.wireup.ctx_name);
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
        let loc = locality(&peer, self.wireup.worker_id);
        let same_worker = peer.worker_id == self.wireup.worker_id;
        let max_frame_k = peer.max_frame_k;
        let dialer = Box::new(Dialer::new(peer, same_worker));
        let conn_id = random_u64();
        let e = self.dial(dialer, conn_id, loc, None)?;
        self.ep_set_peer_max_frame(e, max_frame_k);
        Ok(e)
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
                    // Both ends are this worker, which accepts what its own limit says.
                    self.ep_set_peer_max_frame(e, self.wireup.address.max_frame_k);
                    self.ep_install_link(e, tx, rx)?;
                    let me = self.wireup.worker_id;
                    if let Some(ep) = self.ep(e) {
                        ep.status = EpStatus::Connected;
                        ep.peer_worker = me;
                    }
                }
                let pg = self.ep(p).map(|ep| ep.generation).unwrap_or(0);
                self.wireup.incoming.push_back((p, pg));
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
                            ep.peer = reached.clone();
                        }
                        e
                    }
                    None => self.ep_alloc(reached.clone()),
                };
                let then = AfterAuth::New {
                    conn_id,
                    peer_worker: dialer.peer().worker_id,
                    loc,
                };
                self.auth_link(e, (tx, rx), then, format!("worker pid {pid} at {reached}"))?;
                Ok(e)
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
            &self.progress.epoll,
            conn.fd(),
            epoll::EventData::new_u64(token::make(token::SETUP, 0)),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
        )
        .is_ok();
        self.wireup.setups.push(LinkSetup {
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
        while i < self.wireup.setups.len() {
            let c = &mut self.wireup.setups[i];
            let gone = self.eps.slots.get(c.e as usize).is_none_or(|ep| {
                !ep.live || ep.generation != c.generation || ep.status != EpStatus::Connecting
            });
            let polled = if gone { Ok(true) } else { c.conn.poll() };
            if let Ok(false) = polled {
                i += 1;
                continue;
            }
            let c = self.wireup.setups.swap_remove(i);
            n += 1;
            if c.watched {
                // Before the socket becomes the link's, which may watch it under its own
                // token.
                let _ = epoll::delete(&self.progress.epoll, c.conn.fd());
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
                        let pid = dialer.peer().pid;
                        let then = AfterAuth::New {
                            conn_id,
                            peer_worker: dialer.peer().worker_id,
                            loc,
                        };
                        let peer = format!("worker pid {pid} ({name})");
                        self.auth_link(e, link, then, peer).map(|_| e)
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
            (AfterSetup::Upgrade { conn_id, pid, loc }, Ok(link)) => {
                let then = AfterAuth::Upgrade { conn_id, pid, loc };
                let peer = format!("worker pid {pid} ({name})");
                if let Err(err) = self.auth_link(e, link, then, peer) {
                    self.stay_on_link(e, conn_id, loc, name, &err);
                }
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
        let addr = self.wireup.address_bytes.clone();
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
        let link = dial::connect_socket(sa, &self.cfg)?;
        let e = self.ep_alloc(sa.to_string());
        let then = AfterAuth::Listener { client_id };
        self.auth_link(e, link, then, format!("listener {sa}"))?;
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
        self.ep_set_peer_max_frame(e, server.max_frame_k);
        let loc = locality(&server, self.wireup.worker_id);
        if dial::upgrade_possible(&server, &self.wireup.address) {
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
        let addr = self.wireup.address_bytes.clone();
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
