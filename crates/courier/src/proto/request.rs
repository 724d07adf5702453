//! Requests: what an operation in flight reports, how it completes, and the slots that
//! hold requests, with ids of (generation << 32 | slot) so that a stale or forged id from a
//! peer is detected instead of hitting a reused slot.
//!
//! An id is never issued twice: a slot whose generation reaches `u32::MAX` is retired
//! (never reused) instead of wrapping, so a scope or a handle that still holds an old id
//! (a `Request` forgotten, a scope waiting on what it started) can never name a later,
//! unrelated request. Retiring costs one slot per 2^32 requests that reused it.

use super::State;
use super::buf::Buf;
use crate::base::{Error, Status};

/// What a completed operation reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Info {
    /// Bytes moved; for a truncated receive, the real length of the message. (Called
    /// `length` in C's `courier_request_info_t` and Go's `Info` too.)
    pub length: usize,
    /// The message's tag (tag receives).
    pub tag: u64,
    /// The old value (fetching atomics).
    pub value: u64,
}

/// Completion notification for a request.
pub enum Callback {
    /// Poll or wait.
    None,
    /// A Rust closure, run inside progress.
    Rust(Box<dyn FnOnce(Result<Info, Error>) + Send>),
    /// A plain function and a user word (for the C ABI and bindings; no allocation). The
    /// `Info` is passed also on failure (a truncated receive's real length).
    Raw(RawFn, usize),
}

/// An endpoint's error handler: run once, inside progress, when the endpoint fails.
pub type ErrorHandler = Box<dyn FnMut(&Error) + Send>;

/// A plain completion function: the user word, the result, and the operation's `Info`
/// (passed also on failure).
pub type RawFn = fn(usize, Result<Info, Error>, Info);

/// How an operation started.
#[derive(Debug)]
pub enum Started {
    /// Completed at once (no request was made; no callback will run).
    Done(Info),
    /// In progress: a request id to poll or wait on.
    Pending(u64),
}

/// What a request is waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReqKind {
    Send,
    TagRecv,
    StreamRecv,
    AmData,
    /// Put, atomic, put-with-signal: acknowledged by the target.
    Rma,
    /// Get: answered with data.
    Get,
}

/// Requests in flight (live, not done) per endpoint index, by direction: what a flush
/// waits for (sends, puts, atomics, gets) and what the keepalive counts as this side waiting
/// on the peer (those and receives matched to the endpoint). Kept as requests start,
/// complete, are freed or are matched to an endpoint, so that neither looks at every
/// request slot: the slots only grow, and a program that once had a million requests in
/// flight would pay for them at every flush and keepalive pass. Indexed like the endpoint
/// table; a request counts for its endpoint's index until it completes, as a scan of the
/// slots would count it.
#[derive(Default)]
pub(crate) struct InFlight {
    by_ep: Vec<[u32; 2]>,
}

impl InFlight {
    /// 0: a request the flush waits for; 1: a receive.
    #[inline]
    fn class(kind: ReqKind) -> usize {
        match kind {
            ReqKind::Send | ReqKind::Rma | ReqKind::Get => 0,
            ReqKind::TagRecv | ReqKind::StreamRecv | ReqKind::AmData => 1,
        }
    }

    #[inline]
    fn add(&mut self, e: u32, kind: ReqKind) {
        let i = e as usize;
        if i >= self.by_ep.len() {
            self.by_ep.resize(i + 1, [0; 2]);
        }
        self.by_ep[i][Self::class(kind)] += 1;
    }

    #[inline]
    fn sub(&mut self, e: u32, kind: ReqKind) {
        if let Some(c) = self.by_ep.get_mut(e as usize) {
            let c = &mut c[Self::class(kind)];
            debug_assert!(*c > 0, "in-flight count of endpoint {e} below zero");
            *c = c.saturating_sub(1);
        }
    }

