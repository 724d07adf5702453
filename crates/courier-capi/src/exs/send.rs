//! The sending side of a Courier connection: the peer's advertisements and keys, eager
//! data under the peer's credits, direct placement with one put-with-signal per chunk.
//! (The protocol as a whole is described in `recv.rs`.)
//!
//! A send goes eagerly when it is small (at most the smaller of the two ends'
//! `EXS_F_SMALL_MAX`) and the credits allow; otherwise into the oldest advertisement that
//! is still good: SEQPACKET, the one for this message's number; STREAM, one posted after
//! the last eager chunk we sent (`Tx::drop_stale`). Sends wait, in order, for what they
//! need; `SENDQ_MAX` of them may wait per connection before `exs_send` says `EAGAIN`.

use std::collections::VecDeque;

use courier_core::{AmFlags, Buf, Callback, Error, Info, RemoteKey, SignalOp, Started};

use super::conn::{Conn, Phase, SockType, prefix, reset};
use super::sock::{Op, SendOp, State};
use super::wire::{self, Msg, word};
use super::{XResult, fail};

/// Sends waiting for credits or advertisements on one connection before `EAGAIN`.
pub(crate) const SENDQ_MAX: usize = 256;
/// An advertisement the sender holds.
pub(crate) struct LiveAdvert {
    slot: u16,
    key: u16,
    waitall: bool,
    addr: u64,
    len: u64,
    filled: u64,
    tag: u64,
}

#[derive(Default)]
pub(crate) struct Tx {
    pub next_chunk: u64,
    pub eager_sent: u64,
    pub grant: u64,
    pub used: u64,
    pub freed: u64,
    pub eager_max: usize,
    adverts: VecDeque<LiveAdvert>,
    last_tag: Option<u64>,
    keys: Vec<Option<RemoteKey>>,
    pub order: VecDeque<u64>,
    pub fin: bool,
    /// `exs_shutdown` SHUT_WR: no new sends; FIN goes once the waiting ones are issued.
    pub shut: bool,
    /// The peer shut its reading side down: our sends fail with `EPIPE`.
    pub peer_rd_shut: bool,
}

impl Tx {
    pub fn setup(&mut self, _ty: SockType, grant: u64, eager_max: usize, slots: usize) {
        self.grant = grant;
        self.eager_max = eager_max;
        self.keys = (0..slots).map(|_| None).collect();
    }

    fn credits(&self) -> u64 {
        self.grant.saturating_sub(self.used - self.freed)
    }

    /// Drop advertisements the sender can no longer use (they are a prefix: tags only grow).
    fn drop_stale(&mut self, ty: SockType) {
        let floor = match ty {
            SockType::Seqpacket => self.next_chunk,
            SockType::Stream => self.eager_sent,
        };
        while self.adverts.front().is_some_and(|a| a.tag < floor) {
            self.adverts.pop_front();
        }
    }
}

pub(crate) fn proto(what: impl Into<String>) -> super::Fail {
    fail(libc::EPROTO, what)
}

// ----- what the peer says ------------------------------------------------------------------

/// The peer's acknowledgement of our eager credits.
pub(crate) fn on_ack(c: &mut Conn, ack: u64) -> XResult<()> {
    if ack < c.tx.freed || ack > c.tx.used {
        return Err(proto(format!(
            "credit acknowledgement {ack} outside [{}, {}]",
            c.tx.freed, c.tx.used
        )));
    }
    c.tx.freed = ack;
    Ok(())
}

