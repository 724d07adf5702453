//! Placement by rendezvous: a large chunk that fills a whole advertisement goes as a PLACE
//! message whose data Courier moves by rendezvous, instead of one put-with-signal. Over
//! shared memory Courier's rendezvous splits the copy: the receiver reads the first part
//! from the sender's buffer while the sender writes the rest (`COURIER_CMA_SPLIT`), so both
//! processes' CPUs copy at once where a put is one process's copy. The receive completes
//! as a direct one does: when the copy is done the receiver sets the advertisement's
//! signal word itself, with the value the sender would have put there, and `recv.rs` takes
//! it in chunk order.
//!
//! Used when the link is shared memory, the chunk is at least `EXS_F_SPLIT_MIN` bytes
//! (`PLACE_MIN` by default; 0: never) and it
//! both starts and ends its advertisement (so nothing else writes that signal word). The
//! receiver checks the PLACE against the advertisement (slot live, nothing placed in it
//! yet, the length inside it, the signal word's length equal to the data's); a receive
//! whose placement is still running when it ends early (reset, close) gives its event
//! only once Courier is done with its buffer.

use std::time::{Duration, Instant};

use courier_core::{AmFlags, AmRndv, Buf, Callback, Endpoint, Error, Info};

use super::conn::{Conn, ConnRef, prefix};
use super::msg::{MsgRecv, end_recv};
use super::send::proto;
use super::sock::{Op, State};
use super::wire::{self, Msg, word};
use super::{XResult, lib_opt};

/// Smallest chunk placed by rendezvous by default (`EXS_F_SPLIT_MIN`; below it, one
/// process's copy is as fast as the split's extra round trips allow).
pub(crate) const PLACE_MIN: usize = 256 << 10;

/// A placement in flight at the receiver.
pub(crate) struct Placing {
    r: ConnRef,
    len: usize,
    value: u64,
    /// The receive ended (reset, close) while Courier still had its buffer: its event.
    held: Option<Held>,
}

pub(crate) struct Held {
    pub op: Op,
    pub msg: Option<Box<MsgRecv>>,
    pub result: isize,
    pub flags: i32,
}

/// Whether a chunk of `n` bytes filling a whole advertisement goes by PLACE on `c`.
pub(crate) fn wanted(c: &Conn, n: u64) -> bool {
    let min = c.opts.split_min as u64;
    min > 0 && n >= min && c.ep.transport() == Some("shm")
}

/// Send `data` (one whole advertisement, `slot`) by rendezvous; the send's piece completes
/// once the receiver has it.
pub(crate) fn send_place(
    st: &mut State,
    c: &mut Conn,
    id: u64,
    data: Buf,
    slot: u16,
    value: u64,
) -> XResult<()> {
    tracing::debug!("EXS place out: slot {slot} word {value:#x}");
    let hdr = wire::encode(prefix(c, wire::K_PLACE, 0), &Msg::Place { slot, value });
    let flags = AmFlags {
        rndv: true,
        ..AmFlags::default()
    };
    super::send::send_am(st, c, id, &hdr, data, flags)
}

/// A PLACE from the peer: check it against advertisement `slot`, then receive its data
/// into the advertised buffer. The descriptor is declined on any refusal.
pub(crate) fn on_place(
    st: &mut State,
    c: &mut Conn,
    slot: u16,
    value: u64,
    desc: AmRndv,
) -> XResult<()> {
    let l = super::lib()?;
    let n = desc.len();
    let (i, dst) = match check(c, slot, value, n) {
        Ok(x) => x,
        Err(e) => {
            let _ = l.worker.am_decline(desc);
            return Err(e);
        }
    };
    st.next_place = st.next_place.wrapping_add(1).max(1);
    let token = st.next_place;
    // SAFETY: `[dst, dst + n)` lies inside the receive's buffer (checked against its
    // registration when posted, and `check` keeps it inside the advertisement); the
    // receive's event waits for this request's callback (`held`), so the buffer stays the
    // caller's until Courier is done with it.
    let r = unsafe {
        l.worker
            .am_recv_data_raw(desc, Buf::One((dst, n)), Callback::Raw(place_done, token))
    };
    r?;
    if let Some(a) = c.rx.recvs_adv_mut(i) {
        a.placing = Some(token);
    }
    st.places.insert(
        token,
        Placing {
            r: c.r,
            len: n,
            value,
            held: None,
        },
    );
    Ok(())
}

