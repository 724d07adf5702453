//! Liveness of peers this side waits on: a peer that is alive but stopped (SIGSTOP), hung
//! or no longer progressing its worker is failed within `COURIER_KEEPALIVE_TIMEOUT`, on
//! every transport.
//!
//! A link's transport sees a peer die (a socket's hangup, TCP keepalive and
//! `TCP_USER_TIMEOUT`), but not a peer that lives and does nothing. So while this side
//! waits on an endpoint (a request in flight on it, frames or bytes still to leave), and
//! its peer has said nothing for a keepalive interval, it sends a `Keepalive` question,
//! which the peer answers from its progress. A peer that answers nothing for the
//! keepalive timeout while waited on (and neither takes the data queued for it nor sends
//! any, behind which question and answer wait) fails its endpoint with an error that names it and
//! says it is not progressing: its requests, flushes and waits end with that error. An
//! endpoint nothing waits on is not asked (a peer may compute for as long as it likes
//! while no one needs it), and a wait that finishes in time never sends a keepalive.

use std::time::{Duration, Instant};

use super::State;
use super::buf::Buf;
use crate::base::{Error, Status};
use crate::wire::frame::Header;

impl State {
    /// A keepalive frame arrived on `e`: answer a question; an answer says the peer
    /// progresses.
    pub(crate) fn on_keepalive(&mut self, e: u32, ping: bool) {
        if ping {
            let _ = self.send_answer(e, &Header::keepalive(false), &[], Buf::EMPTY, None);
        } else if let Some(ep) = self.ep(e) {
            ep.spent.heard = Some(Instant::now());
            ep.spent.pinged = None;
        }
    }

    /// How often a waited-on, silent peer is asked: the keepalive interval, at most half
    /// the timeout (so that at least two questions go before it is given up).
    fn keepalive_every(&self) -> Duration {
        self.cfg
            .keepalive_interval
            .min(self.cfg.keepalive_timeout / 2)
            .max(Duration::from_millis(10))
    }

    /// Look at the endpoints this side waits on (from the progress loop's periodic pass,
    /// at most four times a keepalive interval): ask the silent ones, fail those silent
    /// past the timeout.
    pub(crate) fn keepalive_tick(&mut self) {
        let timeout = self.cfg.keepalive_timeout;
        if self.progress.active.is_empty() {
            return;
        }
        let now = Instant::now();
        let every = self.keepalive_every();
        if self
            .limits
            .keepalive_looked
            .is_some_and(|t| now.duration_since(t) < every / 4)
        {
            return;
        }
        self.limits.keepalive_looked = Some(now);
        for e in self.progress.active.clone() {
            let failing = self.progress.link_errors.iter().any(|(x, _)| *x == e);
            let requests = self.inflight.any(e);
            let Some(ep) = self.ep(e) else { continue };
            if !ep.is_connected() {
                continue;
            }
            // A same-host peer that exited (its pidfd says so), whoever holds its socket.
            if ep.rx.as_ref().is_some_and(|rx| rx.peer_exited()) && !failing {
                let why = Error::msg(Status::PeerFailure, format!("{} exited", ep.peer));
                self.drain_then_fail(e, why);
                continue;
            }
            if timeout == Duration::MAX {
                continue;
            }
            let waits = requests
                || !ep.pending.is_empty()
                || !ep.push.is_empty()
                || ep.tx.as_ref().is_some_and(|t| t.queued() > 0);
            if !waits {
                ep.spent.heard = Some(now);
                ep.spent.pinged = None;
                continue;
            }
            // Data moving on the link: queued data the peer takes (a keepalive question
            // waits behind it), or data the peer sends (its answer waits behind that).
            let drained = ep.tx.as_ref().map_or(0, |t| t.drained());
            let received = ep.rx.as_ref().map_or(0, |r| r.received());
            if drained != ep.spent.drained || received != ep.spent.received {
                ep.spent.drained = drained;
                ep.spent.received = received;
                ep.spent.heard = Some(now);
            }
            let heard = *ep.spent.heard.get_or_insert(now);
            let silent = now.duration_since(heard);
            if silent > timeout && ep.spent.pinged.is_some() {
                let why = Error::msg(
                    Status::PeerFailure,
                    format!(
                        "{} is not progressing: it answered no keepalive for {:.1?} while this side waited on it (COURIER_KEEPALIVE_TIMEOUT={:?}); it is stopped, hung, or no longer calls into Courier",
                        ep.peer, silent, timeout
                    ),
                );
                self.warn_peer(why.detail());
                self.fail_ep(e, why);
                continue;
            }
            if silent >= every
                && ep
                    .spent
                    .pinged
                    .is_none_or(|t| now.duration_since(t) >= every)
            {
                ep.spent.pinged = Some(now);
                let _ = self.send_frame(e, &Header::keepalive(true), &[], &Buf::EMPTY, None);
            }
        }
    }
}
