//! The receiving side of a Courier connection (advertisements, eager data in, credits),
//! and the protocol as a whole; the sending side is `send.rs`.
//!
//! Receiver (`Rx`): every receive posted is advertised to the peer (ADVERT: the buffer's
//! address and length, and a key slot; a KEY message first puts the registration's remote
//! key into that slot of the peer's cache), at most `EXS_F_ADV_CREDITS` at once, in the
//! order they were posted. Each advertisement has a signal word here, which the sender sets
//! when it has written into the buffer (`wire::word`), with one put-with-signal.
//!
//! Sender (`Tx`): chunks (SEQPACKET: messages) are numbered. A send goes eagerly (DATA, its
//! bytes in the message) when it is small and the receiver's credits allow; otherwise it
//! goes into the oldest advertisement that is still good. The receiver takes chunks in
//! number order, whichever way each came, so the two ways never overtake each other.
//! - SEQPACKET: receive r takes message r; the advertisement says r, and is good for
//!   message r only (a message sent eagerly makes its advertisement void).
//! - STREAM: an advertisement says how many eager chunks the receiver had seen when it
//!   was posted; it is good while the sender has sent no eager chunk since (an eager chunk
//!   in flight would have to come first). The receiver, taking an eager chunk, knows every
//!   advertisement out is void, and advertises its pending receives again. A WAITALL
//!   receive's advertisement is filled chunk by chunk until full.
//!
//! Credits: the receiver grants `EXS_F_RCVBUF` bytes (STREAM) or `EXS_F_SMALL_SLOTS`
//! messages (SEQPACKET) of eager data; it acknowledges what it freed in every message it
//! sends (and in a CREDIT message when a quarter of the grant is owed). Everything the peer
//! says is checked: chunk numbers, slots, keys, lengths, credits; a lie resets the
//! connection (`EPROTO`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use super::conn::{Conn, Opts, Phase, SockType, reset, send_ctl};
use super::msg::{MsgRecv, end_recv, refuse_recv};
use super::sock::{Op, State};
use super::wire::{self, Msg, word};
use super::{XResult, fail};

/// How far ahead of the next expected chunk an eager chunk may be numbered.
const CHUNK_WINDOW: u64 = 1 << 20;

/// A receive's advertisement.
#[derive(Clone, Copy)]
pub(crate) struct RecvAdv {
    pub slot: u16,
    key: u16,
    /// Bytes the receive had when advertised (the advertisement covers the rest).
    pub base: usize,
    /// The signal word's value last taken.
    pub seen: u64,
    /// A PLACE copying into it (`place.rs`): its token.
    pub placing: Option<usize>,
}

pub(crate) struct RecvOp {
    op: Op,
    /// `exs_recvmsg`: its msghdr, and the iovecs a staging buffer scatters into.
    msg: Option<Box<MsgRecv>>,
    got: usize,
    waitall: bool,
    msgno: u64,
    adv: Option<RecvAdv>,
}

struct Stashed {
    chunk: u64,
    data: Vec<u8>,
    fin: bool,
}

pub(crate) struct Rx {
    /// Eager credits we grant (STREAM bytes, SEQPACKET messages).
    pub grant: u64,
    small_max: usize,
    recv_no: u64,
    next_chunk: u64,
    eager_seen: u64,
    last_eager: Option<u64>,
    got_units: u64,
    pub freed: u64,
    pub told: u64,
    recvs: VecDeque<RecvOp>,
    stash: VecDeque<Stashed>,
    sbuf: VecDeque<u8>,
    slots: Vec<bool>,
    /// The peer's key cache, as we filled it: registration and live advertisements using it.
    keys: Vec<Option<(u64, u32)>>,
    live: usize,
    eof: bool,
    watched: bool,
    /// `exs_shutdown` SHUT_RD: where it stands.
    pub rd_shut: RdShut,
}

/// Our reading side's shutdown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RdShut {
    Open,
    /// SHUT_RD went to the peer; its SHUT_RD_ACK has not come (it may still be writing
    /// into our advertised buffers).
    Waiting,
    /// Nothing more is written into our buffers: receives take what has arrived, then
    /// complete with the end of the stream.
    Done,
}

