//! Reaching workers: the acceptors a worker listens on, the transport that reaches a peer
//! worker by its address (in order of preference, each with the reason it was passed over),
//! links set up over several progress calls, and the socket listeners of the listener flow.
//!
//! This is the one place that knows which transport does what in wireup; the protocol
//! layer's wireup drives these steps and never names a transport.

use std::net::SocketAddr;
use std::os::fd::BorrowedFd;

use super::{LinkRx, LinkTx, loopback, shm, tcp};
use crate::base::sys::host_id;
use crate::base::{Config, Error, Result};
use crate::wire::address::WorkerAddress;

/// The acceptors of a worker: one per transport that peers reach by worker address.
pub(crate) struct Acceptors {
    shm: Option<shm::Acceptor>,
    /// One socket on all addresses when every interface is selected, else one per
    /// address of the interfaces `COURIER_NET_DEVICES` selects.
    tcp: Vec<tcp::Listener>,
}

/// Acceptor indices, as `Acceptors::open` registers them and `Acceptors::accept` takes them:
/// shared memory, then the tcp sockets from `TCP` on.
const SHM: u32 = 0;
const TCP: u32 = 1;

impl Acceptors {
    /// Open the acceptors that `cfg` allows and this host supports; each fd is handed to
    /// `watch` with its index (for `accept`). Transports left out are said in `excluded`.
    /// Fills `address` with what peers need to connect to them.
    pub(crate) fn open(
        cfg: &Config,
        excluded: &mut Vec<String>,
        address: &mut WorkerAddress,
        mut watch: impl FnMut(BorrowedFd<'_>, u32) -> Result<()>,
    ) -> Result<Acceptors> {
        let shm_acceptor = if cfg.tls.allows(shm::NAME) {
            match shm::Acceptor::bind(cfg) {
                Ok(a) => {
                    watch(a.fd(), SHM)?;
                    Some(a)
                }
                Err(e) => {
                    excluded.push(format!("{}: unavailable: {e}", shm::NAME));
                    None
                }
            }
        } else {
            None
        };
        let mut tcp_addrs = Vec::new();
        let mut tcp_acceptors = Vec::new();
        if cfg.tls.allows(tcp::NAME) {
            let ifaces = tcp::interfaces(cfg);
            if ifaces.is_empty() {
                let why = match &cfg.net_devices {
                    Some(l) => format!(
                        "no interface that is up matches COURIER_NET_DEVICES={}",
                        l.join(",")
                    ),
                    None => "no network interface is up".into(),
                };
                excluded.push(format!(
                    "tcp: {why}: the worker's address has none for tcp (a connection to a listener's socket address still goes over tcp)"
                ));
            } else if cfg.net_devices.is_none() {
                // Every interface is selected: one socket on all of them.
                let any = SocketAddr::from(([0, 0, 0, 0], 0));
                match tcp::Listener::bind(any, cfg) {
                    Ok(l) => {
                        let port = l.local_addr().port();
                        for (_, ip) in &ifaces {
                            if ip.is_ipv4() {
                                tcp_addrs.push(SocketAddr::new(*ip, port));
                            }
                        }
                        watch(l.fd(), TCP)?;
                        tcp_acceptors.push(l);
                    }
                    Err(e) => excluded.push(format!("tcp: cannot listen: {e}")),
                }
            } else {
                // Only the selected interfaces: a socket bound to each of their addresses,
                // so that nothing arriving on another interface reaches the worker.
                for (name, ip) in ifaces.iter().filter(|(_, ip)| ip.is_ipv4()) {
                    match tcp::Listener::bind(SocketAddr::new(*ip, 0), cfg) {
                        Ok(l) => {
                            tcp_addrs.push(l.local_addr());
                            watch(l.fd(), TCP + tcp_acceptors.len() as u32)?;
                            tcp_acceptors.push(l);
                        }
                        Err(e) => {
                            excluded.push(format!("tcp: cannot listen on {name} ({ip}): {e}"))
                        }
                    }
                }
            }
        }
        address.uds_name = shm_acceptor
            .as_ref()
            .map(|a| a.name().to_vec())
            .unwrap_or_default();
        address.tcp = tcp_addrs;
        Ok(Acceptors {
            shm: shm_acceptor,
            tcp: tcp_acceptors,
        })
    }

    /// Take the connections waiting on acceptor `which` (its fd was readable: an accept on
    /// an empty queue still costs the kernel a socket allocation), each with how to name
    /// its peer.
    pub(crate) fn accept(&mut self, which: u32) -> Vec<(LinkTx, LinkRx, String)> {
        let mut out = Vec::new();
        match which {
            SHM => {
                while let Some(a) = self.shm.as_mut() {
                    match a.accept() {
                        Ok(Some((tx, rx))) => {
                            let peer = format!("local process pid {} (shm)", tx.peer_pid());
                            out.push((LinkTx::Shm(tx), LinkRx::Shm(rx), peer));
                            continue;
                        }
                        Ok(None) => {}
                        Err(e) => tracing::warn!("shm acceptor: {e}"),
                    }
                    break;
                }
            }
            _ => {
                if let Some(l) = which
                    .checked_sub(TCP)
                    .and_then(|k| self.tcp.get_mut(k as usize))
                {
                    accept_tcp(l, &mut out);
                }
            }
        }
        out
    }

    /// Whether an acceptor is in the middle of setting up links (progress must then look
    /// at it every call).
    #[inline]
    pub(crate) fn setting_up(&self) -> bool {
        self.shm.as_ref().is_some_and(|a| a.setting_up())
    }

    /// Give up on setups that took too long.
    pub(crate) fn expire(&mut self) {
        if let Some(a) = self.shm.as_mut() {
            a.expire();
        }
    }
}

/// Take every connection waiting on tcp listener `l` into `out`.
fn accept_tcp(l: &mut tcp::Listener, out: &mut Vec<(LinkTx, LinkRx, String)>) {
    loop {
        match l.accept() {
            Ok(Some((tx, rx, peer))) => {
                out.push((LinkTx::Tcp(tx), LinkRx::Tcp(rx), peer.to_string()));
            }
            Ok(None) => return,
            Err(e) => {
                tracing::warn!("listener accept failed: {e}");
                return;
            }
        }
    }
}

/// A link whose setup takes more than one step (the peer's worker answers as it
/// progresses): poll it until it is ready, then finish it.
pub(crate) enum Connecting {
    /// Shared memory: the acceptor's reply is awaited.
    Shm(shm::Connecting),
}

impl Connecting {
    /// The transport being set up.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Connecting::Shm(_) => shm::NAME,
        }
    }

    /// Whether the setup is ready to finish (`Ok(true)`); an error ends it.
    pub(crate) fn poll(&mut self) -> Result<bool> {
        match self {
            Connecting::Shm(c) => c.poll(),
        }
    }

    /// The fd that becomes readable when the setup may move on.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Connecting::Shm(c) => c.fd(),
        }
    }

    /// The link, once `poll` said it is ready.
    pub(crate) fn finish(self) -> Result<(LinkTx, LinkRx)> {
        match self {
            Connecting::Shm(c) => c
                .finish()
                .map(|(tx, rx)| (LinkTx::Shm(tx), LinkRx::Shm(rx))),
        }
    }
}