pub(crate) fn on_advert(c: &mut Conn, a: wire::Advert) -> XResult<()> {
    if c.tx.peer_rd_shut {
        return Err(proto("an advertisement after SHUT_RD"));
    }
    let slots = c.peer.as_ref().map_or(0, |p| p.slots);
    c.tx.drop_stale(c.ty);
    if a.slot as usize >= slots || a.key as usize >= slots {
        return Err(proto(format!(
            "advertisement slot {} / key {} of {slots}",
            a.slot, a.key
        )));
    }
    if c.tx.keys[a.key as usize].is_none() {
        return Err(proto(format!(
            "advertisement names key slot {} never filled",
            a.key
        )));
    }
    if c.tx.adverts.iter().any(|x| x.slot == a.slot) {
        return Err(proto(format!(
            "advertisement slot {} is still in use",
            a.slot
        )));
    }
    if a.len > word::LEN_MAX || a.addr.checked_add(a.len).is_none() {
        return Err(proto(format!(
            "advertisement of {} bytes at {:#x}",
            a.len, a.addr
        )));
    }
    let waitall = a.flags & wire::A_WAITALL != 0;
    match c.ty {
        SockType::Seqpacket => {
            if waitall || c.tx.last_tag.is_some_and(|t| a.tag <= t) {
                return Err(proto(format!(
                    "SEQPACKET advertisement for message {} out of order",
                    a.tag
                )));
            }
        }
        SockType::Stream => {
            if a.len == 0 || a.tag > c.tx.eager_sent || c.tx.last_tag.is_some_and(|t| a.tag < t) {
                return Err(proto(format!(
                    "STREAM advertisement of {} bytes after {} eager chunks (we sent {})",
                    a.len, a.tag, c.tx.eager_sent
                )));
            }
        }
    }
    tracing::debug!(
        "EXS advert in: slot {} len {} tag {} waitall {waitall} (sent eager {}, next chunk {})",
        a.slot,
        a.len,
        a.tag,
        c.tx.eager_sent,
        c.tx.next_chunk
    );
    c.tx.last_tag = Some(a.tag);
    c.tx.adverts.push_back(LiveAdvert {
        slot: a.slot,
        key: a.key,
        waitall,
        addr: a.addr,
        len: a.len,
        filled: 0,
        tag: a.tag,
    });
    c.tx.drop_stale(c.ty);
    Ok(())
}

pub(crate) fn on_key(c: &mut Conn, slot: u16, key: &[u8]) -> XResult<()> {
    let slots = c.peer.as_ref().map_or(0, |p| p.slots);
    if slot as usize >= slots {
        return Err(proto(format!("key slot {slot} of {slots}")));
    }
    c.tx.drop_stale(c.ty);
    if c.tx.adverts.iter().any(|a| a.key == slot) {
        return Err(proto(format!(
            "key slot {slot} replaced while an advertisement uses it"
        )));
    }
    let k =
        c.ep.rkey_unpack(key)
            .map_err(|e| proto(format!("the peer's key for slot {slot}: {e}")))?;
    c.tx.keys[slot as usize] = Some(k);
    Ok(())
}

/// `exs_send` on a Courier connection.
///
/// `segs`: `exs_sendmsg`'s iovecs (non-empty ones, each inside the registration), gathered
/// by Courier into each chunk (`op.buf` is then the `msghdr`, for the event); `None`: the
/// contiguous `[op.buf, op.buf + op.len)`.
pub(crate) fn post_send(
    st: &mut State,
    c: &mut Conn,
    mut op: Op,
    segs: Option<Vec<(usize, usize)>>,
) -> XResult<()> {
    let refuse = |st: &mut State, op: &Op, e: super::Fail| {
        op.q.unreserve();
        if op.mh != 0
            && let Some(m) = st.mems.get_mut(&op.mh)
        {
            m.busy -= 1;
        }
        Err(e)
    };
    if let Err(e) = c.usable(true) {
        return refuse(st, &op, e);
    }
    if c.tx.order.len() >= SENDQ_MAX {
        let e = fail(
            libc::EAGAIN,
            format!("{SENDQ_MAX} sends already wait for the peer's credits or advertisements"),
        );
        return refuse(st, &op, e);
    }
    if c.ty == SockType::Stream && op.len == 0 {
        st.finish(op, 0, 0);
        return Ok(());
    }
    let mut inline = None;
    let mut posted = false;
    if op.len <= c.opts.inline_max && op.len > 0 {
        let mut copy = Vec::with_capacity(op.len);
        let one = [(op.buf, op.len)];
        for &(at, n) in segs.as_deref().unwrap_or(&one) {
            // SAFETY: checked against its registration; the caller's until this call
            // returns.
            copy.extend_from_slice(unsafe { std::slice::from_raw_parts(at as *const u8, n) });
        }
        inline = Some(copy);
        // The copy is ours: the event now, the registration free now.
        let now = Op {
            q: op.q.clone(),
            ..op
        };
        st.finish(now, op.len as isize, 0);
        op.mh = 0;
        posted = true;
    }
    st.next_send += 1;
    let id = st.next_send;
    st.sends.insert(
        id,
        SendOp {
            op,
            off: 0,
            inflight: 0,
            inline,
            segs,
            posted,
            issued: false,
            error: None,
        },
    );
    c.tx.order.push_back(id);
    pump(st, c);
    Ok(())
}