impl Rx {
    pub fn new(ty: SockType, o: &Opts) -> Rx {
        let grant = match ty {
            SockType::Stream if o.no_rcvbuf => 0,
            SockType::Stream => o.rcvbuf as u64,
            SockType::Seqpacket => o.slots as u64,
        };
        Rx {
            grant,
            small_max: o.small_max,
            recv_no: 0,
            next_chunk: 0,
            eager_seen: 0,
            last_eager: None,
            got_units: 0,
            freed: 0,
            told: 0,
            recvs: VecDeque::new(),
            stash: VecDeque::new(),
            sbuf: VecDeque::new(),
            slots: vec![false; o.adv],
            keys: vec![None; o.adv],
            live: 0,
            eof: false,
            watched: false,
            rd_shut: RdShut::Open,
        }
    }
}

impl Rx {
    /// The receive advertised in `slot`: its index, buffer, length, bytes got, and the
    /// advertisement.
    pub fn find_adv(&self, slot: u16) -> Option<(usize, usize, usize, usize, RecvAdv)> {
        self.recvs.iter().enumerate().find_map(|(i, r)| {
            let a = r.adv.filter(|a| a.slot == slot)?;
            Some((i, r.op.buf, r.op.len, r.got, a))
        })
    }

    pub fn recvs_adv_mut(&mut self, i: usize) -> Option<&mut RecvAdv> {
        self.recvs.get_mut(i)?.adv.as_mut()
    }

    /// The receive whose placement has `token`.
    pub fn find_placing(&self, token: usize) -> Option<usize> {
        self.recvs
            .iter()
            .position(|r| r.adv.is_some_and(|a| a.placing == Some(token)))
    }
}

/// Set advertisement `slot`'s signal word ourselves (a placement done: `place.rs`).
pub(crate) fn signal(c: &Conn, slot: u16, value: u64) {
    word_at(c, slot).store(value, Ordering::Release);
}

/// End receive `r`: its event now, or once its placement lets go of its buffer.
fn end_op(st: &mut State, r: RecvOp, placing: Option<usize>, result: isize, flags: i32) {
    let h = super::place::Held {
        op: r.op,
        msg: r.msg,
        result,
        flags,
    };
    let h = match placing {
        Some(t) => super::place::hold(st, t, h),
        None => Some(h),
    };
    if let Some(h) = h {
        end_recv(st, h.op, h.msg, h.result, h.flags);
    }
}

impl Conn {
    /// A mark that moves whenever the receive side delivers something.
    pub fn rx_progress(&self) -> (u64, usize) {
        (self.rx.next_chunk, self.rx.recvs.len())
    }

    /// Whether the peer wrote the front receive's signal word since we last looked.
    pub fn word_changed(&self) -> bool {
        self.rx
            .recvs
            .front()
            .and_then(|r| r.adv)
            .is_some_and(|a| word_at(self, a.slot).load(Ordering::SeqCst) != a.seen)
    }
}

use super::send::proto;

