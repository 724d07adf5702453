//! Who may connect: the mutual challenge-response handshake on every new link between two
//! workers, run before the link's first wireup frame and before the link is installed, so
//! no frame of an unauthenticated peer reaches the protocol layer. It needs no transport's
//! name: it sends and reads frames of its own (`wire::auth`) on the link.
//!
//! With a key (`COURIER_AUTH_KEY_FILE`, or the job's under `courier run`):
//!
//! ```text
//! initiator                                   acceptor
//!   HELLO(nonce_i)                  ──▶
//!                                   ◀──  CHALLENGE(nonce_a, MAC(acceptor, nonce_i, nonce_a))
//!   checks it; RESPONSE(MAC(initiator, nonce_i, nonce_a)) ──▶   checks it
//!   then the wireup frame (and data) as without authentication
//! ```
//!
//! Each side's nonce is fresh from the kernel, so neither side's proof can be replayed, and
//! the role is in the MAC, so an acceptor's proof reflected back to it fails. A side that
//! finds the other's proof wrong (another key), or a peer that skips the handshake when
//! this side has a key, drops the link with a warning that names the peer and why, and
//! tells the peer why in a `REJECT`.
//!
//! Without a key (`COURIER_AUTH=auto`), a link is accepted only from this host: a same-host
//! memory link (whose acceptor checked the peer's user), or tcp from a loopback address or
//! from this side's own address; a peer from another host is refused with what to do. A
//! listener's connection is the exception: its handler decides (it sees the client's
//! address), as the application asked by listening. `COURIER_AUTH=off` accepts every link
//! (the worker says so once, at `warn`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::epoll;

use super::send_now;
use crate::base::auth::{self, AuthMode, Key, NONCE_LEN, Role};
use crate::base::{Error, Result, Status};
use crate::proto::State;
use crate::proto::endpoint::EpStatus;
use crate::proto::fdpoll::token;
use crate::transport::{LinkRx, LinkTx};
use crate::wire::auth::{AuthMsg, is_auth, reason};
use crate::wire::frame::Header;

/// How long the initiator waits for the acceptor's challenge.
const AUTH_TIMEOUT: Duration = Duration::from_secs(10);

/// What follows the handshake of an initiator's link.
pub(crate) enum AfterAuth {
    /// A connection to a worker address: announce it (`Wireup(NEW)`).
    New {
        conn_id: u64,
        peer_worker: u64,
        loc: &'static str,
    },
    /// The upgrade of a listener's connection: on failure it stays on its first link.
    Upgrade {
        conn_id: u64,
        pid: u32,
        loc: &'static str,
    },
    /// A connection to a listener's socket address: send the connection request.
    Listener { client_id: u64 },
}

/// An initiator's link whose handshake is under way: the acceptor's challenge is awaited.
pub(crate) struct AuthSetup {
    e: u32,
    generation: u32,
    tx: LinkTx,
    rx: LinkRx,
    key: Arc<Key>,
    nonce: [u8; NONCE_LEN],
    since: Instant,
    then: AfterAuth,
    /// The peer, for log lines and errors.
    peer: String,
    /// Its fd is in the worker's epoll set (a sleeping worker wakes for the answer).
    pub(crate) watched: bool,
}

/// Where an accepted connection's handshake stands.
#[derive(Default)]
pub(crate) enum PendingAuth {
    /// Nothing read yet.
    #[default]
    Fresh,
    /// The challenge is sent; the initiator's response is awaited.
    Challenged {
        key: Arc<Key>,
        initiator: [u8; NONCE_LEN],
        acceptor: [u8; NONCE_LEN],
    },
    /// Authenticated, or admitted without (no key: a local peer, a listener's, or `off`).
    Passed,
}

/// A peer's text, made safe to print.
fn shown(text: &[u8]) -> String {
    let s = String::from_utf8_lossy(text);
    let mut out: String = s.chars().take(300).flat_map(char::escape_debug).collect();
    if s.chars().count() > 300 {
        out.push_str("...");
    }
    out
}