/// Issue what can be issued of the waiting sends, in order.
pub(crate) fn pump(st: &mut State, c: &mut Conn) {
    if !matches!(c.phase, Phase::Open) || c.err.is_some() || c.peer.is_none() || c.peer_closed {
        return;
    }
    while let Some(&id) = c.tx.order.front() {
        let step = match c.ty {
            SockType::Seqpacket => step_msg(st, c, id),
            SockType::Stream => step_stream(st, c, id),
        };
        match step {
            Ok(true) => {
                c.tx.order.pop_front();
                if let Some(s) = st.sends.get_mut(&id) {
                    s.issued = true;
                }
                st.send_settle(id);
            }
            Ok(false) => break,
            Err(e) => {
                reset(st, c, e);
                return;
            }
        }
    }
    if c.tx.shut
        && !c.tx.fin
        && c.tx.order.is_empty()
        && let Err(e) = send_fin(c)
    {
        reset(st, c, e);
    }
}

/// `exs_shutdown` SHUT_WR: the sends already started go first, then our end of the stream.
pub(crate) fn shutdown_wr(st: &mut State, c: &mut Conn) {
    c.tx.shut = true;
    pump(st, c);
}

/// The peer shut its reading side down: its advertisements are void, our waiting sends
/// and every later one fail with `EPIPE`; it learns that nothing more will be written into
/// its buffers.
pub(crate) fn on_peer_shut_rd(st: &mut State, c: &mut Conn) -> XResult<()> {
    if c.tx.peer_rd_shut {
        return Err(proto("a second SHUT_RD"));
    }
    c.tx.peer_rd_shut = true;
    peer_gone(st, c, libc::EPIPE);
    super::conn::send_ctl(c, wire::K_SHUT_RD_ACK, &Msg::ShutRdAck)
}

fn send_of(st: &State, id: u64) -> XResult<(usize, usize)> {
    let s = st
        .sends
        .get(&id)
        .ok_or_else(|| fail(libc::EIO, "a waiting send vanished"))?;
    Ok((s.op.len, s.off))
}

fn buf_len(b: &Buf) -> usize {
    match b {
        Buf::One((_, n)) => *n,
        Buf::Many(v) => v.iter().map(|s| s.1).sum(),
    }
}

/// Bytes `[off, off + n)` of send `id`, as Courier takes them.
fn piece(st: &State, id: u64, off: usize, n: usize) -> XResult<Buf> {
    st.sends
        .get(&id)
        .map(|s| s.piece(off, n))
        .ok_or_else(|| fail(libc::EIO, "a waiting send vanished"))
}

