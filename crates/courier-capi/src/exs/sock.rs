//! The library's state, its descriptor table, and connection set-up.
//!
//! An EXS socket's descriptor is a real one the library owns (a memfd, so that every one
//! has its own inode): the kernel never hands its number out again while it is open, so a
//! descriptor from `socket(2)` can never be mistaken for one of ours. Each call also checks
//! that the descriptor is still the one we made (device and inode), so a program that
//! closed it behind our back with `close(2)`, and got the number back from `socket(2)`,
//! has its new socket treated as a kernel socket, not as the old EXS one. Everything else
//! is a kernel descriptor and goes to `ksock`.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use courier_core::{ConnRequest, Endpoint, EndpointParams, Error, Listener};

use super::abi::*;
use super::conn::{self, Conn, ConnRef, Opts, SockType};
use super::ksock::KSock;
use super::mem::Mem;
use super::queue::Queue;
use super::{Lib, XResult, fail};

/// An operation started on a queue: what its event will say.
pub(crate) struct Op {
    pub q: Arc<Queue>,
    pub kind: i32,
    pub fd: RawFd,
    pub ahandle: usize,
    pub buf: usize,
    pub len: usize,
    /// The registration it holds busy (0: none).
    pub mh: u64,
}

/// A send in flight on a Courier connection (kept here, not in the connection, so that it
/// outlives a connection torn down under it until Courier is done with its buffer).
pub(crate) struct SendOp {
    pub op: Op,
    /// Bytes issued so far.
    pub off: usize,
    /// Courier operations of it not completed yet.
    pub inflight: u32,
    /// The data, copied at the call (sends up to `EXS_F_INLINE_MAX`).
    pub inline: Option<Vec<u8>>,
    /// `exs_sendmsg`: the iovecs (non-empty ones) the data is gathered from.
    pub segs: Option<Vec<(usize, usize)>>,
    /// The event was posted already (inline sends).
    pub posted: bool,
    /// Every byte issued, or the send given up.
    pub issued: bool,
    pub error: Option<super::Fail>,
}

impl SendOp {
    /// Its bytes `[off, off + n)`: from the inline copy, the iovecs, or the buffer.
    pub fn piece(&self, off: usize, n: usize) -> courier_core::Buf {
        if let Some(v) = &self.inline {
            return courier_core::Buf::One((v.as_ptr() as usize + off, n));
        }
        let Some(segs) = &self.segs else {
            return courier_core::Buf::One((self.op.buf + off, n));
        };
        let (end, mut at, mut out) = (off + n, 0, Vec::new());
        for &(base, len) in segs {
            let (lo, hi) = (off.max(at), end.min(at + len));
            if lo < hi {
                out.push((base + lo - at, hi - lo));
            }
            at += len;
            if at >= end {
                break;
            }
        }
        match out.len() {
            0 => courier_core::Buf::One((0, 0)),
            1 => courier_core::Buf::One(out[0]),
            _ => courier_core::Buf::Many(out),
        }
    }
}

pub(crate) struct Listen {
    pub listener: Option<Listener>,
    pub backlog: usize,
    /// Connections set up (both HELLOs seen) and not accepted yet.
    pub ready: VecDeque<ConnRef>,
    /// Connections accepted by Courier whose HELLO has not come yet.
    pub handshaking: usize,
    /// `exs_accept` calls waiting: the op, where to write the peer's address and its length.
    pub accepts: VecDeque<(Op, usize, usize)>,
}

pub(crate) enum SockState {
    Fresh,
    Listening(Listen),
    Conn(ConnRef),
}

pub(crate) struct Sock {
    pub memfd: OwnedFd,
    pub ino: (u64, u64),
    pub domain: i32,
    pub ty: SockType,
    pub opts: Opts,
    pub bound: Option<SocketAddr>,
    pub state: SockState,
}

pub(crate) struct ConnSlot {
    pub generation: u32,
    pub conn: Option<Box<Conn>>,
}