/// Eager data (or FIN) from the peer.
pub(crate) fn on_data(
    st: &mut State,
    c: &mut Conn,
    chunk: u64,
    fin: bool,
    data: &[u8],
) -> XResult<()> {
    let rx = &mut c.rx;
    if rx.eof || rx.stash.back().is_some_and(|s| s.fin) {
        return Err(proto("data after FIN"));
    }
    if chunk < rx.next_chunk
        || chunk - rx.next_chunk >= CHUNK_WINDOW
        || rx.last_eager.is_some_and(|l| chunk <= l)
    {
        return Err(proto(format!(
            "chunk {chunk} out of order (next {}, last eager {:?})",
            rx.next_chunk, rx.last_eager
        )));
    }
    if fin {
        if !data.is_empty() {
            return Err(proto("FIN with data"));
        }
        rx.stash.push_back(Stashed {
            chunk,
            data: Vec::new(),
            fin: true,
        });
        process(st, c);
        return Ok(());
    }
    let units = match c.ty {
        SockType::Seqpacket => 1,
        SockType::Stream => data.len() as u64,
    };
    if data.len() > rx.small_max || (c.ty == SockType::Stream && data.is_empty()) {
        return Err(proto(format!(
            "eager chunk of {} bytes (largest {})",
            data.len(),
            rx.small_max
        )));
    }
    // Credits count as returned once a message told the peer (`told`), not when the
    // program took the data (`freed`): a peer that sent before it could know of a freed
    // slot overdrew, whether or not that slot was freed by the time its data came.
    if rx.got_units + units - rx.told > rx.grant {
        return Err(proto(format!(
            "eager data beyond the credits granted ({} unacknowledged of {}, {units} more)",
            rx.got_units - rx.told,
            rx.grant
        )));
    }
    rx.got_units += units;
    rx.last_eager = Some(chunk);
    let now = chunk == rx.next_chunk && rx.stash.is_empty();
    if !(now && deliver_eager(st, c, data)) {
        c.rx.stash.push_back(Stashed {
            chunk,
            data: data.to_vec(),
            fin: false,
        });
    }
    process(st, c);
    Ok(())
}

// ----- delivery, in chunk order --------------------------------------------------------------

fn word_at(c: &Conn, slot: u16) -> &AtomicU64 {
    let p = c.words.as_ptr().wrapping_add(slot as usize * 8) as *mut u64;
    // SAFETY: the words region holds one aligned u64 per slot (slot < adv, allocated by
    // Courier on a page), lives as long as the connection, and is only used atomically.
    unsafe { AtomicU64::from_ptr(p) }
}

/// Give a receive's advertisement back (its slot and key reference).
fn unadvertise(rx: &mut Rx, adv: RecvAdv) {
    rx.slots[adv.slot as usize] = false;
    if let Some((_, refs)) = rx.keys[adv.key as usize].as_mut() {
        *refs = refs.saturating_sub(1);
    }
    rx.live -= 1;
}

fn complete_front(st: &mut State, c: &mut Conn, result: usize, flags: i32) {
    if let Some(mut r) = c.rx.recvs.pop_front() {
        let mut placing = None;
        if let Some(a) = r.adv.take() {
            placing = a.placing;
            unadvertise(&mut c.rx, a);
        }
        end_op(st, r, placing, result as isize, flags);
    }
}

fn copy_into(op: &Op, at: usize, data: &[u8]) {
    if data.is_empty() {
        // A zero-length receive may have no buffer at all (NULL).
        return;
    }
    // SAFETY: `[op.buf, op.buf + op.len)` was checked against its registration when the
    // receive was posted and stays the caller's until its event; `at + data.len() <= len`.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), (op.buf + at) as *mut u8, data.len()) };
}

/// Take eager chunk `next_chunk`; false if it must wait (SEQPACKET: no receive yet).
fn deliver_eager(st: &mut State, c: &mut Conn, data: &[u8]) -> bool {
    match c.ty {
        SockType::Seqpacket => {
            let Some(r) = c.rx.recvs.front() else {
                return false;
            };
            let n = r.op.len.min(data.len());
            copy_into(&r.op, 0, &data[..n]);
            let flags = if data.len() > r.op.len {
                libc::MSG_TRUNC
            } else {
                0
            };
            complete_front(st, c, n, flags);
            c.rx.freed += 1;
            c.rx.next_chunk += 1;
            true
        }
        SockType::Stream => {
            let rx = &mut c.rx;
            rx.eager_seen += 1;
            rx.next_chunk += 1;
            // Every advertisement out is void now: the sender sent this chunk after them.
            for i in 0..rx.recvs.len() {
                if let Some(a) = rx.recvs[i].adv.take() {
                    unadvertise(rx, a);
                }
            }
            let mut off = 0;
            while off < data.len() {
                let Some(r) = c.rx.recvs.front_mut() else {
                    break;
                };
                let n = (r.op.len - r.got).min(data.len() - off);
                copy_into(&r.op, r.got, &data[off..off + n]);
                r.got += n;
                off += n;
                if !r.waitall || r.got == r.op.len {
                    let got = r.got;
                    complete_front(st, c, got, 0);
                }
            }
            c.rx.freed += off as u64;
            c.rx.sbuf.extend(&data[off..]);
            true
        }
    }
}

