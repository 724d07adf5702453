//! The listener flow and connections accepted by the worker's acceptors: listeners on
//! socket addresses, connections waiting for their first frame (a connection request or a
//! wireup), the handler's answer (accept, reject), and the endpoints they become.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rustix::event::epoll;

use super::{locality, purpose, send_now};
use crate::base::sys::random_u64;
use crate::base::{Error, Result, Status};
use crate::proto::State;
use crate::proto::endpoint::EpStatus;
use crate::proto::fdpoll::token;
use crate::transport::dial::{self, SocketListener};
use crate::transport::{LinkRx, LinkTx};
use crate::wire::address::WorkerAddress;
use crate::wire::frame::{Frame, Header, Kind};

pub(crate) struct ListenerSlot {
    pub(in crate::proto) live: bool,
    pub(in crate::proto) generation: u32,
    pub(in crate::proto) socket: SocketListener,
    pub(in crate::proto) handler: Option<ConnHandler>,
}

pub(crate) struct PendingConn {
    pub(in crate::proto) live: bool,
    pub(in crate::proto) generation: u32,
    pub(in crate::proto) tx: Option<LinkTx>,
    pub(in crate::proto) rx: Option<LinkRx>,
    /// Which user listener accepted it (None: the worker's own acceptors).
    pub(in crate::proto) listener: Option<u32>,
    pub(in crate::proto) peer: String,
    pub(in crate::proto) since: Instant,
    /// The connection handler has it and has not answered yet.
    pub(in crate::proto) offered: bool,
    pub(in crate::proto) client_id: u64,
    pub(in crate::proto) client_addr: Option<WorkerAddress>,
    /// Where its authentication stands: no frame reaches the protocol before it passed.
    pub(in crate::proto) auth: super::PendingAuth,
}

/// A listener's connection handler.
pub type ConnHandler = Box<dyn FnMut(ConnRequest) + Send>;

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

/// How long an accepted connection may take to say who it is.
const WIREUP_TIMEOUT: Duration = Duration::from_secs(10);