/// SEQPACKET: the whole message eagerly, or into its advertisement; `false`: wait.
fn step_msg(st: &mut State, c: &mut Conn, id: u64) -> XResult<bool> {
    let (len, _) = send_of(st, id)?;
    let m = c.tx.next_chunk;
    c.tx.drop_stale(SockType::Seqpacket);
    if len <= c.tx.eager_max && c.tx.credits() >= 1 {
        let data = piece(st, id, 0, len)?;
        eager(st, c, id, data, m)?;
        c.tx.used += 1;
        c.tx.next_chunk += 1;
        return Ok(true);
    }
    let Some(a) = c.tx.adverts.front().filter(|a| a.tag == m) else {
        return Ok(false);
    };
    let n = (len as u64).min(a.len);
    let value = word::make(m, n, len as u64 > a.len);
    let (slot, key, addr) = (a.slot, a.key, a.addr);
    c.tx.adverts.pop_front();
    let data = piece(st, id, 0, n as usize)?;
    if super::place::wanted(c, n) {
        super::place::send_place(st, c, id, data, slot, value)?;
    } else {
        direct(st, c, id, data, addr, key, slot, value)?;
    }
    c.tx.next_chunk += 1;
    Ok(true)
}

/// STREAM: as many chunks as can go now; `true` once every byte is issued.
fn step_stream(st: &mut State, c: &mut Conn, id: u64) -> XResult<bool> {
    loop {
        let (len, off) = send_of(st, id)?;
        if off == len {
            return Ok(true);
        }
        c.tx.drop_stale(SockType::Stream);
        let rem = len - off;
        let credits = c.tx.credits();
        let small = rem <= c.tx.eager_max;
        let n = if small && credits >= rem as u64 {
            rem
        } else if let Some(a) = c.tx.adverts.front_mut() {
            let n = (rem as u64).min(a.len - a.filled);
            let at = a.addr + a.filled;
            // The whole advertisement in this one chunk: by PLACE if worth it.
            let whole = a.filled == 0 && (!a.waitall || n == a.len);
            a.filled += n;
            let value = word::make(c.tx.next_chunk, a.filled, false);
            let (slot, key) = (a.slot, a.key);
            if !a.waitall || a.filled == a.len {
                c.tx.adverts.pop_front();
            }
            let chunk = c.tx.next_chunk;
            c.tx.next_chunk = chunk + 1;
            let data = piece(st, id, off, n as usize)?;
            if whole && super::place::wanted(c, n) {
                super::place::send_place(st, c, id, data, slot, value)?;
            } else {
                direct(st, c, id, data, at, key, slot, value)?;
            }
            if let Some(s) = st.sends.get_mut(&id) {
                s.off += n as usize;
            }
            continue;
        } else if small && credits > 0 {
            credits as usize
        } else {
            return Ok(false);
        };
        let chunk = c.tx.next_chunk;
        let data = piece(st, id, off, n)?;
        eager(st, c, id, data, chunk)?;
        c.tx.next_chunk += 1;
        c.tx.eager_sent += 1;
        c.tx.used += n as u64;
        if let Some(s) = st.sends.get_mut(&id) {
            s.off += n;
        }
    }
}

/// A Courier operation of send `id` completed (inside progress).
pub(crate) fn piece_done(token: usize, r: Result<Info, Error>, _: Info) {
    let Some(l) = super::lib_opt() else { return };
    let mut st = l.st();
    let Some(id) = st.tokens.remove(&token) else {
        return;
    };
    if let Some(s) = st.sends.get_mut(&id) {
        s.inflight = s.inflight.saturating_sub(1);
        if let Err(e) = r {
            s.error.get_or_insert(e.into());
        }
    }
    st.send_settle(id);
}

pub(crate) fn started(
    st: &mut State,
    id: u64,
    token: usize,
    r: Result<Started, Error>,
) -> XResult<()> {
    match r {
        Ok(Started::Done(_)) => {
            st.tokens.remove(&token);
            Ok(())
        }
        Ok(Started::Pending(_)) => {
            if let Some(s) = st.sends.get_mut(&id) {
                s.inflight += 1;
            }
            Ok(())
        }
        Err(e) => {
            st.tokens.remove(&token);
            Err(e.into())
        }
    }
}