/// What one step of dialing a peer worker gave. (Made once per connection and taken apart
/// at once: the size of its variants does not matter.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum Dialed {
    /// The peer is this very worker: both ends of a link (this side's, the passive one).
    Pair((LinkTx, LinkRx), (LinkTx, LinkRx)),
    /// A link being set up (`Connecting`); if it fails, dial on.
    Setup(Connecting),
    /// A connected link, and the peer's address as it reached it.
    Link(LinkTx, LinkRx, String),
    /// No transport reaches the peer; `Dialer::reasons` says why, transport by transport.
    Unreachable,
}

/// The transports that may reach a peer worker by its address, in order of preference
/// (the same worker, then shared memory, then tcp), tried one after another.
pub(crate) struct Dialer {
    peer: Box<WorkerAddress>,
    same_worker: bool,
    /// The next transport to try.
    next: usize,
    /// Why the transports tried so far did not do.
    pub(crate) reasons: Vec<String>,
}

impl Dialer {
    /// Dial `peer`; `same_worker`: it is the dialing worker itself.
    pub(crate) fn new(peer: WorkerAddress, same_worker: bool) -> Dialer {
        Dialer {
            peer: Box::new(peer),
            same_worker,
            next: 0,
            reasons: Vec::new(),
        }
    }

    /// The peer's address.
    pub(crate) fn peer(&self) -> &WorkerAddress {
        &self.peer
    }