fn frame_kind(f: &Frame<'_>) -> &'static str {
    match f {
        Frame::Wireup { .. } => "wireup",
        Frame::ConnReq { .. } => "connection request",
        _ => "data frame",
    }
}

impl State {
    pub(crate) fn listener_add(
        &mut self,
        sa: SocketAddr,
        handler: ConnHandler,
    ) -> Result<(u32, SocketAddr)> {
        let l = SocketListener::bind(sa, &self.cfg)?;
        let bound = l.local_addr();
        let idx = match self.wireup.listeners.free.pop() {
            Some(i) => i,
            None => {
                self.wireup.listeners.slots.push(ListenerSlot {
                    live: false,
                    generation: 0,
                    socket: l,
                    handler: None,
                });
                let i = (self.wireup.listeners.slots.len() - 1) as u32;
                let s = &mut self.wireup.listeners.slots[i as usize];
                s.live = true;
                s.handler = Some(handler);
                epoll::add(
                    &self.progress.epoll,
                    s.socket.fd(),
                    epoll::EventData::new_u64(token::make(token::LISTENER, i)),
                    epoll::EventFlags::IN,
                )
                .map_err(|e| Error::io("epoll add", e))?;
                return Ok((i, bound));
            }
        };
        let s = &mut self.wireup.listeners.slots[idx as usize];
        *s = ListenerSlot {
            live: true,
            generation: s.generation.wrapping_add(1),
            socket: l,
            handler: Some(handler),
        };
        epoll::add(
            &self.progress.epoll,
            s.socket.fd(),
            epoll::EventData::new_u64(token::make(token::LISTENER, idx)),
            epoll::EventFlags::IN,
        )
        .map_err(|e| Error::io("epoll add", e))?;
        Ok((idx, bound))
    }

    pub(crate) fn listener_remove(&mut self, idx: u32) {
        if let Some(s) = self.wireup.listeners.slots.get_mut(idx as usize) {
            if s.live {
                let _ = epoll::delete(&self.progress.epoll, s.socket.fd());
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
                self.wireup.listeners.free.push(idx);
            }
        }
    }

    fn pending_add(&mut self, tx: LinkTx, rx: LinkRx, listener: Option<u32>, peer: String) {
        // Limits (`limits.rs`): endpoints peers' connections made, connections in setup.
        if let Err(why) = self.accept_allowed(listener) {
            self.warn_peer(&format!("refused a connection from {peer}: {why}"));
            return;
        }
        self.make_room_for_conn();
        if !tx.caps().data_via_fd {
            self.limits.polled_conns += 1;
        }
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
            auth: super::PendingAuth::Fresh,
        };
        let idx = match self.wireup.pending_conns.free.pop() {
            Some(i) => {
                let s = &mut self.wireup.pending_conns.slots[i as usize];
                let generation = s.generation.wrapping_add(1);
                *s = PendingConn { generation, ..conn };
                i
            }
            None => {
                self.wireup.pending_conns.slots.push(conn);
                (self.wireup.pending_conns.slots.len() - 1) as u32
            }
        };
        if let Some(fd) = self.wireup.pending_conns.slots[idx as usize]
            .rx
            .as_ref()
            .and_then(|r| r.fd())
        {
            let _ = epoll::add(
                &self.progress.epoll,
                fd,
                epoll::EventData::new_u64(token::make(token::PENDING, idx)),
                epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
            );
        }
    }

    pub(crate) fn pending_drop(&mut self, idx: u32, why: Option<String>) {
        let epfd = &self.progress.epoll;
        if let Some(p) = self.wireup.pending_conns.slots.get_mut(idx as usize) {
            if !p.live {
                return;
            }
            if let Some(fd) = p.rx.as_ref().and_then(|r| r.fd()) {
                let _ = epoll::delete(epfd, fd);
            }
            let what = why.map(|why| format!("dropped connection from {}: {why}", p.peer));
            p.live = false;
            p.tx = None;
            p.rx = None;
            self.wireup.pending_conns.free.push(idx);
            if let Some(what) = what {
                self.warn_peer(&what);
            }
        }
    }

    /// Accept what the acceptors and listeners have, and read first frames of pending
    /// connections. Returns how many events were handled.
    pub(crate) fn progress_conns(&mut self) -> usize {
        let mut n = 0;
        self.wireup.acceptors.expire();
        if !self.wireup.setups.is_empty() {
            n += self.progress_setups();
        }
        if !self.wireup.auths.is_empty() {
            n += self.progress_auths();
        }
        n + self.step_conns_in_setup()
    }

    /// Take the connections waiting on the worker's acceptor `which` (its fd was readable).
    pub(crate) fn accept_from(&mut self, which: u32) -> usize {
        let links = self.wireup.acceptors.accept(which);
        let n = links.len();
        for (tx, rx, peer) in links {
            self.pending_add(tx, rx, None, peer);
        }
        n
    }

    /// Take the connections waiting on user listener `i`.
    pub(crate) fn accept_listener(&mut self, i: u32) -> usize {
        let links = match self
            .wireup
            .listeners
            .slots
            .get_mut(i as usize)
            .filter(|s| s.live)
        {
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
    pub(crate) fn pending_step(&mut self, i: u32) -> usize {
        let Some(p) = self
            .wireup
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
        // A private copy of a shared-memory frame (setup is not per message).
        let mut copy = Vec::new();
        // SAFETY: valid until consume.
        let bytes = unsafe { raw.private_bytes(&mut copy) };
        match self.pending_auth(i, bytes) {
            // The handshake took it: the next frame may be waiting already.
            Ok(true) => return 1 + self.pending_step(i),
            Ok(false) => {}
            Err(why) => {
                self.pending_drop(i, Some(why));
                return 1;
            }
        }
        let Some(p) = self
            .wireup
            .pending_conns
            .slots
            .get_mut(i as usize)
            .filter(|p| p.live && !p.offered)
        else {
            return 1;
        };
        let Some(rx) = p.rx.as_mut() else { return 1 };
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
                        self.defer_conn(
                            l,
                            ConnRequest {
                                pending: i,
                                pending_generation: generation,
                                client_addr: peer_s,
                                client_id,
                            },
                        );
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
        let Some(p) = self.wireup.pending_conns.slots.get_mut(i as usize) else {
            return Ok(());
        };
        let (Some(tx), Some(rx)) = (p.tx.take(), p.rx.take()) else {
            return Ok(());
        };
        if let Some(fd) = rx.fd() {
            let _ = epoll::delete(&self.progress.epoll, fd);
        }
        p.live = false;
        let conn_peer = std::mem::take(&mut p.peer);
        self.wireup.pending_conns.free.push(i);
        let loc = locality(&addr, self.wireup.worker_id);
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
                self.ep_set_peer_max_frame(e, addr.max_frame_k);
                self.ep_install_link(e, tx, rx).map_err(|e| e.to_string())?;
                if let Some(ep) = self.ep(e) {
                    ep.spent.accepted = Some(None);
                    ep.spent.owned = false;
                    ep.status = EpStatus::Connected;
                    ep.conn_id = conn_id;
                    ep.peer_worker = addr.worker_id;
                }
                let g = self.ep(e).map(|ep| ep.generation).unwrap_or(0);
                self.wireup.incoming.push_back((e, g));
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
            .wireup
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
        let listener = p.listener;
        if let Some(fd) = rx.fd() {
            let _ = epoll::delete(&self.progress.epoll, fd);
        }
        p.live = false;
        self.wireup.pending_conns.free.push(req.pending);
        let conn_id = random_u64();
        let hdr = Header::conn_accept(conn_id);
        let addr = self.wireup.address_bytes.clone();
        send_now(&mut tx, &[hdr.as_bytes(), &addr])?;
        let e = self.ep_alloc(peer);
        if let Some(c) = &client {
            self.ep_set_peer_max_frame(e, c.max_frame_k);
        }
        self.ep_install_link(e, tx, rx)?;
        let (upgrade, loc) = match &client {
            Some(c) => (
                dial::upgrade_possible(c, &self.wireup.address),
                locality(c, self.wireup.worker_id),
            ),
            None => (false, "inter-node"),
        };
        if let Some(ep) = self.ep(e) {
            ep.spent.accepted = Some(listener);
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
            .wireup
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