fn eager(st: &mut State, c: &mut Conn, id: u64, data: Buf, chunk: u64) -> XResult<()> {
    tracing::debug!(
        "EXS eager out: chunk {chunk} {} bytes (credits {})",
        buf_len(&data),
        c.tx.credits()
    );
    let hdr = wire::encode(prefix(c, wire::K_DATA, 0), &Msg::Data { chunk });
    let flags = AmFlags {
        eager: true,
        ..AmFlags::default()
    };
    send_am(st, c, id, &hdr, data, flags)
}

/// Send EXS message `hdr` with `data` (send `id`'s bytes) as one Courier active message;
/// its completion reaches `piece_done`.
pub(crate) fn send_am(
    st: &mut State,
    c: &mut Conn,
    id: u64,
    hdr: &[u8],
    data: Buf,
    flags: AmFlags,
) -> XResult<()> {
    let token = st.token(id);
    // SAFETY: the bytes are the caller's registered buffer or our inline copy, both kept
    // until this send's event (the send stays in `st.sends` while Courier holds them).
    let r = unsafe {
        c.ep.am_send_raw(
            wire::AM_ID,
            hdr,
            data,
            flags,
            Callback::Raw(piece_done, token),
        )
    };
    started(st, id, token, r)
}

#[allow(clippy::too_many_arguments)]
fn direct(
    st: &mut State,
    c: &mut Conn,
    id: u64,
    data: Buf,
    addr: u64,
    key: u16,
    slot: u16,
    value: u64,
) -> XResult<()> {
    let Some(peer) = c.peer.as_ref() else {
        return Err(fail(libc::ENOTCONN, "no peer"));
    };
    let Some(k) = c.tx.keys.get(key as usize).and_then(|k| k.as_ref()) else {
        return Err(proto(format!("key slot {key} empty")));
    };
    let sig = peer.words + slot as u64 * 8;
    tracing::debug!(
        "EXS direct out: {} bytes at {addr:#x} slot {slot} word {value:#x}",
        buf_len(&data)
    );
    let token = st.token(id);
    // SAFETY: as `eager`: the source stays valid until the send's event.
    let r = unsafe {
        c.ep.put_signal_raw(
            data,
            addr,
            k,
            sig,
            &peer.words_key,
            value,
            SignalOp::Set,
            Callback::Raw(piece_done, token),
        )
    };
    started(st, id, token, r)
}

// ----- the end ----------------------------------------------------------------------------

/// Sends not issued whole end with `ECANCELED` (exs_close).
pub(crate) fn cancel_sends(st: &mut State, c: &mut Conn) {
    end_sends(st, c, libc::ECANCELED);
}

fn end_sends(st: &mut State, c: &mut Conn, errno: i32) {
    for id in c.tx.order.drain(..) {
        if let Some(s) = st.sends.get_mut(&id) {
            s.issued = true;
            s.error.get_or_insert(fail(errno, "connection ended"));
        }
        st.send_settle(id);
    }
}

/// The peer closed: its advertisements are void and our waiting sends go nowhere.
pub(crate) fn peer_gone(st: &mut State, c: &mut Conn, errno: i32) {
    c.tx.adverts.clear();
    end_sends(st, c, errno);
}

/// Our end of the stream, in order after every chunk.
pub(crate) fn send_fin(c: &mut Conn) -> XResult<()> {
    if c.tx.fin {
        return Ok(());
    }
    c.tx.fin = true;
    let p = prefix(c, wire::K_DATA, wire::F_FIN);
    let hdr = wire::encode(
        p,
        &Msg::Data {
            chunk: c.tx.next_chunk,
        },
    );
    // SAFETY: no data; the header is copied during the call.
    unsafe {
        c.ep.am_send_raw(
            wire::AM_ID,
            &hdr,
            Buf::One((0, 0)),
            AmFlags::default(),
            Callback::Raw(|_, _, _| {}, 0),
        )
    }?;
    Ok(())
}
