//! What a peer may make a worker spend (`COURIER_MAX_*`, `base::config::Limits`): the
//! accounting of memory its messages take before the application asks for them, of the
//! answers queued for it, and of the endpoints its connections make; and what is dropped
//! when it departs.
//!
//! A limit reached fails that one endpoint with an error naming the limit and its
//! variable; every other endpoint goes on. Memory held for a departed peer (its
//! unexpected messages, unless it closed gracefully) is dropped with its endpoint.

use std::collections::VecDeque;
use std::time::Instant;

use super::State;
use super::blockq::BlockQueue;
use super::send::{Pending, reply_cost};
use super::tag::UnexpBody;
use crate::base::{Error, Status};

/// The worker's part: bytes held for the application, and the gate of warnings about
/// peers.
#[derive(Default)]
pub(crate) struct LimitState {
    /// Bytes of unexpected messages and stream bytes of every endpoint.
    pub(in crate::proto) held: usize,
    /// When a warning about a peer was last written, and how many were held back since.
    warned: Option<Instant>,
    held_back: u64,
    /// Accepted connections in setup whose link must be polled (at most: recounted by
    /// each pass over them), and when all of them were last looked at for their timeout.
    pub(in crate::proto) polled_conns: usize,
    conns_swept: Option<Instant>,
    /// When the keepalive pass last looked at the endpoints (`keepalive.rs`).
    pub(in crate::proto) keepalive_looked: Option<Instant>,
    /// Frames failed endpoints left queued (`forget_queued`), freed a batch per call, each
    /// queue with the bytes of its answers still charged; and their sum.
    queued_left: VecDeque<(BlockQueue<Pending>, usize)>,
    pub(in crate::proto) queued_left_bytes: usize,
}

/// The most messages of failed endpoints `reclaim_dropped` frees in one progress call,
/// and the most bytes: a few tens of microseconds.
const RECLAIM_COUNT: usize = 256;
const RECLAIM_BYTES: usize = 1 << 20;

/// The most frames a failed endpoint left queued that one progress call frees (each an
/// entry of a few hundred bytes, mostly a get's answer not sent: about 20 ns apiece with
/// the memory cold). A failed endpoint's queue of fewer goes at once.
const RECLAIM_QUEUED: usize = 4096;

/// How often connections in setup that say nothing are looked at for their timeout.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Warnings about peers (refused connections, limits reached): at most one per this
/// interval, with a count of those held back, so that a peer cannot fill the log.
const WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// One endpoint's part of the accounting, and its keepalive state (`keepalive.rs`).
pub(crate) struct Spent {
    /// Bytes of this endpoint's unexpected messages waiting in the tag queue.
    pub(in crate::proto) unexpected: usize,
    /// How many of them: when they are the whole queue, a failure drops them at once.
    pub(in crate::proto) unexpected_count: usize,
    /// Memory of frames queued here without a request (answers, acknowledgements).
    pub(in crate::proto) replies: usize,
    /// Made by a peer's connection: `Some(None)` through the worker's address,
    /// `Some(Some(l))` through listener `l`.
    pub(in crate::proto) accepted: Option<Option<u32>>,
    /// A handle may name it: the application has it (or this side made it).
    pub(in crate::proto) owned: bool,
    /// The peer said it closes (a `Close` frame): what it sent before stays receivable.
    pub(in crate::proto) closed_by_peer: bool,
    /// Keepalive: the last time the peer was known to progress (an answer to a keepalive,
    /// or the last look that found nothing to wait for), and when the last keepalive was
    /// sent since then.
    pub(in crate::proto) heard: Option<Instant>,
    pub(in crate::proto) pinged: Option<Instant>,
    /// The link's `drained` count at the last look: queued data that leaves is progress
    /// too (a keepalive question waits behind it on a slow link).
    pub(in crate::proto) drained: u64,
    /// The link's `received` count at the last look: what the peer sends is progress too
    /// (its keepalive answer waits behind it).
    pub(in crate::proto) received: u64,
}