/// Tell the peer why its link is refused, without waiting (best effort).
fn reject(tx: &mut LinkTx, code: u32, why: &str) {
    let m = AuthMsg::Reject {
        code,
        text: why.as_bytes(),
    }
    .emit();
    let _ = tx.send(&[&m]);
    let _ = tx.flush();
}

const WE_REQUIRE: &str = "this worker requires authentication: give this process the same key as its peers (COURIER_AUTH_KEY_FILE, or `courier run`'s job key)";
const WE_HAVE_NO_KEY: &str = "this worker has no authentication key (COURIER_AUTH_KEY_FILE unset and not started by `courier run`), so it cannot authenticate: give both sides the same key";

impl State {
    /// The key this worker authenticates with, if any (`COURIER_AUTH=off`: none). The
    /// job's key is looked up at each new link, so a context made before `Job::init` uses
    /// it too.
    pub(crate) fn auth_key(&self) -> Option<Arc<Key>> {
        if self.cfg.auth == AuthMode::Off {
            return None;
        }
        self.cfg.auth_key.clone().or_else(auth::job_key)
    }

    /// An initiator's new link to `peer` for endpoint `e`: authenticate it, then go on as
    /// `then` says. Without a key, a link to another host is refused here (unless `off`).
    /// `Ok` while the handshake is under way (progress finishes it).
    pub(super) fn auth_link(
        &mut self,
        e: u32,
        (mut tx, rx): (LinkTx, LinkRx),
        then: AfterAuth,
        peer: String,
    ) -> Result<()> {
        let Some(key) = self.auth_key() else {
            let listener = matches!(then, AfterAuth::Listener { .. });
            if self.cfg.auth == AuthMode::Auto && !listener && !rx.peer_on_this_host(&tx) {
                return Err(Error::msg(
                    Status::AccessDenied,
                    format!("refusing to connect to {peer}: {}", auth::HOW_TO_GIVE_A_KEY),
                ));
            }
            return self.authenticated(e, tx, rx, then);
        };
        let nonce = auth::nonce()?;
        send_now(&mut tx, &[&AuthMsg::Hello { nonce }.emit()])?;
        let generation = self.ep(e).map(|ep| ep.generation).unwrap_or(0);
        let watched = rx.fd().is_some_and(|fd| {
            epoll::add(
                &self.progress.epoll,
                fd,
                epoll::EventData::new_u64(token::make(token::SETUP, 0)),
                epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
            )
            .is_ok()
        });
        self.wireup.auths.push(AuthSetup {
            e,
            generation,
            tx,
            rx,
            key,
            nonce,
            since: Instant::now(),
            then,
            peer,
            watched,
        });
        Ok(())
    }

    /// The link of `e` is authenticated (or admitted without): go on as `then` says.
    fn authenticated(&mut self, e: u32, tx: LinkTx, rx: LinkRx, then: AfterAuth) -> Result<()> {
        match then {
            AfterAuth::New {
                conn_id,
                peer_worker,
                loc,
            } => self
                .finish_connect(e, (tx, rx), conn_id, peer_worker, loc)
                .map(|_| ()),
            AfterAuth::Upgrade { conn_id, pid, loc } => {
                self.upgraded(e, conn_id, pid, loc, tx, rx);
                Ok(())
            }
            AfterAuth::Listener { client_id } => {
                let mut tx = tx;
                let hdr = Header::conn_req(client_id);
                let addr = self.wireup.address_bytes.clone();
                send_now(&mut tx, &[hdr.as_bytes(), &addr])?;
                self.ep_install_link(e, tx, rx)
            }
        }
    }

