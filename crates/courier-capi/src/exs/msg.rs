//! `exs_sendmsg` and `exs_recvmsg`: scatter/gather over a `msghdr`'s iovecs, every one
//! inside the registration given with the call.
//!
//! Over Courier a send gathers its iovecs into each chunk (one put-with-signal for a
//! SEQPACKET message, however many iovecs it has). A receive into one buffer (one iovec,
//! or iovecs adjacent in memory) is advertised as `exs_recv`'s is; a receive into several
//! is advertised as a staging buffer of ours, registered, and copied into the iovecs at its
//! completion (`STAGING_MAX` bytes of them per process). On kernel sockets the iovecs go
//! to sendmsg(2)/recvmsg(2) as they are.

use std::ffi::c_int;

use super::abi::*;
use super::mem::Mem;
use super::sock::{Op, SockState, State, Target};
use super::{XResult, boundary, fail, ksock, lib, recv, send};

/// Bytes of staging buffers (receives scattered over several iovecs) in use per process.
pub(crate) const STAGING_MAX: usize = 64 << 20;

/// A receive's `exs_recvmsg` side.
pub(crate) struct MsgRecv {
    /// The caller's `msghdr` (its `msg_flags` are written before the event).
    pub msg: usize,
    pub total: usize,
    pub scatter: Option<Scatter>,
}

/// A receive through a staging buffer (the op's buffer and registration).
pub(crate) struct Scatter {
    pub segs: Vec<(usize, usize)>,
    /// The caller's registration, held busy until the event.
    pub user_mh: u64,
    pub staging_mh: u64,
}

/// The iovecs of `msg`: the non-empty ones (adjacent ones merged) and their total.
///
/// # Safety
/// `msg` is NULL or a readable `msghdr` whose `msg_iov` (if `msg_iovlen` > 0) points at
/// `msg_iovlen` readable iovecs.
unsafe fn iovs(msg: *const libc::msghdr, send: bool) -> XResult<(Vec<(usize, usize)>, usize)> {
    if msg.is_null() {
        return Err(fail(libc::EFAULT, "msg is NULL"));
    }
    // SAFETY: the caller's msghdr (the contract above); read unaligned to be safe.
    let m = unsafe { std::ptr::read_unaligned(msg) };
    let n = m.msg_iovlen;
    if n > EXS_IOV_MAX {
        return Err(fail(
            libc::EMSGSIZE,
            format!("msg_iovlen {n} is more than EXS_IOV_MAX ({EXS_IOV_MAX})"),
        ));
    }
    if n > 0 && m.msg_iov.is_null() {
        return Err(fail(libc::EFAULT, "msg_iov is NULL"));
    }
    if send && m.msg_controllen != 0 {
        return Err(fail(
            libc::EOPNOTSUPP,
            "ancillary data (msg_control) is not supported by exs_sendmsg",
        ));
    }
    let mut segs: Vec<(usize, usize)> = Vec::with_capacity(n.min(16));
    let mut total: usize = 0;
    for i in 0..n {
        // SAFETY: `i < msg_iovlen` iovecs are readable (the contract above).
        let v = unsafe { std::ptr::read_unaligned(m.msg_iov.add(i)) };
        let (base, len) = (v.iov_base as usize, v.iov_len);
        total = total
            .checked_add(len)
            .filter(|&t| t <= isize::MAX as usize)
            .ok_or_else(|| fail(libc::EINVAL, "the iovecs' lengths add up past SSIZE_MAX"))?;
        if len == 0 {
            continue;
        }
        match segs.last_mut() {
            Some(last) if last.0 + last.1 == base => last.1 += len,
            _ => segs.push((base, len)),
        }
    }
    Ok((segs, total))
}

/// Check every iovec against registration `mh` and hold it busy (`false`: nothing to
/// hold: no bytes and no registration).
fn hold(st: &mut State, mh: exs_mhandle_t, segs: &[(usize, usize)]) -> XResult<bool> {
    if segs.is_empty() && mh == EXS_MHANDLE_INVALID {
        return Ok(false);
    }
    let m = st.mems.get_mut(&mh).ok_or_else(|| {
        fail(
            libc::EINVAL,
            format!("{mh} is not a memory registration (never made, or deregistered)"),
        )
    })?;
    for &(base, len) in segs {
        m.covers(mh, base, len)?;
    }
    m.busy += 1;
    Ok(true)
}