impl Default for Spent {
    fn default() -> Self {
        Spent {
            unexpected: 0,
            unexpected_count: 0,
            replies: 0,
            accepted: None,
            owned: true,
            closed_by_peer: false,
            heard: None,
            pinged: None,
            drained: 0,
            received: 0,
        }
    }
}

/// The error of a limit reached: which limit, its variable and value, and what to do.
pub(crate) fn limit_error(peer: &str, what: &str, var: &str, limit: usize) -> Error {
    Error::msg(
        Status::NoResource,
        format!(
            "{peer} passed the limit on {what} ({var}={}); the endpoint is failed, every other goes on (raise {var} if the peer is trusted)",
            human(limit)
        ),
    )
}

/// A size as `courier info -c` would write it.
pub(crate) fn human(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}m", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{}k", n >> 10)
    } else {
        n.to_string()
    }
}

/// What an unexpected message costs to keep: its bytes and the queue entry.
pub(crate) fn unexpected_cost(body: &UnexpBody) -> usize {
    const ENTRY: usize = 64;
    ENTRY
        + match body {
            UnexpBody::Eager(v) | UnexpBody::EagerSync(v, _) => v.len(),
            UnexpBody::Rts { segs, key, .. } => {
                segs.len() * 16 + key.as_ref().map_or(0, |k| k.len())
            }
        }
}

impl State {
    /// Charge `cost` bytes of an unexpected message (or stream bytes, `stream`) to endpoint
    /// `e` and the worker. `false`: a limit would be passed, and `e` has failed.
    pub(crate) fn charge_unexpected(&mut self, e: u32, cost: usize, stream: Option<usize>) -> bool {
        let lim = self.cfg.limits;
        let total = self.limits.held.saturating_add(cost);
        let Some(ep) = self.ep(e) else { return false };
        let peer = ep.peer.clone();
        let why = if let Some(queued) = stream {
            (queued.saturating_add(cost) > lim.stream_ep).then(|| {
                limit_error(
                    &peer,
                    "stream bytes not yet received",
                    "COURIER_MAX_STREAM_EP",
                    lim.stream_ep,
                )
            })
        } else {
            (ep.spent.unexpected.saturating_add(cost) > lim.unexpected_ep).then(|| {
                limit_error(
                    &peer,
                    "unexpected messages of one endpoint",
                    "COURIER_MAX_UNEXPECTED_EP",
                    lim.unexpected_ep,
                )
            })
        };
        let why = why.or_else(|| {
            (total > lim.unexpected).then(|| {
                limit_error(
                    &peer,
                    "bytes waiting for the application in this worker",
                    "COURIER_MAX_UNEXPECTED",
                    lim.unexpected,
                )
            })
        });
        if let Some(why) = why {
            self.limit_reached(e, why);
            return false;
        }
        if stream.is_none() {
            ep.spent.unexpected += cost;
            ep.spent.unexpected_count += 1;
        }
        self.limits.held = total;
        true
    }

    /// Give back what a message of endpoint `e` (of generation `generation`) cost, now
    /// that it is received or dropped (`e` may be gone: only the worker's part then).
    pub(crate) fn release_unexpected(&mut self, e: u32, generation: u32, cost: usize) {
        self.limits.held = self.limits.held.saturating_sub(cost);
        if let Some(ep) = self.ep(e).filter(|ep| ep.generation == generation) {
            ep.spent.unexpected = ep.spent.unexpected.saturating_sub(cost);
            ep.spent.unexpected_count = ep.spent.unexpected_count.saturating_sub(1);
        }
    }

    /// Stream bytes were taken by the application (or dropped with their endpoint).
    pub(crate) fn release_stream(&mut self, n: usize) {
        self.limits.held = self.limits.held.saturating_sub(n);
    }

    /// A limit was reached on `e`: say so and fail it.
    pub(crate) fn limit_reached(&mut self, e: u32, why: Error) {
        self.warn_peer(why.detail());
        self.fail_ep(e, why);
    }

