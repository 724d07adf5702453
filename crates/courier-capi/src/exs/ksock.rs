//! The extended calls on kernel sockets: the operations queue per descriptor and are
//! carried out with non-blocking system calls when epoll says the socket is ready (or at
//! once, when it already is), with the same events as on Courier. `exs_accept` and
//! `exs_connect` make the descriptor non-blocking; sends and receives use `MSG_DONTWAIT`
//! and leave its mode alone.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};

use super::sock::{Op, State};
use super::{Lib, XResult, fail};

pub(crate) struct KOp {
    op: Op,
    /// `exs_sendmsg`/`exs_recvmsg`: the iovecs (non-empty ones); `op.buf` is the msghdr.
    segs: Option<Vec<(usize, usize)>>,
    done: usize,
    waitall: bool,
    flags: i32,
    /// accept: where the peer's address goes.
    addr: usize,
    addrlen: usize,
}

pub(crate) struct KSock {
    seqpacket: bool,
    sends: VecDeque<KOp>,
    recvs: VecDeque<KOp>,
    accepts: VecDeque<KOp>,
    connect: Option<KOp>,
    interest: u32,
    /// `exs_shutdown` SHUT_WR while sends were queued: shutdown(2) once they are written.
    shut_wr: bool,
    /// shutdown(2) for writing was called.
    shut_done: bool,
}

impl KSock {
    fn pending(&self) -> bool {
        !self.sends.is_empty()
            || !self.recvs.is_empty()
            || !self.accepts.is_empty()
            || self.connect.is_some()
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// The kernel socket `fd` (its entry made on first use; not a socket: `ENOTSOCK`).
fn entry(st: &mut State, fd: RawFd) -> XResult<&mut KSock> {
    if let std::collections::hash_map::Entry::Vacant(e) = st.ksocks.entry(fd) {
        let mut ty: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `ty` and `len` are locals of the right size.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_TYPE,
                &mut ty as *mut _ as *mut libc::c_void,
                &mut len,
            )
        };
        if r != 0 {
            let e = errno();
            let e = if e == libc::EBADF {
                libc::EBADF
            } else {
                libc::ENOTSOCK
            };
            return Err(fail(
                e,
                format!("{fd} is neither an EXS socket nor a kernel socket"),
            ));
        }
        e.insert(KSock {
            seqpacket: ty == libc::SOCK_SEQPACKET,
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            accepts: VecDeque::new(),
            connect: None,
            interest: 0,
            shut_wr: false,
            shut_done: false,
        });
    }
    st.ksocks
        .get_mut(&fd)
        .ok_or_else(|| fail(libc::EIO, "kernel socket entry vanished"))
}

fn set_nonblocking(fd: RawFd) {
    // SAFETY: plain fcntl calls on the caller's descriptor.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 && fl & libc::O_NONBLOCK == 0 {
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
    }
}

const SEND_FLAGS: i32 = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT | libc::MSG_MORE | libc::MSG_EOR;
const RECV_FLAGS: i32 = libc::MSG_WAITALL | libc::MSG_DONTWAIT;

pub(crate) fn send(
    l: &Lib,
    st: &mut State,
    fd: RawFd,
    op: Op,
    flags: i32,
    segs: Option<Vec<(usize, usize)>>,
) -> XResult<()> {
    let k = match entry(st, fd) {
        Ok(k) => k,
        Err(e) => return Err(give_back(st, op, e)),
    };
    if flags & !SEND_FLAGS != 0 {
        let e = fail(
            libc::EOPNOTSUPP,
            format!("send flags {:#x} not supported", flags & !SEND_FLAGS),
        );
        return Err(give_back(st, op, e));
    }
    if k.shut_wr {
        let e = fail(
            libc::EPIPE,
            format!("kernel socket {fd} was shut down for writing (exs_shutdown)"),
        );
        return Err(give_back(st, op, e));
    }
    k.sends.push_back(KOp {
        op,
        segs,
        done: 0,
        waitall: false,
        flags: flags & (libc::MSG_MORE | libc::MSG_EOR),
        addr: 0,
        addrlen: 0,
    });
    run(l, st, fd, libc::EPOLLOUT as u32);
    Ok(())
}