    /// Move the initiators' handshakes on. Returns how many ended.
    pub(crate) fn progress_auths(&mut self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < self.wireup.auths.len() {
            let a = &mut self.wireup.auths[i];
            let gone = self.eps.slots.get(a.e as usize).is_none_or(|ep| {
                !ep.live || ep.generation != a.generation || ep.status != EpStatus::Connecting
            });
            let step = if gone { Ok(true) } else { auth_step(a) };
            if let Ok(false) = step {
                i += 1;
                continue;
            }
            let a = self.wireup.auths.swap_remove(i);
            n += 1;
            if a.watched {
                if let Some(fd) = a.rx.fd() {
                    let _ = epoll::delete(&self.progress.epoll, fd);
                }
            }
            if gone {
                continue;
            }
            let AuthSetup {
                e, tx, rx, then, ..
            } = a;
            let upgrade = match &then {
                AfterAuth::Upgrade { conn_id, loc, .. } => Some((*conn_id, *loc)),
                _ => None,
            };
            match step.and_then(|_| self.authenticated(e, tx, rx, then)) {
                Ok(()) => {
                    self.progress_tx(e);
                }
                Err(err) => {
                    tracing::warn!("{}: {err}", self.wireup.ctx_name);
                    self.auth_failed(e, err, upgrade)
                }
            }
        }
        n
    }