    /// The transport a `next` call would try first (for logs).
    pub(crate) fn next_name(&self) -> &'static str {
        [loopback::NAME, shm::NAME, tcp::NAME]
            .get(self.next)
            .copied()
            .unwrap_or("none")
    }

    /// A setup that `next` returned failed: say why, and dial on from the transport after
    /// it (the reasons of the transports before it are dropped: the one that was chosen
    /// says more).
    pub(crate) fn setup_failed(&mut self, name: &str, why: &Error) {
        self.reasons = vec![format!("{name}: {why}")];
    }

    /// Try the transports from where the last call stopped until one gives a link (or a
    /// setup to finish).
    pub(crate) fn next(&mut self, cfg: &Config) -> Dialed {
        while self.next < 3 {
            let step = self.next;
            self.next += 1;
            let got = match step {
                0 => self.try_loopback(cfg),
                1 => self.try_shm(cfg),
                _ => self.try_tcp(cfg),
            };
            if let Some(d) = got {
                return d;
            }
        }
        Dialed::Unreachable
    }

    fn try_loopback(&mut self, cfg: &Config) -> Option<Dialed> {
        if !self.same_worker {
            return None;
        }
        if cfg.tls.allows(loopback::NAME) {
            let ((atx, arx), (ptx, prx)) = loopback::pair();
            return Some(Dialed::Pair(
                (LinkTx::Loopback(atx), LinkRx::Loopback(arx)),
                (LinkTx::Loopback(ptx), LinkRx::Loopback(prx)),
            ));
        }
        self.reasons.push("self: excluded by COURIER_TLS".into());
        None
    }

    fn try_shm(&mut self, cfg: &Config) -> Option<Dialed> {
        let peer = &self.peer;
        if peer.host_id == host_id() && !peer.uds_name.is_empty() && cfg.tls.allows(shm::NAME) {
            match shm::connect_start(&peer.uds_name, cfg) {
                Ok(conn) => return Some(Dialed::Setup(Connecting::Shm(conn))),
                Err(err) => self.reasons.push(format!("shm: {err}")),
            }
        } else if !cfg.tls.allows(shm::NAME) {
            self.reasons
                .push(format!("shm: excluded by COURIER_TLS={}", cfg.tls.spec));
        } else if peer.host_id != host_id() {
            self.reasons.push("shm: peer is on another host".into());
        } else {
            self.reasons
                .push("shm: peer does not offer shared memory".into());
        }
        None
    }

    fn try_tcp(&mut self, cfg: &Config) -> Option<Dialed> {
        if cfg.tls.allows(tcp::NAME) {
            let elsewhere = self.peer.host_id != host_id();
            for sa in &self.peer.tcp {
                // A loopback address of a peer on another host (another machine, or another
                // network namespace of this one) would reach a process here, not the peer.
                if elsewhere && sa.ip().to_canonical().is_loopback() {
                    self.reasons.push(format!(
                        "tcp: {sa} is a loopback address of a peer on another host"
                    ));
                    continue;
                }
                match tcp::connect(*sa, cfg) {
                    Ok((tx, rx)) => {
                        return Some(Dialed::Link(
                            LinkTx::Tcp(tx),
                            LinkRx::Tcp(rx),
                            sa.to_string(),
                        ));
                    }
                    Err(err) => self.reasons.push(format!("tcp: {err}")),
                }
            }
            if self.peer.tcp.is_empty() {
                self.reasons.push("tcp: peer offers no tcp address".into());
            }
        } else {
            self.reasons
                .push(format!("tcp: excluded by COURIER_TLS={}", cfg.tls.spec));
        }
        None
    }
}