pub(crate) fn recv(
    l: &Lib,
    st: &mut State,
    fd: RawFd,
    op: Op,
    flags: i32,
    segs: Option<Vec<(usize, usize)>>,
) -> XResult<()> {
    let k = match entry(st, fd) {
        Ok(k) => k,
        Err(e) => return Err(give_back(st, op, e)),
    };
    if flags & !RECV_FLAGS != 0 {
        let e = fail(
            libc::EOPNOTSUPP,
            format!("receive flags {:#x} not supported", flags & !RECV_FLAGS),
        );
        return Err(give_back(st, op, e));
    }
    let waitall = flags & libc::MSG_WAITALL != 0 && !k.seqpacket;
    k.recvs.push_back(KOp {
        op,
        segs,
        done: 0,
        waitall,
        flags: 0,
        addr: 0,
        addrlen: 0,
    });
    run(l, st, fd, libc::EPOLLIN as u32);
    Ok(())
}

pub(crate) fn accept(
    l: &Lib,
    st: &mut State,
    fd: RawFd,
    op: Op,
    addr: usize,
    addrlen: usize,
) -> XResult<()> {
    let k = match entry(st, fd) {
        Ok(k) => k,
        Err(e) => return Err(give_back(st, op, e)),
    };
    k.accepts.push_back(KOp {
        op,
        segs: None,
        done: 0,
        waitall: false,
        flags: 0,
        addr,
        addrlen,
    });
    set_nonblocking(fd);
    run(l, st, fd, libc::EPOLLIN as u32);
    Ok(())
}

pub(crate) fn connect(
    l: &Lib,
    st: &mut State,
    fd: RawFd,
    addr: &libc::sockaddr_storage,
    len: libc::socklen_t,
    op: Op,
) -> XResult<()> {
    let k = match entry(st, fd) {
        Ok(k) => k,
        Err(e) => return Err(give_back(st, op, e)),
    };
    if k.connect.is_some() {
        return Err(give_back(
            st,
            op,
            fail(libc::EALREADY, "a connect is already in progress"),
        ));
    }
    set_nonblocking(fd);
    // SAFETY: `addr` holds `len` valid bytes of a socket address (made by the caller).
    let r = unsafe { libc::connect(fd, addr as *const _ as *const libc::sockaddr, len) };
    let e = if r == 0 { 0 } else { errno() };
    if e == libc::EINPROGRESS || e == libc::EINTR {
        if let Some(k) = st.ksocks.get_mut(&fd) {
            k.connect = Some(KOp {
                op,
                segs: None,
                done: 0,
                waitall: false,
                flags: 0,
                addr: 0,
                addrlen: 0,
            });
        }
        interest(l, st, fd);
        return Ok(());
    }
    st.finish(op, -(e as isize), 0);
    Ok(())
}

/// `exs_shutdown` on a kernel socket: shutdown(2), with SHUT_WR's ordered after the sends
/// already queued here (it waits for them to be written; new sends fail with `EPIPE` at
/// once). Receives pending see the end of the stream when the kernel says so.
pub(crate) fn shutdown(l: &Lib, st: &mut State, fd: RawFd, how: i32) -> XResult<()> {
    let k = entry(st, fd)?;
    super::api::check_how(how)?;
    let rd = how == libc::SHUT_RD || how == libc::SHUT_RDWR;
    let wr = how == libc::SHUT_WR || how == libc::SHUT_RDWR;
    let defer = wr && (!k.sends.is_empty() || (k.shut_wr && !k.shut_done));
    let now = match (rd, wr && !defer) {
        (true, true) => Some(libc::SHUT_RDWR),
        (true, false) => Some(libc::SHUT_RD),
        (false, true) => Some(libc::SHUT_WR),
        (false, false) => None,
    };
    if defer {
        // Not connected is said now, as shutdown(2) would.
        // SAFETY: a zeroed sockaddr_storage and its size, filled by the call.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: as above.
        let r =
            unsafe { libc::getpeername(fd, &mut ss as *mut _ as *mut libc::sockaddr, &mut len) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            return Err(fail(
                e.raw_os_error().unwrap_or(libc::ENOTCONN),
                format!("shutdown of kernel socket {fd}: {e}"),
            ));
        }
        k.shut_wr = true;
    }
    if let Some(h) = now {
        // SAFETY: shutdown(2) on the caller's socket.
        if unsafe { libc::shutdown(fd, h) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(fail(
                e.raw_os_error().unwrap_or(libc::EIO),
                format!("shutdown({fd}): {e}"),
            ));
        }
        if h != libc::SHUT_RD {
            k.shut_wr = true;
            k.shut_done = true;
        }
    }
    if rd {
        // The kernel answers receives with the end of the stream now: complete them.
        run(l, st, fd, libc::EPOLLIN as u32);
    }
    Ok(())
}