#[derive(Default)]
pub(crate) struct State {
    pub socks: HashMap<RawFd, Sock>,
    pub conns: Vec<ConnSlot>,
    pub free_conns: Vec<u32>,
    pub queues: HashMap<exs_qhandle_t, Arc<Queue>>,
    pub next_q: exs_qhandle_t,
    pub mems: HashMap<u64, Mem>,
    pub next_mh: u64,
    pub ksocks: HashMap<RawFd, KSock>,
    pub sends: HashMap<u64, SendOp>,
    pub next_send: u64,
    /// Courier completions in flight: token -> send id.
    pub tokens: HashMap<usize, u64>,
    pub next_token: usize,
    /// Connections with advertisements out (their signal words are looked at).
    pub watch: Vec<ConnRef>,
    /// Connections whose protocol step a program thread left to the thread progressing
    /// (`engine::defer`).
    pub deferred: Vec<ConnRef>,
    /// Endpoints to close outside the lock.
    pub closing_eps: Vec<Endpoint>,
    /// Endpoints of ended connections whose placements still copy (`place::close_ep`),
    /// with the time they are closed anyway.
    pub eps_after_places: Vec<(ConnRef, Endpoint, std::time::Instant)>,
    /// Connections waiting for the peer's CLOSE_ACK.
    pub closing: Vec<ConnRef>,
    /// Library-wide tuning.
    pub lib_opts: LibOpts,
    /// Bytes of `exs_recvmsg` staging buffers in use.
    pub staging: usize,
    /// `exs_recvmsg` staging buffers' registrations, by handle (taken from `next_mh`, so
    /// never the caller's; not in `mems`, so the caller can neither use nor deregister
    /// them).
    pub staged: HashMap<u64, Mem>,
    /// Our registration behind zero-length SEQPACKET receives (`State::zero_mem`): its
    /// handle (taken from `next_mh`, so never the caller's) and a few bytes of ours.
    pub zero_reg: Option<(u64, Mem)>,
    /// Placements in flight at the receiver (`place.rs`), by token.
    pub places: HashMap<usize, super::place::Placing>,
    pub next_place: usize,
}

#[derive(Clone, Copy, Default)]
pub(crate) struct LibOpts {
    pub busy_poll: bool,
    pub cpu: Option<usize>,
}

/// What a descriptor is.
pub(crate) enum Target {
    Exs,
    Kernel,
}

/// Bytes of the registration behind zero-length receives (none is ever written).
const ZERO_MEM_LEN: usize = 64;
/// Largest backlog.
const BACKLOG_MAX: usize = 4096;
/// Most EXS sockets at once.
const SOCKS_MAX: usize = 65536;

/// Where our descriptors start: half the soft limit on open files, within [64, 8192].
fn high_fd_base() -> libc::c_int {
    // SAFETY: `r` is a plain struct the call fills; the result is checked.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
        r.rlim_cur
    } else {
        1024
    };
    (soft / 2).clamp(64, 8192) as libc::c_int
}