    /// Slot `s`, in flight until now, is done or freed: it waits on its endpoint no more.
    #[inline]
    fn leave(&mut self, s: &ReqSlot) {
        if let Some(e) = s.ep {
            self.sub(e, s.kind);
        }
    }

    /// Whether sends, puts, atomics or gets on endpoint `e` are in flight.
    pub(crate) fn outgoing(&self, e: u32) -> bool {
        self.by_ep.get(e as usize).is_some_and(|c| c[0] > 0)
    }

    /// Whether any request waits on endpoint `e`.
    pub(crate) fn any(&self, e: u32) -> bool {
        self.by_ep.get(e as usize).is_some_and(|c| c[0] + c[1] > 0)
    }
}

pub(crate) struct ReqSlot {
    pub(in crate::proto) generation: u32,
    pub(in crate::proto) live: bool,
    pub(in crate::proto) done: bool,
    pub(in crate::proto) result: Result<Info, Error>,
    pub(in crate::proto) kind: ReqKind,
    pub(in crate::proto) ep: Option<u32>,
    pub(in crate::proto) buf: Buf,
    /// Receives: bytes expected (rendezvous) and received so far.
    pub(in crate::proto) expect: usize,
    pub(in crate::proto) got: usize,
    pub(in crate::proto) tag: u64,
    /// Stream receives: complete only when the buffer is full.
    pub(in crate::proto) waitall: bool,
    /// Receiving rendezvous data pushed by the sender.
    pub(in crate::proto) rndv_push: bool,
    /// The real length of the message being received (truncation reports).
    pub(in crate::proto) real_len: usize,
    /// What the request reports, also when it failed (a truncated receive's real length).
    pub(in crate::proto) info: Info,
    pub(in crate::proto) callback: Callback,
    /// No handle refers to the request any more: free it on completion.
    pub(in crate::proto) detached: bool,
    /// Sends: all frames are with the link, which still writes the last from the buffer;
    /// completes with `info` when the link reports the request's id as written.
    pub(in crate::proto) zc_wait: bool,
    /// The host copy of device memory the request works on (`proto::stage`).
    pub(in crate::proto) stage: Option<Box<crate::proto::stage::Stage>>,
}

impl ReqSlot {
    /// A slot never used yet (generation 0: its first request gets generation 1).
    pub(crate) fn vacant() -> ReqSlot {
        ReqSlot {
            generation: 0,
            live: false,
            done: false,
            result: Ok(Info::default()),
            kind: ReqKind::Send,
            ep: None,
            buf: Buf::EMPTY,
            expect: 0,
            got: 0,
            tag: 0,
            waitall: false,
            rndv_push: false,
            real_len: 0,
            info: Info::default(),
            callback: Callback::None,
            detached: false,
            zc_wait: false,
            stage: None,
        }
    }

    /// Mark the slot free: it lets go of the caller's buffer and callback (the slot goes
    /// on the free list beside this call). A polled request (no callback, one segment,
    /// nothing staged), the common case, holds nothing that needs dropping.
    #[inline]
    pub(crate) fn release(&mut self) {
        self.live = false;
        if matches!(self.callback, Callback::None)
            && matches!(self.buf, Buf::One(_))
            && self.stage.is_none()
        {
            self.buf = Buf::EMPTY;
            return;
        }
        self.release_owned();
    }

    /// `release` of a slot holding a callback, a list of segments or a staged copy.
    #[inline(never)]
    fn release_owned(&mut self) {
        self.callback = Callback::None;
        self.buf = Buf::EMPTY;
        self.stage = None;
    }

    /// Whether this live request on endpoint `e` expects `n` bytes at `offset`.
    pub(crate) fn takes(&self, e: u32, offset: u64, n: usize) -> bool {
        self.ep == Some(e)
            && !self.done
            && offset
                .checked_add(n as u64)
                .is_some_and(|x| x <= self.expect as u64)
    }
}

pub(crate) fn make_id(generation: u32, idx: u32) -> u64 {
    ((generation as u64) << 32) | idx as u64
}