/// The front receive's signal word, if the sender wrote into its buffer since we looked.
fn direct_step(st: &mut State, c: &mut Conn) -> XResult<bool> {
    let Some(r) = c.rx.recvs.front() else {
        return Ok(false);
    };
    let Some(adv) = r.adv else { return Ok(false) };
    let v = word_at(c, adv.slot).load(Ordering::Acquire);
    if v == adv.seen {
        return Ok(false);
    }
    let Some((low, filled, trunc)) = word::parse(v) else {
        return Err(proto(format!("signal word {v:#x} without its valid bit")));
    };
    let room = (r.op.len - adv.base) as u64;
    let next = c.rx.next_chunk;
    match c.ty {
        SockType::Seqpacket => {
            if low != next & word::CHUNK_MASK || filled > room || (trunc && filled != room) {
                return Err(proto(format!(
                    "signal word for message {low} ({filled} bytes, truncated {trunc}) where message {next} of at most {room} bytes was due"
                )));
            }
            c.rx.next_chunk += 1;
            complete_front(
                st,
                c,
                filled as usize,
                if trunc { libc::MSG_TRUNC } else { 0 },
            );
        }
        SockType::Stream => {
            let k = word::chunks_through(next, low);
            let prev = (r.got - adv.base) as u64;
            let bad = trunc
                || k.is_none()
                || filled <= prev
                || filled > room
                || (!r.waitall && k != Some(1));
            if bad {
                return Err(proto(format!(
                    "signal word (chunk {low}, {filled} bytes) where chunk {next} was due into {room} bytes ({prev} filled)"
                )));
            }
            c.rx.next_chunk += k.unwrap_or(1);
            let waitall = r.waitall;
            let len = r.op.len;
            if let Some(r) = c.rx.recvs.front_mut() {
                r.got = adv.base + filled as usize;
                if let Some(a) = r.adv.as_mut() {
                    a.seen = v;
                }
                if !waitall || r.got == len {
                    let got = r.got;
                    complete_front(st, c, got, 0);
                }
            }
        }
    }
    Ok(true)
}

/// Deliver whatever has arrived, in chunk order, then advertise and acknowledge.
pub(crate) fn process(st: &mut State, c: &mut Conn) {
    if deliver(st, c) {
        tell(st, c);
    }
}

/// Deliver whatever has arrived, in chunk order (nothing is sent); whether the connection
/// is still good.
fn deliver(st: &mut State, c: &mut Conn) -> bool {
    if c.dead_slot || c.err.is_some() {
        return false;
    }
    loop {
        let due =
            c.rx.stash
                .front()
                .is_some_and(|s| s.chunk == c.rx.next_chunk);
        if due {
            if c.rx.stash.front().is_some_and(|s| s.fin) {
                c.rx.stash.pop_front();
                c.rx.eof = true;
                break;
            }
            if c.ty == SockType::Seqpacket && c.rx.recvs.is_empty() {
                break;
            }
            let Some(s) = c.rx.stash.pop_front() else {
                break;
            };
            deliver_eager(st, c, &s.data);
            continue;
        }
        match direct_step(st, c) {
            Ok(true) => continue,
            Ok(false) => break,
            Err(e) => {
                reset(st, c, e);
                return false;
            }
        }
    }
    if c.rx.eof || c.rx.rd_shut == RdShut::Done {
        // End of the peer's data (or of our reading): what is pending completes with what
        // it got (0: end), flagged.
        while let Some(r) = c.rx.recvs.front() {
            let got = r.got;
            complete_front(st, c, got, super::abi::EXS_MSG_EOF);
        }
    }
    true
}

/// Advertise the receives waiting, acknowledge credits, and watch the signal words while
/// advertisements are out.
fn tell(st: &mut State, c: &mut Conn) {
    if let Err(e) = advertise(st, c) {
        reset(st, c, e);
        return;
    }
    if let Err(e) = flush_credits(c) {
        reset(st, c, e);
        return;
    }
    let live = c.rx.live > 0;
    if live != c.rx.watched {
        c.rx.watched = live;
        if live {
            st.watch.push(c.r);
        } else {
            st.watch.retain(|&r| r != c.r);
        }
    }
}