    /// Write a warning about a peer, rate-limited (`WARN_EVERY`): one held back is still
    /// written at `COURIER_LOG_LEVEL=debug`, so nothing is lost to someone looking for it.
    pub(crate) fn warn_peer(&mut self, what: &str) {
        let now = Instant::now();
        let l = &mut self.limits;
        if l.warned.is_some_and(|t| now.duration_since(t) < WARN_EVERY) {
            l.held_back += 1;
            tracing::debug!("{what} (a warning held back)");
            return;
        }
        l.warned = Some(now);
        match std::mem::take(&mut l.held_back) {
            0 => tracing::warn!("{what}"),
            n => tracing::warn!("{what} ({n} more such warnings held back in the last second)"),
        }
    }

    /// Charge a frame queued on `e` without a request (an answer): `false` when the peer
    /// does not read and the queue passed `COURIER_MAX_REPLY_QUEUE` (`e` has failed).
    pub(crate) fn charge_reply(&mut self, e: u32, cost: usize) -> bool {
        let lim = self.cfg.limits.reply_queue;
        let Some(ep) = self.ep(e) else { return false };
        if ep.spent.replies.saturating_add(cost) > lim {
            let why = limit_error(
                &ep.peer.clone(),
                "answers queued for a peer that does not read them",
                "COURIER_MAX_REPLY_QUEUE",
                lim,
            );
            self.limit_reached(e, why);
            return false;
        }
        ep.spent.replies += cost;
        true
    }

    /// Endpoint `e` failed: drop what its peer sent that no one received (rendezvous
    /// offers can no longer be fetched; eager messages and stream bytes go too unless the
    /// peer closed gracefully, which keeps its eager messages receivable, as sent).
    ///
    /// The messages leave the tag queue at once, but their memory is freed a batch per
    /// progress call (`reclaim_dropped`) and stays charged to the worker until then: a
    /// flooding peer failed at its limit leaves tens of thousands of buffers, and freeing
    /// them all in one call held every other peer's answer for milliseconds. When they
    /// are the whole queue (the flood's case), the queue itself is set aside, so the cost
    /// here does not grow with the flood either.
    pub(crate) fn forget_unexpected_from(&mut self, e: u32) {
        let queued = self.tag.unexpected.len();
        let Some(ep) = self.ep(e) else { return };
        let keep_eager = ep.spent.closed_by_peer;
        let generation = ep.generation;
        let mut stream_in = if keep_eager {
            Default::default()
        } else {
            std::mem::take(&mut ep.stream_in)
        };
        let all_ours = !keep_eager && queued > 0 && ep.spent.unexpected_count == queued;
        let stream = stream_in.len();
        stream_in.clear(&mut self.stream_spares);
        self.release_stream(stream);
        let dropped = if all_ours {
            std::mem::take(&mut self.tag.unexpected)
        } else {
            let mut dropped = VecDeque::new();
            let mut kept = VecDeque::with_capacity(queued);
            for u in self.tag.unexpected.drain(..) {
                let drop = u.ep == e
                    && u.generation == generation
                    && (!keep_eager || !matches!(u.body, UnexpBody::Eager(_)));
                if drop {
                    dropped.push_back(u);
                } else {
                    kept.push_back(u);
                }
            }
            self.tag.unexpected = kept;
            dropped
        };
        if dropped.is_empty() {
            return;
        }
        // The endpoint holds nothing more; the worker does, until the memory is freed.
        if let Some(ep) = self.ep(e) {
            for u in &dropped {
                ep.spent.unexpected = ep.spent.unexpected.saturating_sub(unexpected_cost(&u.body));
            }
            ep.spent.unexpected_count = ep.spent.unexpected_count.saturating_sub(dropped.len());
        }
        self.tag.dropped.push_back(dropped);
    }