pub(crate) fn split_id(id: u64) -> (u32, u32) {
    ((id >> 32) as u32, id as u32)
}

/// The live slot of `slots` that `id` names, if the id is current.
#[inline]
fn live_slot(slots: &mut [ReqSlot], id: u64) -> Option<&mut ReqSlot> {
    let (generation, idx) = split_id(id);
    slots
        .get_mut(idx as usize)
        .filter(|s| s.live && s.generation == generation)
}

impl State {
    /// Cancel a request that has not started moving data. Returns whether it was canceled.
    pub(crate) fn cancel(&mut self, id: u64) -> bool {
        let Some(s) = self.req(id) else { return false };
        if s.done {
            return false;
        }
        match s.kind {
            ReqKind::TagRecv if s.ep.is_none() => {
                self.tag.expected.retain(|p| p.id != id);
                self.complete(id, Err(Status::Canceled.into()));
                true
            }
            ReqKind::StreamRecv => {
                let e = s.ep;
                if let Some(ep) = e.and_then(|e| self.ep(e)) {
                    ep.stream_reqs.retain(|&x| x != id);
                }
                self.complete(id, Err(Status::Canceled.into()));
                true
            }
            ReqKind::Send => {
                // Only a send still waiting in the pending queue has not started.
                let e = s.ep;
                let Some(ep) = e.and_then(|e| self.ep(e)) else {
                    return false;
                };
                let before = ep.pending.len();
                ep.pending.retain(|p| p.req != Some(id));
                if ep.pending.len() != before {
                    self.complete(id, Err(Status::Canceled.into()));
                    true
                } else {
                    false
                }
            }
            _ => false,
        }
    }

    /// A new request with its buffer and callback; its id.
    pub(crate) fn req_alloc(
        &mut self,
        kind: ReqKind,
        ep: Option<u32>,
        buf: Buf,
        callback: Callback,
    ) -> u64 {
        let (id, s) = self.req_take(kind, ep);
        s.buf = buf;
        s.callback = callback;
        id
    }

    /// A new request's slot with every field that is read before it completes set, but its
    /// buffer and callback, which the caller stores (`req_alloc`, `post_recv`): a freed
    /// slot's were released, so nothing is left to drop.
    #[inline]
    pub(crate) fn req_take(&mut self, kind: ReqKind, ep: Option<u32>) -> (u64, &mut ReqSlot) {
        // A freed slot (`req_free` left its buffer and callback empty and it is not live),
        // or a new one, made vacant first; either is then set field by field (cheaper than
        // building and moving a whole slot).
        let idx = loop {
            match self.reqs.free.pop() {
                // A slot whose last id used the last generation is retired: dropped from
                // the free list, never reused, so that no id comes back.
                Some(i)
                    if self
                        .reqs
                        .slots
                        .get(i as usize)
                        .is_some_and(|s| s.generation == u32::MAX) => {}
                Some(i) if (i as usize) < self.reqs.slots.len() => break i as usize,
                _ => {
                    self.reqs.slots.push(ReqSlot::vacant());
                    break self.reqs.slots.len() - 1;
                }
            }
        };
        let stage = self.parked.take();
        if let Some(e) = ep {
            self.inflight.add(e, kind);
        }
        // In bounds: a free index checked above, or the slot just pushed.
        let s = &mut self.reqs.slots[idx];
        // Generations start at 1, so no request id is 0: the wire uses 0 for "no request"
        // (puts that are acknowledged only when refused).
        let generation = s.generation.wrapping_add(1).max(1);
        s.generation = generation;
        s.live = true;
        s.done = false;
        s.detached = false;
        s.zc_wait = false;
        s.waitall = false;
        s.rndv_push = false;
        s.kind = kind;
        s.ep = ep;
        s.expect = 0;
        s.got = 0;
        s.tag = 0;
        s.real_len = 0;
        // A free slot holds no staged copy (`ReqSlot::release`): only a new one is stored,
        // so the common case makes no call to drop the old.
        if stage.is_some() {
            s.stage = stage;
        }
        (make_id(generation, idx as u32), s)
    }