/// The receive (index) advertised in `slot` and where its data goes, if the PLACE fits it.
fn check(c: &Conn, slot: u16, value: u64, n: usize) -> XResult<(usize, usize)> {
    let (i, op_buf, op_len, got, adv) = c.rx.find_adv(slot).ok_or_else(|| {
        proto(format!(
            "PLACE into advertisement slot {slot}, which is not live"
        ))
    })?;
    let room = op_len - adv.base;
    let Some((_, filled, trunc)) = word::parse(value) else {
        return Err(proto(format!(
            "PLACE word {value:#x} without its valid bit"
        )));
    };
    let fresh = adv.placing.is_none() && adv.seen == 0 && got == adv.base;
    if !fresh || n == 0 || n > room || filled != n as u64 || (trunc && n != room) {
        return Err(proto(format!(
            "PLACE of {n} bytes (word: {filled} bytes, truncated {trunc}) into slot {slot} of {room} bytes (fresh {fresh})"
        )));
    }
    Ok((i, op_buf + adv.base))
}

/// Courier finished (or failed) a placement's copy.
fn place_done(token: usize, r: Result<Info, Error>, info: Info) {
    let Some(l) = lib_opt() else { return };
    let mut st = l.st();
    let Some(p) = st.places.remove(&token) else {
        return;
    };
    if !st.places.values().any(|x| x.r == p.r) {
        // The connection's last placement: its endpoint, if it ended, may close now.
        let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut st.eps_after_places)
            .into_iter()
            .partition(|(r, _, _)| *r == p.r);
        st.eps_after_places = later;
        st.closing_eps.extend(now.into_iter().map(|(_, ep, _)| ep));
    }
    if let Some(h) = p.held {
        end_recv(&mut st, h.op, h.msg, h.result, h.flags);
        return;
    }
    st.with_conn(p.r, |st, c| {
        let Some(i) = c.rx.find_placing(token) else {
            return;
        };
        let slot = c.rx.recvs_adv_mut(i).map(|a| {
            a.placing = None;
            a.slot
        });
        let Some(slot) = slot else { return };
        match r {
            Ok(_) if info.length == p.len => {
                super::recv::signal(c, slot, p.value);
                super::recv::process(st, c);
            }
            Ok(_) => super::conn::reset(
                st,
                c,
                proto(format!(
                    "a PLACE of {} bytes delivered {}",
                    p.len, info.length
                )),
            ),
            Err(e) => {
                // The copy could not reach the peer's memory (it died, or it lied about
                // its buffer): to the program, the connection was reset.
                let mut f: super::Fail = e.into();
                f.errno = libc::ECONNRESET;
                super::conn::reset(st, c, f)
            }
        }
    });
}

/// A receive ends while its placement runs: its event waits for the placement's end.
pub(crate) fn hold(st: &mut State, token: usize, h: Held) -> Option<Held> {
    match st.places.get_mut(&token) {
        Some(p) => {
            tracing::debug!("EXS receive ended during its placement: its event waits for it");
            p.held = Some(h);
            None
        }
        None => Some(h),
    }
}

/// Close the endpoint of connection `r`, which ended (closed, reset), once its placements
/// have ended. Closing it under a placement would end the receive here (its request fails
/// with the endpoint) while the peer, which learns of it later, still writes its part of
/// the split into the receive's buffer: after the receive's event. So the placement runs
/// to its end (the peer's part written, ours read) or fails with the link; a peer that
/// never ends it is cut off after Courier's give-up time.
pub(crate) fn close_ep(st: &mut State, r: ConnRef, ep: Endpoint) {
    if !st.places.values().any(|p| p.r == r) {
        st.closing_eps.push(ep);
        return;
    }
    tracing::debug!("EXS connection ended during a placement: its endpoint closes after it");
    let limit = lib_opt()
        .map(|l| l.ctx.config().give_up_after())
        .unwrap_or(Duration::from_secs(5));
    st.eps_after_places.push((r, ep, Instant::now() + limit));
}

/// Endpoints whose placements did not end in time: closed now (the placements then fail).
pub(crate) fn expire(st: &mut State, now: Instant) {
    if st.eps_after_places.iter().all(|&(_, _, d)| d > now) {
        return;
    }
    let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut st.eps_after_places)
        .into_iter()
        .partition(|&(_, _, d)| d <= now);
    st.eps_after_places = later;
    for (_, ep, _) in due {
        tracing::info!("EXS: a placement into an ended connection did not end in time; closing");
        st.closing_eps.push(ep);
    }
}