fn release(st: &mut State, mh: u64) {
    if mh != 0
        && let Some(m) = st.mems.get_mut(&mh)
    {
        m.busy = m.busy.saturating_sub(1);
    }
}

/// Write a completed `exs_recvmsg`'s flags into its `msghdr` (no ancillary data, no
/// address: the socket is connected, as recvmsg(2) says for TCP).
pub(crate) fn put_msg_flags(msg: usize, flags: i32) {
    if msg == 0 {
        return;
    }
    let m = msg as *mut libc::msghdr;
    // SAFETY: exs_recvmsg's contract: the msghdr stays valid and the caller's until the
    // event, which is posted after this.
    unsafe {
        std::ptr::addr_of_mut!((*m).msg_flags)
            .write_unaligned(flags & (libc::MSG_TRUNC | libc::MSG_EOR | EXS_MSG_EOF));
        std::ptr::addr_of_mut!((*m).msg_controllen).write_unaligned(0);
        std::ptr::addr_of_mut!((*m).msg_namelen).write_unaligned(0);
    }
}

/// Post a receive's event: an `exs_recvmsg`'s staged bytes are scattered into its
/// iovecs first, the event names its `msghdr`, and its staging buffer is dropped.
pub(crate) fn end_recv(
    st: &mut State,
    mut op: Op,
    m: Option<Box<MsgRecv>>,
    result: isize,
    flags: i32,
) {
    let Some(m) = m else {
        st.finish(op, result, flags);
        return;
    };
    let staged = op.buf;
    op.buf = m.msg;
    op.len = m.total;
    if let Some(sc) = &m.scatter {
        let mut left = result.max(0) as usize;
        let mut from = staged;
        for &(base, len) in &sc.segs {
            if left == 0 {
                break;
            }
            let n = len.min(left);
            // SAFETY: the staging buffer holds `result` bytes the receive got (at most its
            // length, the iovecs' total); each iovec was checked against the caller's
            // registration, held busy, and is the caller's until the event.
            unsafe { std::ptr::copy_nonoverlapping(from as *const u8, base as *mut u8, n) };
            from += n;
            left -= n;
        }
        release(st, sc.user_mh);
    }
    st.finish(op, result, flags);
    if let Some(sc) = m.scatter {
        drop_staging(st, sc.staging_mh);
    }
}

fn drop_staging(st: &mut State, mh: u64) {
    if let Some(mem) = st.staged.remove(&mh) {
        st.staging = st.staging.saturating_sub(mem.len);
    }
}

/// A receive that did not start: its queue slot, registrations and staging go back.
pub(crate) fn refuse_recv(st: &mut State, op: Op, m: Option<Box<MsgRecv>>) {
    op.q.unreserve();
    release(st, op.mh);
    if let Some(sc) = m.and_then(|m| m.scatter) {
        release(st, sc.user_mh);
        drop_staging(st, sc.staging_mh);
    }
}

/// Start sending the bytes of `msg`'s iovecs, in order, as one message (SEQPACKET) or as
/// bytes (STREAM). SENDMSG event: the bytes sent.
///
/// # Safety
/// `msg` and its iovec array are read during the call only (then the caller's again); the
/// data must stay untouched until the event.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn exs_sendmsg(
    fd: c_int,
    msg: *const libc::msghdr,
    flags: c_int,
    qh: exs_qhandle_t,
    ahandle: exs_ahandle_t,
    mh: exs_mhandle_t,
) -> c_int {
    // SAFETY: passed on (the contract above).
    boundary(|| unsafe { msg_op(fd, msg, flags, qh, ahandle, mh, true) })
}

/// Start receiving into `msg`'s iovecs, in order. RECVMSG event: the bytes received (0:
/// the end, with `EXS_MSG_EOF`), the flags also written into `msg->msg_flags` before it
/// is queued (`MSG_TRUNC`: a SEQPACKET message longer than the iovecs).
///
/// # Safety
/// `msg` must stay valid until the event (its `msg_flags` are written then); its iovec
/// array is read during the call only.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn exs_recvmsg(
    fd: c_int,
    msg: *mut libc::msghdr,
    flags: c_int,
    qh: exs_qhandle_t,
    ahandle: exs_ahandle_t,
    mh: exs_mhandle_t,
) -> c_int {
    // SAFETY: passed on (the contract above).
    boundary(|| unsafe { msg_op(fd, msg, flags, qh, ahandle, mh, false) })
}