/// Give an operation that did not start its slot and registration back.
fn give_back(st: &mut State, op: Op, e: super::Fail) -> super::Fail {
    op.q.unreserve();
    if op.mh != 0
        && let Some(m) = st.mems.get_mut(&op.mh)
    {
        m.busy = m.busy.saturating_sub(1);
    }
    e
}

/// Close a kernel socket through EXS: pending operations complete with `ECANCELED`.
pub(crate) fn close(l: &Lib, st: &mut State, fd: RawFd, close_op: Option<Op>) -> XResult<()> {
    if let Some(mut k) = st.ksocks.remove(&fd) {
        let ops: Vec<Op> = k
            .sends
            .drain(..)
            .chain(k.recvs.drain(..))
            .chain(k.accepts.drain(..))
            .chain(k.connect.take())
            .map(|o| o.op)
            .collect();
        if k.interest != 0 {
            // SAFETY: removes `fd` from our epoll; a NULL event is allowed for DEL.
            unsafe {
                libc::epoll_ctl(
                    l.engine.kepoll.as_raw_fd(),
                    libc::EPOLL_CTL_DEL,
                    fd,
                    std::ptr::null_mut(),
                );
            }
        }
        for op in ops {
            st.fail_op(op, libc::ECANCELED);
        }
    }
    // SAFETY: the caller hands us the descriptor to close (exs_close's contract).
    if unsafe { libc::close(fd) } != 0 {
        let e = errno();
        if let Some(op) = close_op {
            // The call fails: no event.
            op.q.unreserve();
        }
        return Err(fail(e, format!("close({fd})")));
    }
    if let Some(op) = close_op {
        st.finish(op, 0, 0);
    }
    update_active(l, st);
    Ok(())
}