    /// Endpoint `e` failed with frames still queued to send (`queued`, taken out of it;
    /// their requests are failed with the endpoint's). A peer that asks and never reads
    /// leaves up to `COURIER_MAX_REPLY_QUEUE` of answers there, 70,000 entries of 16 MiB:
    /// freeing them in this call held the worker 1.3 ms, once per such peer. A long queue
    /// is freed `RECLAIM_QUEUED` frames per progress call instead (`reclaim_dropped`); so
    /// is a short one while others wait (many endpoints failing in one call).
    ///
    /// `answers` is what the queue's answers were charged (`charge_reply`): they stay
    /// counted (`queued_left_bytes`) until freed, and all the answers set aside together
    /// may hold one `COURIER_MAX_REPLY_QUEUE`. Past it (peers failing faster than their
    /// answers are freed) the oldest queues are freed at once, so that a peer that
    /// reconnects and floods again cannot pile its old answers up behind the new.
    pub(crate) fn forget_queued(&mut self, queued: BlockQueue<Pending>, answers: usize) {
        if queued.len() <= RECLAIM_QUEUED
            && (queued.is_empty() || self.limits.queued_left.is_empty())
        {
            return;
        }
        let l = &mut self.limits;
        l.queued_left_bytes = l.queued_left_bytes.saturating_add(answers);
        l.queued_left.push_back((queued, answers));
        let cap = self.cfg.limits.reply_queue;
        while l.queued_left_bytes > cap && l.queued_left.len() > 1 {
            if let Some((old, charged)) = l.queued_left.pop_front() {
                l.queued_left_bytes = l.queued_left_bytes.saturating_sub(charged);
                tracing::debug!(
                    "{} frames of failed endpoints freed at once: answers set aside passed COURIER_MAX_REPLY_QUEUE",
                    old.len()
                );
            }
        }
    }

    /// Whether failed endpoints left anything that `reclaim_dropped` has still to free.
    #[inline]
    pub(crate) fn has_dropped(&self) -> bool {
        !self.tag.dropped.is_empty() || !self.limits.queued_left.is_empty()
    }

    /// Free a batch of what failed endpoints left: of their messages
    /// (`forget_unexpected_from`), at most `RECLAIM_COUNT` or `RECLAIM_BYTES`, whichever
    /// comes first; of their queued frames (`forget_queued`), `RECLAIM_QUEUED`. How many
    /// messages and frames were freed.
    pub(crate) fn reclaim_dropped(&mut self) -> usize {
        let mut freed = 0;
        let l = &mut self.limits;
        while freed < RECLAIM_QUEUED {
            let Some((q, charged)) = l.queued_left.front_mut() else {
                break;
            };
            if let Some(p) = q.pop_front() {
                let cost = reply_cost(&p).min(*charged);
                *charged -= cost;
                l.queued_left_bytes = l.queued_left_bytes.saturating_sub(cost);
                freed += 1;
            }
            // A queue goes as its last frame does (`forget_queued` sets none aside empty).
            if q.is_empty() {
                let rest = *charged;
                l.queued_left_bytes = l.queued_left_bytes.saturating_sub(rest);
                l.queued_left.pop_front();
            }
        }
        freed + self.reclaim_messages()
    }

    /// `reclaim_dropped`'s part for messages.
    fn reclaim_messages(&mut self) -> usize {
        let (mut n, mut bytes) = (0, 0);
        while n < RECLAIM_COUNT && bytes < RECLAIM_BYTES {
            let Some(batch) = self.tag.dropped.front_mut() else {
                break;
            };
            let Some(u) = batch.pop_front() else {
                self.tag.dropped.pop_front();
                continue;
            };
            let cost = unexpected_cost(&u.body);
            self.limits.held = self.limits.held.saturating_sub(cost);
            bytes += cost;
            n += 1;
            if let UnexpBody::Eager(v) | UnexpBody::EagerSync(v, _) = u.body {
                self.unexp_recycle(v);
            }
        }
        if self.tag.dropped.front().is_some_and(|b| b.is_empty()) {
            self.tag.dropped.pop_front();
        }
        n
    }