    /// The live slot for `id`, if the id is current.
    #[inline]
    pub(crate) fn req(&mut self, id: u64) -> Option<&mut ReqSlot> {
        live_slot(&mut self.reqs.slots, id)
    }

    pub(crate) fn req_free(&mut self, id: u64) {
        // The slot through its own field, not `req`: `inflight` is borrowed beside it.
        let Some(s) = live_slot(&mut self.reqs.slots, id) else {
            return;
        };
        if !s.done {
            self.inflight.leave(s);
        }
        s.release();
        self.reqs.free.push(split_id(id).1);
    }

    /// Request `id` is matched to endpoint `e` (a receive posted for any endpoint, now
    /// receiving from `e`): it waits on `e` from now on.
    pub(crate) fn req_set_ep(&mut self, id: u64, e: u32) {
        let Some(s) = live_slot(&mut self.reqs.slots, id) else {
            return;
        };
        if s.ep == Some(e) {
            return;
        }
        if !s.done {
            if let Some(old) = s.ep {
                self.inflight.sub(old, s.kind);
            }
            self.inflight.add(e, s.kind);
        }
        s.ep = Some(e);
    }

    /// The result of request `id` if it has completed, which frees its slot: one lookup
    /// for what a `Request` polls on every test.
    ///
    /// Written into the caller's `done` and `info` (a `Request`'s own fields) rather than
    /// returned: the done path of every polled request moves them once.
    #[inline]
    pub(crate) fn take_result(
        &mut self,
        id: u64,
        done: &mut Option<Result<Info, Error>>,
        info: &mut Info,
    ) {
        let Some(s) = self.req(id).filter(|s| s.done) else {
            return;
        };
        *info = s.info;
        *done = Some(std::mem::replace(&mut s.result, Ok(Info::default())));
        s.release();
        self.reqs.free.push(split_id(id).1);
    }

    /// Complete a request: record the result, queue its callback, free it if detached.
    pub(crate) fn complete(&mut self, id: u64, result: Result<Info, Error>) {
        let info = result.as_ref().copied().unwrap_or_default();
        self.complete_info(id, result, info)
    }

    /// Complete with an explicit info (kept also on failure).
    #[inline]
    pub(crate) fn complete_info(&mut self, id: u64, result: Result<Info, Error>, info: Info) {
        if self.req(id).is_some() {
            self.complete_slot(split_id(id).1, result, info);
        }
    }

    /// `complete_info` for the request in slot `idx`, which the caller found live and
    /// current (a matched receive: no second lookup by id).
    #[inline]
    pub(crate) fn complete_slot(&mut self, idx: u32, result: Result<Info, Error>, info: Info) {
        let Some(s) = self.reqs.slots.get_mut(idx as usize) else {
            return;
        };
        if s.done {
            return;
        }

        s.done = true;
        self.inflight.leave(s);
        s.info = info;
        // Device memory: the host copy goes to the device before anyone hears of it.
        let result = match s.stage.take() {
            Some(stage) => stage.finish(result),
            None => result,
        };
        if matches!(s.callback, Callback::None) {
            s.result = result;
            if s.detached {
                s.release();
                self.reqs.free.push(idx);
            }
            return;
        }
        // A request with a callback belongs to it (nobody polls it): free it now, or the
        // slot of every operation started with a callback (the C ABI's) stays taken.
        let cb = std::mem::replace(&mut s.callback, Callback::None);
        s.release();
        self.reqs.free.push(idx);
        self.defer_completion(cb, result, info);
    }