/// Make progress on `fd`: `ready` says which directions to try (EPOLLIN, EPOLLOUT, both).
pub(crate) fn run(l: &Lib, st: &mut State, fd: RawFd, ready: u32) -> usize {
    let mut n = 0;
    let mut done: Vec<(Op, isize, i32)> = Vec::new();
    if let Some(k) = st.ksocks.get_mut(&fd) {
        let hup = ready & (libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0;
        if ready & libc::EPOLLOUT as u32 != 0 || hup {
            if let Some(c) = k.connect.take() {
                let mut err: libc::c_int = 0;
                let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                // SAFETY: locals of the right size.
                unsafe {
                    libc::getsockopt(
                        fd,
                        libc::SOL_SOCKET,
                        libc::SO_ERROR,
                        &mut err as *mut _ as *mut libc::c_void,
                        &mut len,
                    );
                }
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: one pollfd on the stack, no wait.
                let writable =
                    unsafe { libc::poll(&mut p, 1, 0) } > 0 && p.revents & libc::POLLOUT != 0;
                if err != 0 || writable || hup {
                    done.push((c.op, -(err as isize), 0));
                    n += 1;
                } else {
                    k.connect = Some(c);
                }
            }
            while let Some(s) = k.sends.front_mut() {
                let left = s.op.len - s.done;
                let sflags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL | s.flags;
                let r = if let Some(segs) = &s.segs {
                    let mut iov = iovecs(segs, s.done);
                    // SAFETY: a zeroed msghdr is valid; it points at our iovecs.
                    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
                    m.msg_iov = iov.as_mut_ptr();
                    m.msg_iovlen = iov.len();
                    // SAFETY: the iovecs were checked against their registration and stay
                    // the caller's until the event.
                    unsafe { libc::sendmsg(fd, &m, sflags) }
                } else {
                    // SAFETY: the buffer was checked against its registration and stays
                    // the caller's until the event.
                    unsafe {
                        libc::send(fd, (s.op.buf + s.done) as *const libc::c_void, left, sflags)
                    }
                };
                if r < 0 {
                    match errno() {
                        libc::EAGAIN | libc::EINTR => break,
                        e => {
                            if let Some(s) = k.sends.pop_front() {
                                done.push((s.op, -(e as isize), 0));
                            }
                            n += 1;
                            continue;
                        }
                    }
                }
                s.done += r as usize;
                if s.done == s.op.len {
                    if let Some(s) = k.sends.pop_front() {
                        let len = s.op.len as isize;
                        done.push((s.op, len, 0));
                    }
                    n += 1;
                }
            }
            if k.shut_wr && k.sends.is_empty() && !k.shut_done {
                // exs_shutdown(SHUT_WR) waited for the sends queued before it.
                k.shut_done = true;
                // SAFETY: shutdown(2) on the caller's socket.
                if unsafe { libc::shutdown(fd, libc::SHUT_WR) } != 0 {
                    tracing::info!(
                        "deferred shutdown(SHUT_WR) of kernel socket {fd}: {}",
                        std::io::Error::last_os_error()
                    );
                }
            }
        }
        if ready & libc::EPOLLIN as u32 != 0 || hup {
            while let Some(a) = k.accepts.front() {
                // SAFETY: the caller's address buffer (checked NULL-or-valid by the call's
                // contract) or NULL.
                let r = unsafe {
                    libc::accept4(
                        fd,
                        a.addr as *mut libc::sockaddr,
                        a.addrlen as *mut libc::socklen_t,
                        libc::SOCK_CLOEXEC,
                    )
                };
                if r < 0 {
                    match errno() {
                        libc::EAGAIN | libc::EINTR => break,
                        libc::ECONNABORTED => continue,
                        e => {
                            if let Some(a) = k.accepts.pop_front() {
                                done.push((a.op, -(e as isize), 0));
                            }
                            n += 1;
                            continue;
                        }
                    }
                }
                if let Some(a) = k.accepts.pop_front() {
                    done.push((a.op, r as isize, 0));
                }
                n += 1;
            }
            while let Some(rv) = k.recvs.front_mut() {
                let left = rv.op.len - rv.done;
                let mut flags = 0;
                let r = if k.seqpacket || rv.segs.is_some() {
                    // One buffer: an iovec on the stack (no allocation on this path).
                    let mut one = [libc::iovec {
                        iov_base: (rv.op.buf + rv.done) as *mut libc::c_void,
                        iov_len: left,
                    }];
                    let mut many: Vec<libc::iovec>;
                    let iov: &mut [libc::iovec] = match &rv.segs {
                        Some(segs) => {
                            many = iovecs(segs, rv.done);
                            &mut many
                        }
                        None => &mut one,
                    };
                    // SAFETY: a zeroed msghdr is valid; it points at our iovecs.
                    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
                    m.msg_iov = iov.as_mut_ptr();
                    m.msg_iovlen = iov.len();
                    // SAFETY: the buffer is the caller's registered one (checked), kept until
                    // the event.
                    let r = unsafe { libc::recvmsg(fd, &mut m, libc::MSG_DONTWAIT) };
                    flags = m.msg_flags & (libc::MSG_TRUNC | libc::MSG_EOR);
                    r
                } else {
                    // SAFETY: as above.
                    unsafe {
                        libc::recv(
                            fd,
                            (rv.op.buf + rv.done) as *mut libc::c_void,
                            left,
                            libc::MSG_DONTWAIT,
                        )
                    }
                };
                if r < 0 {
                    match errno() {
                        libc::EAGAIN | libc::EINTR => break,
                        e => {
                            if let Some(rv) = k.recvs.pop_front() {
                                done.push((rv.op, -(e as isize), 0));
                            }
                            n += 1;
                            continue;
                        }
                    }
                }
                rv.done += r as usize;
                // 0 is the end of the stream; on SEQPACKET it may be an empty message too
                // (each later receive then sees 0 again at the end), or a message taken
                // by a zero-length receive (MSG_TRUNC: never the end).
                let eof = r == 0 && left > 0 && !k.seqpacket;
                let taken = flags & libc::MSG_TRUNC != 0;
                if r == 0 && !taken && (eof || (k.seqpacket && at_end(fd))) {
                    flags |= super::abi::EXS_MSG_EOF;
                }
                if !rv.waitall || rv.done == rv.op.len || eof || k.seqpacket {
                    if let Some(rv) = k.recvs.pop_front() {
                        let got = rv.done as isize;
                        done.push((rv.op, got, flags));
                    }
                    n += 1;
                    if eof {
                        // The end of the stream: every receive after it gets 0 as well.
                        while let Some(rv) = k.recvs.pop_front() {
                            done.push((rv.op, 0, super::abi::EXS_MSG_EOF));
                        }
                    }
                }
            }
        }
    }
    // (accept4 wrote the peer's address itself.)
    for (op, r, f) in done {
        st.finish(op, r, f);
    }
    interest(l, st, fd);
    n
}

/// The iovecs of `segs` past their first `done` bytes.
fn iovecs(segs: &[(usize, usize)], done: usize) -> Vec<libc::iovec> {
    let mut skip = done;
    let mut out = Vec::with_capacity(segs.len());
    for &(base, len) in segs {
        if skip >= len {
            skip -= len;
            continue;
        }
        out.push(libc::iovec {
            iov_base: (base + skip) as *mut libc::c_void,
            iov_len: len - skip,
        });
        skip = 0;
    }
    out
}

/// A SEQPACKET kernel socket whose receive gave 0: the end of the stream (the peer shut
/// down or closed, or we shut reading down), or else an empty message. The kernel does not
/// tell them apart: the end is taken when the reading side is shut and nothing is queued
/// (an empty message sent right before the peer's shutdown reads as the end too).
fn at_end(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack, no wait.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP) != 0
}