/// The transport a listener's connection moves to when it can (`upgrade_start`).
pub(crate) const UPGRADE: &str = shm::NAME;

/// Whether `COURIER_TLS` lets a connection to a same-host peer move to the link that reaches
/// the peer's memory (a remote key unpacked before the move already routes as after it).
pub(crate) fn upgrade_allowed(cfg: &Config) -> bool {
    cfg.tls.allows(UPGRADE)
}

/// Whether two workers of a listener's connection (its link a socket's) can move to a
/// better link: both offer shared memory and share a host.
pub(crate) fn upgrade_possible(a: &WorkerAddress, b: &WorkerAddress) -> bool {
    a.host_id == host_id() && !a.uds_name.is_empty() && !b.uds_name.is_empty()
}

/// Start the better link to `server` of a listener's connection (see `upgrade_possible`,
/// which the caller checked).
pub(crate) fn upgrade_start(server: &WorkerAddress, cfg: &Config) -> Result<Connecting> {
    shm::connect_start(&server.uds_name, cfg).map(Connecting::Shm)
}

/// Connect to a listener's socket address.
pub(crate) fn connect_socket(sa: SocketAddr, cfg: &Config) -> Result<(LinkTx, LinkRx)> {
    let (tx, rx) = tcp::connect(sa, cfg)?;
    Ok((LinkTx::Tcp(tx), LinkRx::Tcp(rx)))
}

/// A listener on a socket address (the listener flow: clients connect by socket address,
/// then may move to a better link).
pub(crate) struct SocketListener {
    l: tcp::Listener,
}

impl SocketListener {
    /// Listen on `sa` (port 0 picks one).
    pub(crate) fn bind(sa: SocketAddr, cfg: &Config) -> Result<SocketListener> {
        Ok(SocketListener {
            l: tcp::Listener::bind(sa, cfg)?,
        })
    }

    /// The bound address.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.l.local_addr()
    }

    /// The fd that becomes readable when a client is waiting.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.l.fd()
    }

    /// Take every waiting client's connection, each with its peer's address.
    pub(crate) fn accept(&mut self) -> Vec<(LinkTx, LinkRx, String)> {
        let mut out = Vec::new();
        accept_tcp(&mut self.l, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer on another host that lists a loopback address (as a worker listening on
    /// every interface does) is never dialed there: that would reach a process of this
    /// host, listening on the same port in this network namespace.
    #[test]
    #[cfg_attr(miri, ignore = "tcp sockets: system calls Miri does not model")]
    fn a_loopback_address_of_another_host_is_not_dialed() {
        let here = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = here.local_addr().unwrap().port();
        let mut other = host_id();
        other[0] ^= 0xff;
        let peer = WorkerAddress {
            worker_id: 1,
            host_id: other,
            pid: 1,
            uds_name: vec![],
            tcp: vec![
                format!("127.0.0.1:{port}").parse().unwrap(),
                format!("[::ffff:127.0.0.1]:{port}").parse().unwrap(),
            ],
            max_frame_k: 0,
        };
        let cfg = Config::from_env_with(&[("COURIER_TLS", "tcp")]).unwrap();
        let mut d = Dialer::new(peer.clone(), false);
        assert!(matches!(d.next(&cfg), Dialed::Unreachable));
        assert_eq!(
            d.reasons
                .iter()
                .filter(|r| r.contains("loopback address of a peer on another host"))
                .count(),
            2,
            "{:?}",
            d.reasons
        );
        // The same address of a peer on this host is dialed.
        let mut same = peer;
        same.host_id = host_id();
        let mut d = Dialer::new(same, false);
        assert!(matches!(d.next(&cfg), Dialed::Link(..)), "{:?}", d.reasons);
    }
}