    /// Complete the receive in slot `idx` (live, not done, no device copy, one host
    /// segment: the caller checked) with `info`: the small-message path of
    /// `complete_slot`, in line, for a request polled by its handle or finished by a
    /// plain function.
    #[inline(always)]
    pub(crate) fn complete_small(&mut self, idx: u32, len: usize, tag: u64) {
        let Some(s) = self.reqs.slots.get_mut(idx as usize) else {
            return;
        };
        match (&s.callback, &s.buf) {
            (Callback::None, _) if !s.detached => {
                let info = Info {
                    length: len,
                    tag,
                    value: 0,
                };
                s.done = true;
                self.inflight.leave(s);
                s.info = info;
                s.result = Ok(info);
            }
            (&Callback::Raw(f, user), Buf::One(_)) => {
                // Neither a plain function nor one segment needs a drop: forget them.
                s.done = true;
                self.inflight.leave(s);
                s.info = Info {
                    length: len,
                    tag,
                    value: 0,
                };
                s.live = false;
                std::mem::forget(std::mem::replace(&mut s.callback, Callback::None));
                std::mem::forget(std::mem::replace(&mut s.buf, Buf::EMPTY));
                self.reqs.free.push(idx);
                self.defer_raw_ok(
                    f,
                    user,
                    Info {
                        length: len,
                        tag,
                        value: 0,
                    },
                );
            }
            _ => {
                let info = Info {
                    length: len,
                    tag,
                    value: 0,
                };
                self.complete_slot(idx, Ok(info), info)
            }
        }
    }

    /// No handle refers to request `id` any more: free it now if it completed, else when
    /// it does.
    pub(crate) fn req_detach(&mut self, id: u64) {
        if let Some(s) = self.req(id) {
            if s.done {
                self.req_free(id);
            } else {
                s.detached = true;
            }
        }
    }

    /// For the end of a scope that started request `id`: whether it is still in flight.
    /// Then it is attached again (a request dropped inside a callback was detached), so
    /// that its result waits for the scope to take it; one that completed and that no one
    /// took (its `Request` was forgotten) is freed.
    pub(crate) fn req_reclaim(&mut self, id: u64) -> bool {
        let Some(s) = self.req(id) else { return false };
        if s.done {
            self.req_free(id);
            return false;
        }
        s.detached = false;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        State::for_test("req-test")
    }

    /// Start a request and finish it (completed, result taken): its slot is free again.
    fn start_and_finish(st: &mut State) -> u64 {
        let id = st.req_alloc(ReqKind::Send, None, Buf::EMPTY, Callback::None);
        st.complete(id, Ok(Info::default()));
        let (mut done, mut info) = (None, Info::default());
        st.take_result(id, &mut done, &mut info);
        assert!(done.is_some(), "request {id:#x} did not complete");
        id
    }

    #[test]
    fn a_slot_is_retired_at_the_last_generation_so_no_id_repeats() {
        let mut st = state();
        let first = start_and_finish(&mut st);
        let (_, idx) = split_id(first);
        // Bring the slot to the edge of its generations, as 2^32 - 3 reuses would.
        st.reqs.slots[idx as usize].generation = u32::MAX - 2;
        let a = start_and_finish(&mut st);
        let b = start_and_finish(&mut st);
        assert_eq!(split_id(a), (u32::MAX - 1, idx));
        assert_eq!(split_id(b), (u32::MAX, idx));
        // The next request may not wrap the slot back to generation 1 (the id `first`
        // had, which a forgotten handle or a scope could still hold): it gets another slot.
        let mut seen = std::collections::HashSet::from([first, a, b]);
        for _ in 0..4 {
            let c = start_and_finish(&mut st);
            assert_ne!(split_id(c).1, idx, "the retired slot was reused");
            assert!(seen.insert(c), "id {c:#x} issued twice");
        }
        // An old id names nothing: a wait or a reclaim on it sees no request.
        for old in [first, a, b] {
            assert!(st.req(old).is_none());
            assert!(!st.req_reclaim(old));
        }
        // A live request on another slot is not taken for an old id either.
        let live = st.req_alloc(ReqKind::Send, None, Buf::EMPTY, Callback::None);
        assert!(
            st.req_reclaim(live),
            "a request in flight is reclaimed as in flight"
        );
        assert!(!st.req_reclaim(make_id(1, idx)));
    }