fn ino_of(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: `st` is a plain struct the call fills; the result is checked.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `fd` is only inspected.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

impl State {
    /// `target` for the data calls (exs_send, exs_recv), without the system call that
    /// checks the descriptor is still the one we made: the table says. Our descriptors
    /// live at high numbers, which socket(2) (lowest free number) does not reach while
    /// a program holds fewer descriptors than that; every other call checks in full.
    #[inline]
    pub fn target_fast(&mut self, fd: RawFd) -> Target {
        if self.socks.contains_key(&fd) {
            Target::Exs
        } else {
            Target::Kernel
        }
    }

    /// Whether `fd` is one of ours (still the descriptor we made) or a kernel one.
    pub fn target(&mut self, fd: RawFd) -> Target {
        match self.socks.get(&fd) {
            Some(s) if ino_of(fd) == Some(s.ino) => Target::Exs,
            Some(_) => {
                self.drop_stale(fd);
                Target::Kernel
            }
            None => Target::Kernel,
        }
    }

    /// The program closed our descriptor `fd` behind our back (its number may already
    /// name something else): forget the descriptor without closing it, and end the socket
    /// as `exs_close` would, with no CLOSE event.
    fn drop_stale(&mut self, fd: RawFd) {
        let Some(s) = self.socks.remove(&fd) else {
            return;
        };
        tracing::info!("EXS socket {fd} was closed with close(2), not exs_close; ending it");
        std::mem::forget(s.memfd);
        end_sock(self, s.state, None);
    }

    pub fn sock(&mut self, fd: RawFd) -> XResult<&mut Sock> {
        let ok = self
            .socks
            .get(&fd)
            .is_some_and(|s| ino_of(fd) == Some(s.ino));
        if !ok {
            return Err(fail(libc::ENOTSOCK, format!("{fd} is not an EXS socket")));
        }
        self.socks
            .get_mut(&fd)
            .ok_or_else(|| fail(libc::ENOTSOCK, format!("{fd} is not an EXS socket")))
    }

    /// A new descriptor for an EXS socket.
    pub fn new_sock(
        &mut self,
        domain: i32,
        ty: SockType,
        opts: Opts,
        state: SockState,
    ) -> XResult<RawFd> {
        if self.socks.len() >= SOCKS_MAX {
            return Err(fail(libc::EMFILE, "too many EXS sockets"));
        }
        // SAFETY: a plain system call with a static name; the result is checked.
        let raw = unsafe { libc::memfd_create(c"exs-socket".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            let e = std::io::Error::last_os_error();
            return Err(fail(
                e.raw_os_error().unwrap_or(libc::EMFILE),
                format!("a descriptor for an EXS socket: {e}"),
            ));
        }
        // SAFETY: `raw` was just opened and is owned by nothing else.
        let low = unsafe { OwnedFd::from_raw_fd(raw) };
        // Moved up, away from the numbers socket(2) hands out (the lowest free one).
        // SAFETY: duplicates our own descriptor; the result is checked.
        let high = unsafe { libc::fcntl(raw, libc::F_DUPFD_CLOEXEC, high_fd_base()) };
        let memfd = if high >= 0 {
            drop(low);
            // SAFETY: `high` was just made and is owned by nothing else.
            unsafe { OwnedFd::from_raw_fd(high) }
        } else {
            low
        };
        let raw = memfd.as_raw_fd();
        let ino = ino_of(raw).ok_or_else(|| fail(libc::EIO, "fstat of a new memfd failed"))?;
        // An entry under this number is stale: its descriptor was closed behind our back.
        self.drop_stale(raw);
        self.socks.insert(
            raw,
            Sock {
                memfd,
                ino,
                domain,
                ty,
                opts,
                bound: None,
                state,
            },
        );
        Ok(raw)
    }

    pub fn queue(&self, qh: exs_qhandle_t) -> XResult<Arc<Queue>> {
        self.queues
            .get(&qh)
            .cloned()
            .ok_or_else(|| fail(libc::EINVAL, format!("{qh} is not an event queue")))
    }

    /// Check a buffer against its registration and hold the registration busy.
    pub fn hold_mem(&mut self, mh: exs_mhandle_t, buf: usize, len: usize) -> XResult<()> {
        let m = self.mems.get_mut(&mh).ok_or_else(|| {
            fail(
                libc::EINVAL,
                format!("{mh} is not a memory registration (never made, or deregistered)"),
            )
        })?;
        m.covers(mh, buf, len)?;
        m.busy += 1;
        Ok(())
    }

    /// Registration `mh` as an advertisement's key: the caller's, a staging buffer, or
    /// ours for zero-length receives (which `mems` does not hold: the caller can neither
    /// use nor deregister it).
    pub fn key_mem(&self, mh: u64) -> Option<&Mem> {
        match &self.zero_reg {
            Some((z, m)) if *z == mh => Some(m),
            _ => self.mems.get(&mh).or_else(|| self.staged.get(&mh)),
        }
    }

    /// The registration a zero-length SEQPACKET receive advertises, which may hold none
    /// of its own (`exs_recv(fd, NULL, 0, ..., EXS_MHANDLE_INVALID)`, or `exs_recvmsg`
    /// over empty iovecs): its handle and address. Made on the first such receive, kept
    /// for the life of the library; the peer writes no byte into it (the advertisement
    /// is of 0 bytes), only the signal word says that a message was taken.
    pub fn zero_mem(&mut self, ctx: &courier_core::Context) -> XResult<(u64, usize)> {
        if let Some((mh, m)) = &self.zero_reg {
            return Ok((*mh, m.addr));
        }
        let m = Mem::allocate(ctx, ZERO_MEM_LEN)?;
        self.next_mh += 1;
        let mh = self.next_mh;
        let addr = m.addr;
        self.zero_reg = Some((mh, m));
        Ok((mh, addr))
    }

    /// Post an operation's event (and release what it held).
    pub fn finish(&mut self, op: Op, result: isize, flags: i32) {
        if op.mh != 0
            && let Some(m) = self.mems.get_mut(&op.mh)
        {
            m.busy = m.busy.saturating_sub(1);
        }
        let errno = if result < 0 { (-result) as i32 } else { 0 };
        if op.kind == EXS_EVT_RECVMSG {
            super::msg::put_msg_flags(op.buf, flags);
        }
        op.q.push(exs_event_t {
            exs_evt_type: op.kind,
            exs_evt_fd: op.fd,
            exs_evt_ahandle: op.ahandle as exs_ahandle_t,
            exs_evt_result: result,
            exs_evt_errno: errno,
            exs_evt_flags: flags,
            exs_evt_buf: op.buf as *mut libc::c_void,
            exs_evt_len: op.len,
        });
    }

    pub fn fail_op(&mut self, op: Op, errno: i32) {
        self.finish(op, -(errno as isize), 0);
    }

    // ----- connections -------------------------------------------------------------------

    pub fn conn_alloc(&mut self) -> (u32, u32) {
        if let Some(i) = self.free_conns.pop() {
            let s = &mut self.conns[i as usize];
            s.generation = s.generation.wrapping_add(1);
            return (i, s.generation);
        }
        self.conns.push(ConnSlot {
            generation: 1,
            conn: None,
        });
        ((self.conns.len() - 1) as u32, 1)
    }

    pub fn conn_put(&mut self, r: ConnRef, c: Box<Conn>) {
        if let Some(s) = self.conns.get_mut(r.idx as usize)
            && s.generation == r.generation
        {
            s.conn = Some(c);
        }
    }

    /// Free a connection's slot for good.
    pub fn conn_free(&mut self, r: ConnRef) {
        if let Some(s) = self.conns.get_mut(r.idx as usize)
            && s.generation == r.generation
        {
            s.conn = None;
            self.free_conns.push(r.idx);
        }
        self.watch.retain(|&i| i != r);
        self.closing.retain(|&c| c != r);
    }

    /// Run `f` on a connection taken out of its slot (so `f` may use the rest of the
    /// state); `None` if it is gone. `f` returns whether the connection lives on.
    pub fn with_conn<T>(
        &mut self,
        r: ConnRef,
        f: impl FnOnce(&mut State, &mut Conn) -> T,
    ) -> Option<T> {
        let slot = self.conns.get_mut(r.idx as usize)?;
        if slot.generation != r.generation {
            return None;
        }
        let mut c = slot.conn.take()?;
        let out = f(self, &mut c);
        if c.dead_slot {
            // Finalized inside `f`: the slot is freed, the connection dropped.
            self.conn_free(r);
        } else {
            self.conn_put(r, c);
        }
        Some(out)
    }

    pub fn token(&mut self, send: u64) -> usize {
        self.next_token = self.next_token.wrapping_add(1).max(1);
        self.tokens.insert(self.next_token, send);
        self.next_token
    }

    /// Post a send's event once it is issued whole and Courier is done with it.
    pub fn send_settle(&mut self, id: u64) {
        let done = self
            .sends
            .get(&id)
            .is_some_and(|s| s.issued && s.inflight == 0);
        if !done {
            return;
        }
        let Some(s) = self.sends.remove(&id) else {
            return;
        };
        if s.posted {
            if s.op.mh != 0
                && let Some(m) = self.mems.get_mut(&s.op.mh)
            {
                m.busy = m.busy.saturating_sub(1);
            }
            return;
        }
        let result = match &s.error {
            Some(e) => -(e.errno as isize),
            None => s.op.len as isize,
        };
        self.finish(s.op, result, 0);
    }
}

// ----- set-up calls --------------------------------------------------------------------------

pub(crate) fn socket(l: &Lib, domain: i32, ty: i32, protocol: i32) -> XResult<RawFd> {
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return Err(fail(
            libc::EAFNOSUPPORT,
            format!(
                "EXS sockets are AF_INET or AF_INET6 (got domain {domain}); use socket(2) for others and pass that descriptor to the exs_ calls"
            ),
        ));
    }
    let base = ty & !(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK);
    let ty = match base {
        libc::SOCK_STREAM => SockType::Stream,
        libc::SOCK_SEQPACKET => SockType::Seqpacket,
        _ => {
            return Err(fail(
                libc::EPROTONOSUPPORT,
                format!("EXS sockets are SOCK_STREAM or SOCK_SEQPACKET (got type {base})"),
            ));
        }
    };
    if protocol != 0 {
        return Err(fail(
            libc::EPROTONOSUPPORT,
            format!("protocol {protocol}: only 0"),
        ));
    }
    l.st()
        .new_sock(domain, ty, Opts::default(), SockState::Fresh)
}

pub(crate) fn bind(l: &Lib, fd: RawFd, addr: SocketAddr) -> XResult<()> {
    let mut st = l.st();
    let s = st.sock(fd)?;
    if !matches!(s.state, SockState::Fresh) || s.bound.is_some() {
        return Err(fail(
            libc::EINVAL,
            format!("socket {fd} is already bound or in use"),
        ));
    }
    s.bound = Some(addr);
    Ok(())
}

pub(crate) fn listen(l: &'static Lib, fd: RawFd, backlog: i32) -> XResult<()> {
    let backlog = (backlog.max(1) as usize).min(BACKLOG_MAX);
    let mut st = l.st();
    let s = st.sock(fd)?;
    if let SockState::Listening(ls) = &mut s.state {
        ls.backlog = backlog;
        return Ok(());
    }
    if !matches!(s.state, SockState::Fresh) {
        return Err(fail(libc::EISCONN, format!("socket {fd} is connected")));
    }
    let addr = s.bound.ok_or_else(|| {
        fail(
            libc::EDESTADDRREQ,
            "exs_listen on an unbound socket: exs_bind it first (port 0 picks one)",
        )
    })?;
    let ino = s.ino;
    let listener = Listener::new(&l.worker, addr, move |req| on_conn_request(fd, ino, req))?;
    let s = st.sock(fd)?;
    s.bound = Some(listener.local_addr());
    s.state = SockState::Listening(Listen {
        listener: Some(listener),
        backlog,
        ready: VecDeque::new(),
        handshaking: 0,
        accepts: VecDeque::new(),
    });
    Ok(())
}

/// A client connects to a listening socket (inside progress).
fn on_conn_request(fd: RawFd, ino: (u64, u64), req: ConnRequest) {
    let Some(l) = super::lib_opt() else { return };
    let mut st = l.st();
    let client = req.client_addr().parse::<SocketAddr>().ok();
    let Some(s) = st.socks.get_mut(&fd).filter(|s| s.ino == ino) else {
        req.reject();
        return;
    };
    let (ty, opts) = (s.ty, s.opts);
    let SockState::Listening(ls) = &mut s.state else {
        req.reject();
        return;
    };
    if ls.ready.len() + ls.handshaking >= ls.backlog {
        tracing::info!(
            "EXS listener {fd}: backlog of {} full; connection refused",
            ls.backlog
        );
        req.reject();
        return;
    }
    ls.handshaking += 1;
    let (idx, generation) = st.conn_alloc();
    let r = ConnRef { idx, generation };
    let ep = match req.accept(error_params(r)) {
        Ok(ep) => ep,
        Err(e) => {
            tracing::info!("EXS listener {fd}: accepting a connection failed: {e}");
            st.conn_free(r);
            if let Some(SockState::Listening(ls)) = st.socks.get_mut(&fd).map(|s| &mut s.state) {
                ls.handshaking -= 1;
            }
            return;
        }
    };
    conn::start(&mut st, l, r, ep, ty, opts, None, Some(fd), client);
}

/// Endpoint parameters whose error handler fails connection `r`.
pub(crate) fn error_params(r: ConnRef) -> EndpointParams {
    EndpointParams::default().error_handler(move |e: &Error| {
        if let Some(l) = super::lib_opt() {
            let mut st = l.st();
            conn::on_ep_error(&mut st, r, e);
        }
    })
}

pub(crate) fn accept(l: &Lib, fd: RawFd, op: Op, addr: usize, addrlen: usize) -> XResult<()> {
    let mut st = l.st();
    let s = st.sock(fd)?;
    let SockState::Listening(ls) = &mut s.state else {
        op.q.unreserve();
        return Err(fail(libc::EINVAL, format!("socket {fd} is not listening")));
    };
    ls.accepts.push_back((op, addr, addrlen));
    match_accepts(&mut st, fd);
    Ok(())
}

/// Hand connections that are set up to `exs_accept` calls waiting on `fd`.
pub(crate) fn match_accepts(st: &mut State, fd: RawFd) {
    loop {
        let (ty, opts, domain) = match st.socks.get(&fd) {
            Some(s) => (s.ty, s.opts, s.domain),
            None => return,
        };
        let Some(SockState::Listening(ls)) = st.socks.get_mut(&fd).map(|s| &mut s.state) else {
            return;
        };
        if ls.accepts.is_empty() || ls.ready.is_empty() {
            return;
        }
        let Some(r) = ls.ready.pop_front() else {
            return;
        };
        let Some((op, addr, addrlen)) = ls.accepts.pop_front() else {
            return;
        };
        let newfd = match st.new_sock(domain, ty, opts, SockState::Conn(r)) {
            Ok(n) => n,
            Err(e) => {
                // The connection goes back; the accept fails.
                if let Some(SockState::Listening(ls)) = st.socks.get_mut(&fd).map(|s| &mut s.state)
                {
                    ls.ready.push_front(r);
                }
                st.fail_op(op, e.errno);
                continue;
            }
        };
        let peer = st
            .with_conn(r, |_, c| {
                c.fd = Some(newfd);
                c.listen_fd = None;
                c.peer_addr
            })
            .flatten();
        if let Some(p) = peer {
            write_sockaddr(p, addr, addrlen);
        }
        st.finish(op, newfd as isize, 0);
    }
}

pub(crate) fn connect(l: &'static Lib, fd: RawFd, addr: SocketAddr, op: Op) -> XResult<()> {
    let mut st = l.st();
    let s = st.sock(fd)?;
    match s.state {
        SockState::Fresh => {}
        SockState::Listening(_) => {
            op.q.unreserve();
            return Err(fail(libc::EINVAL, format!("socket {fd} is listening")));
        }
        SockState::Conn(_) => {
            op.q.unreserve();
            return Err(fail(
                libc::EISCONN,
                format!("socket {fd} is already connected"),
            ));
        }
    }
    let (ty, opts) = (s.ty, s.opts);
    let (idx, generation) = st.conn_alloc();
    let r = ConnRef { idx, generation };
    let token = (u64::from(std::process::id()) << 32) | u64::from(idx);
    let ep = match l.worker.connect_sockaddr(addr, token, error_params(r)) {
        Ok(ep) => ep,
        Err(e) => {
            st.conn_free(r);
            let errno = match super::errno_of(&e) {
                libc::EIO => libc::ECONNREFUSED,
                n => n,
            };
            // Refused at once: the event says so, as it would have later.
            tracing::debug!("EXS connect to {addr}: {e}");
            st.fail_op(op, errno);
            return Ok(());
        }
    };
    if let Ok(s) = st.sock(fd) {
        s.state = SockState::Conn(r);
    }
    conn::start(
        &mut st,
        l,
        r,
        ep,
        ty,
        opts,
        Some((op, fd)),
        None,
        Some(addr),
    );
    Ok(())
}

/// Write `a` as a `struct sockaddr` at `addr` (capacity `*addrlen`), as accept(2) does.
pub(crate) fn write_sockaddr(a: SocketAddr, addr: usize, addrlen: usize) {
    if addr == 0 || addrlen == 0 {
        return;
    }
    let (storage, len) = sockaddr_of(a);
    // SAFETY: the caller gave `addrlen` as a valid socklen_t and `addr` as `*addrlen`
    // writable bytes, to stay valid until the event (exs_accept's contract).
    unsafe {
        let cap = *(addrlen as *const libc::socklen_t) as usize;
        let n = cap.min(len);
        std::ptr::copy_nonoverlapping(&storage as *const _ as *const u8, addr as *mut u8, n);
        *(addrlen as *mut libc::socklen_t) = len as libc::socklen_t;
    }
}

pub(crate) fn sockaddr_of(a: SocketAddr) -> (libc::sockaddr_storage, usize) {
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            (ss, std::mem::size_of::<libc::sockaddr_in>())
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_in6 fits in sockaddr_storage.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            (ss, std::mem::size_of::<libc::sockaddr_in6>())
        }
    }
}