/// Advertise the pending receives not advertised yet, in order.
fn advertise(st: &mut State, c: &mut Conn) -> XResult<()> {
    if !matches!(c.phase, Phase::Open) || c.peer_closed || c.rx.eof || c.rx.rd_shut != RdShut::Open
    {
        return Ok(());
    }
    for i in 0..c.rx.recvs.len() {
        if c.rx.recvs[i].adv.is_some() {
            continue;
        }
        let Some(slot) = c.rx.slots.iter().position(|u| !u) else {
            break;
        };
        let r = &c.rx.recvs[i];
        let room = r.op.len - r.got;
        // A zero-length receive (SEQPACKET: it takes a message whole and places nothing)
        // may hold no registration, nor a buffer: it advertises 0 bytes of ours.
        let (mh, addr) = if room == 0 {
            st.zero_mem(&super::lib()?.ctx)?
        } else {
            (r.op.mh, r.op.buf + r.got)
        };
        let Some(key) = ensure_key(st, c, mh)? else {
            break;
        };
        let r = &c.rx.recvs[i];
        let a = wire::Advert {
            slot: slot as u16,
            key,
            flags: if r.waitall { wire::A_WAITALL } else { 0 },
            addr: addr as u64,
            len: room as u64,
            tag: match c.ty {
                SockType::Seqpacket => r.msgno,
                SockType::Stream => c.rx.eager_seen,
            },
        };
        let base = r.got;
        word_at(c, slot as u16).store(0, Ordering::Relaxed);
        c.rx.slots[slot] = true;
        c.rx.live += 1;
        if let Some((_, refs)) = c.rx.keys[key as usize].as_mut() {
            *refs += 1;
        }
        c.rx.recvs[i].adv = Some(RecvAdv {
            slot: slot as u16,
            key,
            base,
            seen: 0,
            placing: None,
        });
        tracing::debug!(
            "EXS advert out: slot {slot} len {} tag {} waitall {}",
            a.len,
            a.tag,
            a.flags
        );
        send_ctl(c, wire::K_ADVERT, &Msg::Advert(a))?;
    }
    Ok(())
}

/// The peer's key-cache slot holding registration `mh`'s key (sent now if it is not there);
/// `None` if every slot is in use.
fn ensure_key(st: &mut State, c: &mut Conn, mh: u64) -> XResult<Option<u16>> {
    let keys = &c.rx.keys;
    if let Some(i) = keys.iter().position(|k| k.is_some_and(|(m, _)| m == mh)) {
        return Ok(Some(i as u16));
    }
    let free = keys.iter().position(|k| k.is_none()).or_else(|| {
        keys.iter()
            .position(|k| k.is_some_and(|(_, refs)| refs == 0))
    });
    let Some(i) = free else { return Ok(None) };
    let m = st
        .key_mem(mh)
        .ok_or_else(|| fail(libc::EINVAL, format!("registration {mh} is gone")))?;
    let key = m.mem.pack_rkey()?;
    c.rx.keys[i] = Some((mh, 0));
    send_ctl(
        c,
        wire::K_KEY,
        &Msg::Key {
            slot: i as u16,
            key,
        },
    )?;
    Ok(Some(i as u16))
}

/// Tell the peer what we freed, when a quarter of the grant is owed (other messages carry
/// it too).
fn flush_credits(c: &mut Conn) -> XResult<()> {
    let owed = c.rx.freed - c.rx.told;
    if owed == 0
        || owed < (c.rx.grant / 4).max(1)
        || c.peer_closed
        || !matches!(c.phase, Phase::Open)
    {
        return Ok(());
    }
    send_ctl(c, wire::K_CREDIT, &Msg::Credit)
}

// ----- shutdown ------------------------------------------------------------------------------