/// Watch `fd` for what its queued operations wait on.
fn interest(l: &Lib, st: &mut State, fd: RawFd) {
    let Some(k) = st.ksocks.get_mut(&fd) else {
        return;
    };
    let mut want = 0u32;
    if !k.recvs.is_empty() || !k.accepts.is_empty() {
        want |= libc::EPOLLIN as u32;
    }
    if !k.sends.is_empty() || k.connect.is_some() {
        want |= libc::EPOLLOUT as u32;
    }
    if want != k.interest {
        let op = match (k.interest, want) {
            (0, _) => libc::EPOLL_CTL_ADD,
            (_, 0) => libc::EPOLL_CTL_DEL,
            _ => libc::EPOLL_CTL_MOD,
        };
        let mut ev = libc::epoll_event {
            events: want,
            u64: fd as u64,
        };
        // SAFETY: our epoll, the caller's socket, an event on the stack.
        let r = unsafe { libc::epoll_ctl(l.engine.kepoll.as_raw_fd(), op, fd, &mut ev) };
        if r == 0 || op == libc::EPOLL_CTL_DEL {
            k.interest = want;
        } else {
            tracing::warn!(
                "epoll_ctl on kernel socket {fd}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    update_active(l, st);
}

fn update_active(l: &Lib, st: &State) {
    let n = st.ksocks.values().filter(|k| k.pending()).count();
    l.engine
        .kactive
        .store(n, std::sync::atomic::Ordering::Relaxed);
}

/// Progress the kernel sockets: few busy ones are tried directly (one system call each),
/// many through epoll. Returns how many operations completed.
pub(crate) fn poll(l: &Lib) -> usize {
    let mut st = l.st();
    let busy: Vec<(RawFd, u32)> = st
        .ksocks
        .iter()
        .filter(|(_, k)| k.pending())
        .map(|(&fd, k)| (fd, k.interest))
        .collect();
    if busy.is_empty() {
        return 0;
    }
    let mut n = 0;
    if busy.len() <= 4 {
        for (fd, want) in busy {
            n += run(l, &mut st, fd, want);
        }
        return n;
    }
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 64];
    // SAFETY: our epoll and an array on the stack; no wait.
    let k = unsafe { libc::epoll_wait(l.engine.kepoll.as_raw_fd(), evs.as_mut_ptr(), 64, 0) };
    for ev in evs.iter().take(k.max(0) as usize) {
        let (fd, events) = (ev.u64 as RawFd, ev.events);
        n += run(l, &mut st, fd, events);
    }
    n
}