    /// Free `e` if a peer's connection made it and the application never took it (it
    /// failed: nothing can use it any more).
    pub(crate) fn free_if_unowned(&mut self, e: u32) {
        let Some(ep) = self.ep(e) else { return };
        if ep.spent.owned || ep.rx_busy {
            return;
        }
        let generation = ep.generation;
        self.wireup
            .incoming
            .retain(|&(i, g)| !(i == e && g == generation));
        self.ep_free(e);
    }

    /// Whether a new connection may be accepted: by the worker's address (`listener`
    /// `None`) or by listener `listener`. The refusal's reason otherwise.
    pub(crate) fn accept_allowed(&mut self, listener: Option<u32>) -> Result<(), String> {
        let lim = self.cfg.limits;
        let mut worker = 0usize;
        let mut this = 0usize;
        for ep in self.eps.slots.iter().filter(|s| s.live) {
            if let Some(origin) = ep.spent.accepted {
                worker += 1;
                if listener.is_some() && origin == listener {
                    this += 1;
                }
            }
        }
        if worker >= lim.accepted {
            return Err(format!(
                "this worker has {worker} endpoints made by peers' connections (COURIER_MAX_ACCEPTED={})",
                lim.accepted
            ));
        }
        if listener.is_some() && this >= lim.accepted_listener {
            return Err(format!(
                "the listener has {this} accepted endpoints (COURIER_MAX_ACCEPTED_LISTENER={})",
                lim.accepted_listener
            ));
        }
        Ok(())
    }

    /// Room for one more accepted connection in setup: past `COURIER_MAX_CONNECTING`, the
    /// oldest one that has not introduced itself is dropped (an idle flood pushes out
    /// itself, not a client that introduces itself at once).
    pub(crate) fn make_room_for_conn(&mut self) {
        let lim = self.cfg.limits.connecting;
        let conns = &self.wireup.pending_conns;
        let live = conns.slots.len() - conns.free.len();
        if live < lim {
            return;
        }
        let oldest = conns
            .slots
            .iter()
            .enumerate()
            .filter(|(_, p)| p.live && !p.offered)
            .min_by_key(|(_, p)| p.since)
            .map(|(i, _)| i as u32);
        if let Some(i) = oldest {
            self.pending_drop(
                i,
                Some(format!(
                    "it said nothing, and more than COURIER_MAX_CONNECTING={lim} connections are in setup"
                )),
            );
        }
    }