/// # Safety
/// As `exs_sendmsg` / `exs_recvmsg`.
#[allow(clippy::too_many_arguments)]
unsafe fn msg_op(
    fd: c_int,
    msg: *const libc::msghdr,
    flags: c_int,
    qh: exs_qhandle_t,
    ahandle: exs_ahandle_t,
    mh: exs_mhandle_t,
    send: bool,
) -> XResult<c_int> {
    let l = lib()?;
    super::api::check_flags(
        flags,
        send,
        if send { "exs_sendmsg" } else { "exs_recvmsg" },
    )?;
    let mut st = l.st();
    let q = st.queue(qh)?;
    // SAFETY: the caller's msghdr (this function's contract).
    let (segs, total) = unsafe { iovs(msg, send) }?;
    let held = hold(&mut st, mh, &segs)?;
    let user_mh = if held { mh } else { 0 };
    if let Err(e) = q.reserve() {
        release(&mut st, user_mh);
        return Err(e);
    }
    let mut op = Op {
        q,
        kind: if send {
            EXS_EVT_SENDMSG
        } else {
            EXS_EVT_RECVMSG
        },
        fd,
        ahandle: ahandle as usize,
        buf: msg as usize,
        len: total,
        mh: user_mh,
    };
    let r = match st.target_fast(fd) {
        Target::Kernel => {
            return if send {
                ksock::send(l, &mut st, fd, op, flags, Some(segs)).map(|()| 0)
            } else {
                ksock::recv(l, &mut st, fd, op, flags, Some(segs)).map(|()| 0)
            };
        }
        Target::Exs => match st.socks.get(&fd).map(|s| &s.state) {
            Some(SockState::Conn(r)) => *r,
            _ => {
                let e = fail(libc::ENOTCONN, format!("socket {fd} is not connected"));
                op.q.unreserve();
                release(&mut st, user_mh);
                return Err(e);
            }
        },
    };
    let mut send_segs = None;
    let mut m = None;
    if send {
        send_segs = Some(segs);
    } else {
        let mut scatter = None;
        if segs.len() > 1 {
            if st.staging + total > STAGING_MAX {
                op.q.unreserve();
                release(&mut st, user_mh);
                return Err(fail(
                    libc::ENOBUFS,
                    format!(
                        "exs_recvmsg over several buffers stages through ours: {STAGING_MAX} bytes of them are in use"
                    ),
                ));
            }
            let staging = match Mem::allocate(&l.ctx, total) {
                Ok(s) => s,
                Err(e) => {
                    op.q.unreserve();
                    release(&mut st, user_mh);
                    return Err(e);
                }
            };
            st.next_mh += 1;
            let smh = st.next_mh;
            op.buf = staging.addr;
            op.mh = smh;
            st.staging += total;
            st.staged.insert(smh, staging);
            scatter = Some(Scatter {
                segs,
                user_mh,
                staging_mh: smh,
            });
        } else {
            op.buf = segs.first().map_or(0, |s| s.0);
        }
        m = Some(Box::new(MsgRecv {
            msg: msg as usize,
            total,
            scatter,
        }));
    }
    let mut pending = Some((op, m));
    let res = st.with_conn(r, |st, c| {
        let (op, m) = pending
            .take()
            .ok_or_else(|| fail(libc::EIO, "operation taken twice"))?;
        if send {
            send::post_send(st, c, op, send_segs.take())
        } else {
            recv::post_recv(st, c, op, flags & libc::MSG_WAITALL != 0, m)
        }
    });
    match res {
        Some(r) => r?,
        None => {
            if let Some((op, m)) = pending {
                refuse_recv(&mut st, op, m);
            }
            return Err(fail(
                libc::ECONNRESET,
                format!("socket {fd}: the connection is gone"),
            ));
        }
    }
    drop(st);
    l.engine.kick_if_sleeping();
    Ok(0)
}