/// A `struct sockaddr` from the caller, as an address.
///
/// # Safety
/// `addr` must point at `len` readable bytes.
pub(crate) unsafe fn parse_sockaddr(
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> XResult<SocketAddr> {
    if addr.is_null() {
        return Err(fail(libc::EFAULT, "address is NULL"));
    }
    let len = len as usize;
    // SAFETY: the caller promises `len` readable bytes; the family is read only when there
    // are enough of them.
    let family = if len >= 2 {
        (unsafe { (*addr).sa_family }) as i32
    } else {
        -1
    };
    match family {
        libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: long enough for a sockaddr_in (checked); unaligned read.
            let sin = unsafe { std::ptr::read_unaligned(addr as *const libc::sockaddr_in) };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Ok(SocketAddr::from((ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: long enough for a sockaddr_in6 (checked); unaligned read.
            let sin6 = unsafe { std::ptr::read_unaligned(addr as *const libc::sockaddr_in6) };
            Ok(SocketAddr::V6(std::net::SocketAddrV6::new(
                std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        libc::AF_INET | libc::AF_INET6 => Err(fail(
            libc::EINVAL,
            format!("address length {len} too short"),
        )),
        f => Err(fail(
            libc::EAFNOSUPPORT,
            format!("address family {f}: EXS sockets take AF_INET or AF_INET6"),
        )),
    }
}

/// Close an EXS socket: pending operations complete with `ECANCELED`, the peer is told,
/// and the descriptor is released now. `close_op`: the CLOSE event to post when done.
pub(crate) fn close(l: &Lib, fd: RawFd, close_op: Option<Op>) -> XResult<()> {
    let mut st = l.st();
    st.sock(fd)?;
    let Some(s) = st.socks.remove(&fd) else {
        return Err(fail(libc::EBADF, format!("{fd} is not an EXS socket")));
    };
    end_sock(&mut st, s.state, close_op);
    // The memfd closes here: the number is free for the kernel to hand out again.
    drop(s.memfd);
    Ok(())
}

/// End what a socket in `state` holds (see `close`).
fn end_sock(st: &mut State, state: SockState, close_op: Option<Op>) {
    match state {
        SockState::Fresh => {
            if let Some(op) = close_op {
                st.finish(op, 0, 0);
            }
        }
        SockState::Listening(mut ls) => {
            drop(ls.listener.take());
            for (op, _, _) in ls.accepts.drain(..) {
                st.fail_op(op, libc::ECANCELED);
            }
            for r in ls.ready.drain(..) {
                st.with_conn(r, |st, c| conn::close(st, c, None));
            }
            if let Some(op) = close_op {
                st.finish(op, 0, 0);
            }
        }
        SockState::Conn(r) => {
            let mut op = close_op;
            st.with_conn(r, |st, c| conn::close(st, c, op.take()));
            if let Some(op) = op {
                // Already torn down: the close is done.
                st.finish(op, 0, 0);
            }
        }
    }
}