    /// Look at accepted connections in setup: those whose link must be polled, every
    /// call; the others (their socket wakes epoll, `token::PENDING`) only once a
    /// `SWEEP_EVERY`, for their timeout.
    pub(crate) fn step_conns_in_setup(&mut self) -> usize {
        let now = Instant::now();
        let sweep = self
            .limits
            .conns_swept
            .is_none_or(|t| now.duration_since(t) >= SWEEP_EVERY);
        if sweep {
            self.limits.conns_swept = Some(now);
        }
        let mut n = 0;
        let mut polled = 0;
        for i in 0..self.wireup.pending_conns.slots.len() {
            let p = &self.wireup.pending_conns.slots[i];
            if !p.live || p.offered {
                continue;
            }
            let by_fd = p.tx.as_ref().is_some_and(|t| t.caps().data_via_fd);
            if !by_fd {
                polled += 1;
            }
            if !by_fd || sweep {
                n += self.pending_step(i as u32);
            }
        }
        self.limits.polled_conns = polled;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::buf::Buf;
    use crate::proto::request::{Callback, Info, ReqKind};
    use crate::wire::frame::Header;

    fn state() -> State {
        State::for_test("limits-test")
    }

    /// An endpoint with `answers` get answers queued, then a send behind them.
    fn queued_endpoint(st: &mut State, answers: usize) -> (u32, u64) {
        queued_endpoint_of(st, answers, 0)
    }

    /// As `queued_endpoint`, each answer carrying `extra` bytes after its header.
    fn queued_endpoint_of(st: &mut State, answers: usize, extra: usize) -> (u32, u64) {
        let e = st.ep_alloc("peer".into());
        for i in 0..answers {
            let answer = Pending {
                req: None,
                hdr: Header::get_resp(i as u64, 0, 0),
                extra: vec![0; extra],
                data: Buf::EMPTY,
                region: None,
                answer: true,
            };
            st.enqueue(e, answer)
                .expect("queued within the reply budget");
        }
        let send = st.req_alloc(ReqKind::Send, Some(e), Buf::EMPTY, Callback::None);
        let frame = Pending {
            req: Some(send),
            hdr: Header::get_resp(0, 0, 0),
            extra: Vec::new(),
            data: Buf::EMPTY,
            region: None,
            answer: false,
        };
        st.enqueue(e, frame).expect("queued");
        (e, send)
    }

    fn failed_now(st: &mut State, id: u64) -> bool {
        let (mut done, mut info) = (None, Info::default());
        st.take_result(id, &mut done, &mut info);
        matches!(done, Some(Err(_)))
    }

    #[test]
    fn a_failed_endpoints_long_queue_is_freed_a_batch_per_call() {
        let mut st = state();
        let answers = 2 * RECLAIM_QUEUED + 10;
        let (e, send) = queued_endpoint(&mut st, answers);
        assert_eq!(st.ep(e).map(|ep| ep.pending.len()), Some(answers + 1));
        st.fail_ep(e, Error::new(Status::EndpointClosed, "peer went away"));
        // The send behind the answers fails at once; the endpoint holds nothing more.
        assert!(
            failed_now(&mut st, send),
            "the queued send did not fail with its endpoint"
        );
        assert!(st.ep(e).is_none_or(|ep| ep.pending.is_empty()));
        // The frames go over three calls, at most a batch each.
        let mut calls = 0;
        while st.has_dropped() {
            let freed = st.reclaim_dropped();
            assert!(freed <= RECLAIM_QUEUED, "{freed} frames freed in one call");
            calls += 1;
            assert!(calls <= 3, "still holding frames after {calls} calls");
        }
        assert_eq!(calls, 3);
    }

    #[test]
    fn answers_set_aside_stay_within_one_reply_budget() {
        let mut st = state();
        let cap = st.cfg.limits.reply_queue;
        // Two endpoints whose long queues each hold over half the budget.
        let answers = 2 * RECLAIM_QUEUED + 10;
        let extra = cap * 3 / 4 / answers;
        let (a, _) = queued_endpoint_of(&mut st, answers, extra);
        let (b, _) = queued_endpoint_of(&mut st, answers, extra);
        let charged = st.ep(a).map_or(0, |ep| ep.spent.replies);
        assert!(charged > cap / 2 && charged <= cap, "{charged} of {cap}");
        st.fail_ep(a, Error::new(Status::EndpointClosed, "peer went away"));
        assert_eq!(st.limits.queued_left_bytes, charged);
        // A batch freed takes its answers' bytes off the charge.
        st.reclaim_dropped();
        let after_one = st.limits.queued_left_bytes;
        assert!(
            after_one < charged,
            "{after_one} still charged of {charged}"
        );
        // The second failure would hold both: the first's rest is freed at once.
        st.fail_ep(b, Error::new(Status::EndpointClosed, "peer went away"));
        assert_eq!(st.limits.queued_left_bytes, charged);
        let mut calls = 0;
        while st.has_dropped() {
            st.reclaim_dropped();
            calls += 1;
            assert!(calls <= 3, "still holding frames after {calls} calls");
        }
        assert_eq!(st.limits.queued_left_bytes, 0);
    }

    #[test]
    fn a_failed_endpoints_short_queue_is_freed_at_once() {
        let mut st = state();
        let (e, send) = queued_endpoint(&mut st, 100);
        st.fail_ep(e, Error::new(Status::EndpointClosed, "peer went away"));
        assert!(failed_now(&mut st, send));
        assert!(!st.has_dropped());
    }
}