    /// An initiator's handshake failed: the endpoint fails (an upgrade stays on its link).
    fn auth_failed(&mut self, e: u32, err: Error, upgrade: Option<(u64, &'static str)>) {
        match upgrade {
            Some((conn_id, loc)) => {
                self.stay_on_link(e, conn_id, loc, crate::transport::dial::UPGRADE, &err)
            }
            None => self.fail_ep(e, err),
        }
    }

    /// Whether the initiators' handshakes let the worker sleep: each link armed, each fd
    /// watched.
    pub(crate) fn arm_auths(&mut self) -> Result<bool> {
        for a in &mut self.wireup.auths {
            if !a.watched || !a.rx.arm()? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// An accepted connection's frame `bytes` (not consumed) before it is authenticated:
    /// `Ok(true)` when the handshake took it (consumed), `Ok(false)` when the connection is
    /// admitted and `bytes` is its first protocol frame, `Err(why)` to drop it.
    pub(super) fn pending_auth(&mut self, i: u32, bytes: &[u8]) -> Result<bool, String> {
        let key = self.auth_key();
        let mode = self.cfg.auth;
        let Some(p) = self
            .wireup
            .pending_conns
            .slots
            .get_mut(i as usize)
            .filter(|p| p.live)
        else {
            return Ok(false);
        };
        let (Some(tx), Some(rx)) = (p.tx.as_mut(), p.rx.as_mut()) else {
            return Ok(false);
        };
        match &p.auth {
            PendingAuth::Passed => Ok(false),
            PendingAuth::Fresh if is_auth(bytes) => match (AuthMsg::parse(bytes), key) {
                (Ok(AuthMsg::Hello { nonce }), Some(key)) => {
                    let mine = auth::nonce().map_err(|e| e.to_string())?;
                    let proof = key.proof(Role::Acceptor, &nonce, &mine);
                    rx.consume();
                    let m = AuthMsg::Challenge { nonce: mine, proof }.emit();
                    send_now(tx, &[&m]).map_err(|e| format!("sending the challenge: {e}"))?;
                    p.auth = PendingAuth::Challenged {
                        key,
                        initiator: nonce,
                        acceptor: mine,
                    };
                    Ok(true)
                }
                (Ok(AuthMsg::Hello { .. }), None) => {
                    reject(tx, reason::NO_KEY, WE_HAVE_NO_KEY);
                    Err(format!("it asked to authenticate, but {WE_HAVE_NO_KEY}"))
                }
                (Ok(AuthMsg::Reject { text, .. }), _) => {
                    Err(format!("it refused the connection: {}", shown(text)))
                }
                (Ok(_), _) => {
                    reject(tx, reason::PROTOCOL, "authentication message out of order");
                    Err("authentication message out of order (expected a hello)".into())
                }
                (Err(e), _) => {
                    reject(tx, reason::PROTOCOL, "malformed authentication message");
                    Err(format!("malformed authentication message: {e}"))
                }
            },
            PendingAuth::Fresh => {
                if key.is_some() {
                    reject(tx, reason::AUTH_REQUIRED, WE_REQUIRE);
                    return Err(format!("it did not authenticate, and {WE_REQUIRE}"));
                }
                let admitted =
                    mode == AuthMode::Off || p.listener.is_some() || rx.peer_on_this_host(tx);
                if !admitted {
                    reject(tx, reason::AUTH_REQUIRED, auth::HOW_TO_GIVE_A_KEY);
                    return Err(format!(
                        "it is on another host and did not authenticate: {}",
                        auth::HOW_TO_GIVE_A_KEY
                    ));
                }
                p.auth = PendingAuth::Passed;
                Ok(false)
            }
            PendingAuth::Challenged {
                key,
                initiator,
                acceptor,
            } => match AuthMsg::parse(bytes) {
                Ok(AuthMsg::Response { proof }) => {
                    if key.verify(Role::Initiator, initiator, acceptor, &proof) {
                        rx.consume();
                        p.auth = PendingAuth::Passed;
                        Ok(true)
                    } else {
                        reject(
                            tx,
                            reason::BAD_PROOF,
                            "authentication failed: your proof does not match this worker's key (another key?)",
                        );
                        Err("authentication failed: its proof does not match this worker's key (another key?)".into())
                    }
                }
                Ok(AuthMsg::Reject { text, .. }) => {
                    Err(format!("it refused this worker's proof: {}", shown(text)))
                }
                Ok(_) => {
                    reject(tx, reason::PROTOCOL, "expected the authentication response");
                    Err("authentication: expected its response, got another message".into())
                }
                Err(e) => {
                    reject(tx, reason::PROTOCOL, "expected the authentication response");
                    Err(format!("authentication: expected its response: {e}"))
                }
            },
        }
    }
}

/// One look at an initiator's handshake: `Ok(true)` when it passed (the response is sent),
/// `Ok(false)` while the challenge is awaited, an error when it failed.
fn auth_step(a: &mut AuthSetup) -> Result<bool> {
    let failed = |why: String| Error::msg(Status::AccessDenied, why);
    // A peer that refuses writes why, then closes: what it wrote is read before the close.
    let read = a.rx.on_readable();
    let raw = match a.rx.peek() {
        Ok(Some(r)) => r,
        Ok(None) => {
            if let Err(e) = read {
                return Err(failed(format!(
                    "{} closed the connection during authentication ({e}); its log says why",
                    a.peer
                )));
            }
            if a.since.elapsed() > AUTH_TIMEOUT {
                return Err(failed(format!(
                    "{} did not answer the authentication hello within {}s",
                    a.peer,
                    AUTH_TIMEOUT.as_secs()
                )));
            }
            return Ok(false);
        }
        Err(e) => return Err(failed(format!("{}: {e}", a.peer))),
    };
    // A private copy of a shared-memory frame (the handshake is not per message).
    let mut copy = Vec::new();
    // SAFETY: valid until the `consume` below (or until the link is dropped, after the
    // last use of `bytes`).
    let bytes = unsafe { raw.private_bytes(&mut copy) };
    match AuthMsg::parse(bytes) {
        Ok(AuthMsg::Challenge { nonce, proof }) => {
            if !a.key.verify(Role::Acceptor, &a.nonce, &nonce, &proof) {
                reject(
                    &mut a.tx,
                    reason::BAD_PROOF,
                    "authentication failed: your proof does not match the connecting worker's key (another key?)",
                );
                return Err(failed(format!(
                    "{} failed authentication: its proof does not match this worker's key (another key?)",
                    a.peer
                )));
            }
            a.rx.consume();
            let mine = a.key.proof(Role::Initiator, &a.nonce, &nonce);
            send_now(&mut a.tx, &[&AuthMsg::Response { proof: mine }.emit()])?;
            Ok(true)
        }
        Ok(AuthMsg::Reject { text, .. }) => Err(Error::msg(
            Status::Rejected,
            format!("{} refused the connection: {}", a.peer, shown(text)),
        )),
        Ok(_) => Err(failed(format!(
            "{} answered the authentication hello out of order",
            a.peer
        ))),
        Err(e) => Err(failed(format!(
            "{} did not answer the authentication hello with a challenge: {e}",
            a.peer
        ))),
    }
}