    /// The counts `InFlight` keeps, against a scan of every slot (what keepalive and flush
    /// did before it).
    fn assert_counts_match_slots(st: &State) {
        let most = st.inflight.by_ep.len().max(8) as u32;
        for e in 0..most {
            let live = |out: bool| {
                st.reqs.slots.iter().any(|s| {
                    s.live
                        && !s.done
                        && s.ep == Some(e)
                        && (!out || matches!(s.kind, ReqKind::Send | ReqKind::Rma | ReqKind::Get))
                })
            };
            assert_eq!(
                st.inflight.outgoing(e),
                live(true),
                "endpoint {e}, outgoing"
            );
            assert_eq!(st.inflight.any(e), live(false), "endpoint {e}, any");
        }
    }

    fn noop(_: usize, _: Result<Info, Error>, _: Info) {}

    #[test]
    fn in_flight_counts_follow_requests_through_every_way_out() {
        let mut st = state();
        // A send, completed and taken.
        let send = st.req_alloc(ReqKind::Send, Some(3), Buf::EMPTY, Callback::None);
        assert!(st.inflight.outgoing(3) && st.inflight.any(3));
        assert_counts_match_slots(&st);
        st.complete(send, Ok(Info::default()));
        assert!(!st.inflight.any(3));
        assert_counts_match_slots(&st);
        // A receive for any endpoint, matched to 3, then to 5 (a wildcard's rendezvous),
        // completed in line.
        let recv = st.req_alloc(ReqKind::TagRecv, None, Buf::EMPTY, Callback::None);
        assert!(!st.inflight.any(3));
        st.req_set_ep(recv, 3);
        assert!(st.inflight.any(3) && !st.inflight.outgoing(3));
        assert_counts_match_slots(&st);
        st.req_set_ep(recv, 5);
        assert!(!st.inflight.any(3) && st.inflight.any(5));
        assert_counts_match_slots(&st);
        st.complete_small(split_id(recv).1, 0, 7);
        assert!(!st.inflight.any(5));
        assert_counts_match_slots(&st);
        // Matching a completed request counts nothing.
        st.req_set_ep(recv, 6);
        assert!(!st.inflight.any(6));
        // A get freed before it completed (an operation that failed to start).
        let get = st.req_alloc(ReqKind::Get, Some(2), Buf::EMPTY, Callback::None);
        assert!(st.inflight.outgoing(2));
        st.req_free(get);
        assert!(!st.inflight.any(2));
        assert_counts_match_slots(&st);
        // Puts with a plain callback: completed whole, and in line.
        let put = st.req_alloc(ReqKind::Rma, Some(2), Buf::EMPTY, Callback::Raw(noop, 0));
        let am = st.req_alloc(
            ReqKind::AmData,
            Some(4),
            Buf::One((0, 0)),
            Callback::Raw(noop, 0),
        );
        assert!(st.inflight.outgoing(2) && st.inflight.any(4) && !st.inflight.outgoing(4));
        assert_counts_match_slots(&st);
        st.complete(put, Ok(Info::default()));
        st.complete_small(split_id(am).1, 0, 0);
        assert!(!st.inflight.any(2) && !st.inflight.any(4));
        assert_counts_match_slots(&st);
        // A detached one frees itself at completion; two in flight on one endpoint.
        let a = st.req_alloc(ReqKind::Send, Some(1), Buf::EMPTY, Callback::None);
        let b = st.req_alloc(ReqKind::Rma, Some(1), Buf::EMPTY, Callback::None);
        st.req_detach(a);
        st.complete(a, Ok(Info::default()));
        assert!(st.inflight.outgoing(1), "b is still in flight");
        st.complete(b, Err(Status::Canceled.into()));
        assert!(!st.inflight.any(1));
        assert_counts_match_slots(&st);
    }
}