/// `exs_shutdown` SHUT_RD: the peer is told to write into our buffers no more (its sends
/// then fail with `EPIPE`); once it answers, pending receives take what has arrived and
/// complete with the end of the stream, and so do later ones. A peer that already ended
/// its data (FIN) or closed writes nothing more: at once.
pub(crate) fn shutdown_rd(st: &mut State, c: &mut Conn) -> XResult<()> {
    if c.rx.rd_shut != RdShut::Open {
        return Ok(());
    }
    if c.rx.eof || c.peer_closed {
        c.rx.rd_shut = RdShut::Done;
    } else {
        c.rx.rd_shut = RdShut::Waiting;
        send_ctl(c, wire::K_SHUT_RD, &Msg::ShutRd)?;
    }
    process(st, c);
    Ok(())
}

/// The peer's answer to our SHUT_RD: everything it wrote into our buffers is in place.
pub(crate) fn on_shut_rd_ack(st: &mut State, c: &mut Conn) -> XResult<()> {
    if c.rx.rd_shut != RdShut::Waiting {
        return Err(proto("SHUT_RD_ACK without a SHUT_RD"));
    }
    c.rx.rd_shut = RdShut::Done;
    process(st, c);
    Ok(())
}

// ----- the calls ---------------------------------------------------------------------------

/// `exs_recv` on a Courier connection.
///
/// `msg`: `exs_recvmsg`'s side (`op.buf` is then where the data goes: the caller's one
/// buffer, or a staging buffer scattered into its iovecs at completion).
pub(crate) fn post_recv(
    st: &mut State,
    c: &mut Conn,
    op: Op,
    waitall: bool,
    msg: Option<Box<MsgRecv>>,
) -> XResult<()> {
    if let Err(e) = c.usable(false) {
        refuse_recv(st, op, msg);
        return Err(e);
    }
    if c.ty == SockType::Seqpacket
        && op.len == 0
        && let Err(e) = super::lib().and_then(|l| st.zero_mem(&l.ctx).map(|_| ()))
    {
        // Made now, so that a failure is this call's, not the connection's.
        refuse_recv(st, op, msg);
        return Err(e);
    }
    let mut got = 0;
    if c.ty == SockType::Stream {
        if op.len == 0 {
            end_recv(st, op, msg, 0, 0);
            return Ok(());
        }
        if c.rx.recvs.is_empty() && !c.rx.sbuf.is_empty() {
            let n = op.len.min(c.rx.sbuf.len());
            let (a, b) = c.rx.sbuf.as_slices();
            let na = n.min(a.len());
            copy_into(&op, 0, &a[..na]);
            copy_into(&op, na, &b[..n - na]);
            c.rx.sbuf.drain(..n);
            c.rx.freed += n as u64;
            got = n;
            if !waitall || got == op.len {
                end_recv(st, op, msg, got as isize, 0);
                process(st, c);
                return Ok(());
            }
        }
    }
    let msgno = c.rx.recv_no;
    c.rx.recv_no += 1;
    c.rx.recvs.push_back(RecvOp {
        op,
        msg,
        got,
        waitall: waitall && c.ty == SockType::Stream,
        msgno,
        adv: None,
    });
    // What has arrived is delivered now. Its advertisement goes from the thread
    // progressing, if one is (this thread would wait for the worker it holds); from here
    // otherwise.
    if super::engine::defer(st, c.r) {
        deliver(st, c);
    } else {
        process(st, c);
    }
    Ok(())
}

/// Every pending operation fails with `errno`; advertisements are dropped.
pub(crate) fn fail_all(st: &mut State, c: &mut Conn, errno: i32) {
    // The sending side: nothing more is written, waiting sends end.
    super::send::peer_gone(st, c, errno);
    while let Some(mut r) = c.rx.recvs.pop_front() {
        let mut placing = None;
        if let Some(a) = r.adv.take() {
            placing = a.placing;
            unadvertise(&mut c.rx, a);
        }
        end_op(st, r, placing, -(errno as isize), 0);
    }
    c.rx.stash.clear();
    if c.rx.watched {
        c.rx.watched = false;
        st.watch.retain(|&r| r != c.r);
    }
}
