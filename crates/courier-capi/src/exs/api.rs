//! The socket and memory exports of `exs.h`. Each runs behind the panic boundary and
//! returns -1 with `errno` set on failure (`exs_last_error_detail` says why).

use std::ffi::{c_char, c_int, c_long, c_void};
use std::os::fd::RawFd;

use super::abi::*;
use super::conn::{
    ADV_LIMIT, INLINE_MAX_LIMIT, Opts, RCVBUF_LIMIT, SLOTS_LIMIT, SMALL_MAX_LIMIT, SPLIT_MIN_LIMIT,
};
use super::mem::{MEMS_MAX, Mem};
use super::sock::{self, Op, SockState, State, Target, parse_sockaddr, sockaddr_of};
use super::{XResult, boundary, boundary_handle, conn, fail, ksock, lib, recv, send};

/// Start the library (once per process; later calls only check the version).
#[unsafe(no_mangle)]
pub extern "C" fn exs_init(version: c_int) -> c_int {
    boundary(|| {
        if version != EXS_VERSION {
            return Err(fail(
                libc::EINVAL,
                format!("exs_init: version {version}, this library is EXS_VERSION {EXS_VERSION}"),
            ));
        }
        super::init()?;
        Ok(0)
    })
}

/// The sentence of the last failure on this thread ("" if none).
#[unsafe(no_mangle)]
pub extern "C" fn exs_last_error_detail() -> *const c_char {
    crate::status::courier_last_error_detail()
}

/// A new EXS socket (AF_INET or AF_INET6; SOCK_STREAM or SOCK_SEQPACKET).
#[unsafe(no_mangle)]
pub extern "C" fn exs_socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    boundary(|| sock::socket(lib()?, domain, ty, protocol))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn exs_bind(
    fd: c_int,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> c_int {
    boundary(|| {
        let l = lib()?;
        if let Target::Kernel = l.st().target(fd) {
            // SAFETY: bind(2)'s contract, passed on.
            return check(unsafe { libc::bind(fd, addr, len) }, "bind");
        }
        // SAFETY: the caller passes `len` readable bytes at `addr` (bind(2)'s contract).
        let a = unsafe { parse_sockaddr(addr, len) }?;
        sock::bind(l, fd, a)?;
        Ok(0)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn exs_listen(fd: c_int, backlog: c_int) -> c_int {
    boundary(|| {
        let l = lib()?;
        if let Target::Kernel = l.st().target(fd) {
            // SAFETY: a kernel socket's listen.
            return check(unsafe { libc::listen(fd, backlog) }, "listen");
        }
        sock::listen(l, fd, backlog)?;
        Ok(0)
    })
}

fn check(r: c_int, what: &str) -> XResult<c_int> {
    if r < 0 {
        let e = std::io::Error::last_os_error();
        return Err(fail(
            e.raw_os_error().unwrap_or(libc::EIO),
            format!("{what}: {e}"),
        ));
    }
    Ok(r)
}

/// An operation on queue `qh`, its slot reserved.
fn start_op(
    st: &mut State,
    qh: exs_qhandle_t,
    kind: c_int,
    fd: RawFd,
    ahandle: exs_ahandle_t,
) -> XResult<Op> {
    let q = st.queue(qh)?;
    q.reserve()?;
    Ok(Op {
        q,
        kind,
        fd,
        ahandle: ahandle as usize,
        buf: 0,
        len: 0,
        mh: 0,
    })
}

/// Accept a connection: the ACCEPT event carries the new descriptor; `addr`/`addrlen`
/// (may be NULL) receive the peer's address before it is queued, so they must stay valid
/// until then.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn exs_accept(
    fd: c_int,
    addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
    qh: exs_qhandle_t,
    ahandle: exs_ahandle_t,
) -> c_int {
    boundary(|| {
        let l = lib()?;
        if !addr.is_null() && addrlen.is_null() {
            return Err(fail(libc::EFAULT, "addr given without addrlen"));
        }
        let mut st = l.st();
        let op = start_op(&mut st, qh, EXS_EVT_ACCEPT, fd, ahandle)?;
        match st.target(fd) {
            Target::Exs => {
                drop(st);
                sock::accept(l, fd, op, addr as usize, addrlen as usize)?
            }
            Target::Kernel => ksock::accept(l, &mut st, fd, op, addr as usize, addrlen as usize)?,
        }
        Ok(0)
    })
}

/// Start connecting; the CONNECT event says how it went (a refused connection is an event
/// with `-ECONNREFUSED`, not a failure of this call).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn exs_connect(
    fd: c_int,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
    qh: exs_qhandle_t,
    ahandle: exs_ahandle_t,
) -> c_int {
    boundary(|| {
        let l = lib()?;
        let mut st = l.st();
        match st.target(fd) {
            Target::Exs => {
                // SAFETY: connect(2)'s contract: `len` readable bytes at `addr`.
                let a = unsafe { parse_sockaddr(addr, len) }?;
                let op = start_op(&mut st, qh, EXS_EVT_CONNECT, fd, ahandle)?;
                drop(st);
                sock::connect(l, fd, a, op)?;
                l.engine.kick_if_sleeping();
            }
            Target::Kernel => {
                if addr.is_null() || len as usize > std::mem::size_of::<libc::sockaddr_storage>() {
                    return Err(fail(libc::EINVAL, "bad address for connect"));
                }
                // SAFETY: zeroed storage is valid; `len` bytes of the caller's address fit.
                let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
                // SAFETY: as above.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        addr as *const u8,
                        &mut ss as *mut _ as *mut u8,
                        len as usize,
                    )
                };
                let op = start_op(&mut st, qh, EXS_EVT_CONNECT, fd, ahandle)?;
                ksock::connect(l, &mut st, fd, &ss, len, op)?;
            }
        }
        Ok(0)
    })
}

/// Close: pending operations complete with `ECANCELED`; with a queue, a CLOSE event says
/// when everything is done (`EXS_QHANDLE_INVALID`: no event). The descriptor is released
/// at once.
#[unsafe(no_mangle)]
pub extern "C" fn exs_close(fd: c_int, qh: exs_qhandle_t, ahandle: exs_ahandle_t) -> c_int {
    boundary(|| {
        let l = lib()?;
        let mut st = l.st();
        let op = if qh == EXS_QHANDLE_INVALID {
            None
        } else {
            Some(start_op(&mut st, qh, EXS_EVT_CLOSE, fd, ahandle)?)
        };
        match st.target(fd) {
            Target::Exs => {
                drop(st);
                sock::close(l, fd, op)?;
                l.engine.kick_if_sleeping();
            }
            Target::Kernel => ksock::close(l, &mut st, fd, op)?,
        }
        Ok(0)
    })
}

/// Shut a connection down for reading (`SHUT_RD`), writing (`SHUT_WR`) or both, as
/// shutdown(2): synchronous (it returns once the shutdown is ordered; the FIN follows the
/// sends already started, and the peer's receives see the end after all their data).
#[unsafe(no_mangle)]
pub extern "C" fn exs_shutdown(fd: c_int, how: c_int) -> c_int {
    boundary(|| {
        let l = lib()?;
        let mut st = l.st();
        match st.target(fd) {
            Target::Kernel => ksock::shutdown(l, &mut st, fd, how)?,
            Target::Exs => {
                let state = &st.sock(fd)?.state;
                check_how(how)?;
                let SockState::Conn(r) = *state else {
                    return Err(fail(
                        libc::ENOTCONN,
                        format!("exs_shutdown: socket {fd} is not connected"),
                    ));
                };
                st.with_conn(r, |st, c| conn::shutdown(st, c, how))
                    .unwrap_or_else(|| {
                        Err(fail(
                            libc::ENOTCONN,
                            format!("exs_shutdown: socket {fd}: the connection is gone"),
                        ))
                    })?;
                drop(st);
                l.engine.kick_if_sleeping();
            }
        }
        Ok(0)
    })
}

/// `how` of shutdown(2).
pub(crate) fn check_how(how: c_int) -> XResult<()> {
    match how {
        libc::SHUT_RD | libc::SHUT_WR | libc::SHUT_RDWR => Ok(()),
        _ => Err(fail(
            libc::EINVAL,
            format!("exs_shutdown: how {how} is not SHUT_RD, SHUT_WR or SHUT_RDWR"),
        )),
    }
}

const SEND_OK: c_int = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT | libc::MSG_MORE | libc::MSG_EOR;
const RECV_OK: c_int = libc::MSG_WAITALL | libc::MSG_DONTWAIT;

/// `flags` holds only what a send (`SEND_OK`) or a receive (`RECV_OK`) takes, else
/// EOPNOTSUPP naming `call`.
pub(super) fn check_flags(flags: c_int, send: bool, call: &str) -> XResult<()> {
    let ok = if send { SEND_OK } else { RECV_OK };
    if flags & !ok != 0 {
        return Err(fail(
            libc::EOPNOTSUPP,
            format!("flags {:#x} are not supported by {call}", flags & !ok),
        ));
    }
    Ok(())
}

/// Shared by send and receive: the checks, the reservation, the registration held.
#[allow(clippy::too_many_arguments)]
fn data_op(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    qh: exs_qhandle_t,
    ahandle: exs_ahandle_t,
    mh: exs_mhandle_t,
    send: bool,
) -> XResult<c_int> {
    let l = lib()?;
    check_flags(flags, send, if send { "exs_send" } else { "exs_recv" })?;
    let mut st = l.st();
    let q = st.queue(qh)?;
    let buf = buf as usize;
    let hold = len > 0 || mh != EXS_MHANDLE_INVALID;
    if hold {
        st.hold_mem(mh, buf, len)?;
    }
    if let Err(e) = q.reserve() {
        if hold && let Some(m) = st.mems.get_mut(&mh) {
            m.busy -= 1;
        }
        return Err(e);
    }
    let op = Op {
        q,
        kind: if send { EXS_EVT_SEND } else { EXS_EVT_RECV },
        fd,
        ahandle: ahandle as usize,
        buf,
        len,
        mh: if hold { mh } else { 0 },
    };
    match st.target_fast(fd) {
        Target::Kernel => {
            if send {
                ksock::send(l, &mut st, fd, op, flags, None)?
            } else {
                ksock::recv(l, &mut st, fd, op, flags, None)?
            }
        }
        Target::Exs => {
            let r = match st.socks.get(&fd).map(|s| &s.state) {
                Some(SockState::Conn(r)) => Some(*r),
                _ => None,
            };
            let Some(r) = r else {
                undo(&mut st, &op);
                return Err(fail(
                    libc::ENOTCONN,
                    format!("socket {fd} is not connected"),
                ));
            };
            let mut op = Some(op);
            let res = st.with_conn(r, |st, c| {
                let op = op
                    .take()
                    .ok_or_else(|| fail(libc::EIO, "operation taken twice"))?;
                if send {
                    send::post_send(st, c, op, None)
                } else {
                    recv::post_recv(st, c, op, flags & libc::MSG_WAITALL != 0, None)
                }
            });
            match res {
                Some(r) => r?,
                None => {
                    if let Some(op) = op {
                        undo(&mut st, &op);
                    }
                    return Err(fail(
                        libc::ECONNRESET,
                        format!("socket {fd}: the connection is gone"),
                    ));
                }
            }
            drop(st);
            l.engine.kick_if_sleeping();
        }
    }
    Ok(0)
}

/// Give back what `data_op` took for an operation that did not start.
fn undo(st: &mut State, op: &Op) {
    op.q.unreserve();
    if op.mh != 0
        && let Some(m) = st.mems.get_mut(&op.mh)
    {
        m.busy = m.busy.saturating_sub(1);
    }
}

/// Start sending `len` bytes at `buf` (inside registration `mh`); 0 when started, -1 with
/// `EAGAIN` when the queue (or the peer's credits and advertisements) are full.
#[unsafe(no_mangle)]
pub extern "C" fn exs_send(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    qh: exs_qhandle_t,
    ahandle: exs_ahandle_t,
    mh: exs_mhandle_t,
) -> c_int {
    boundary(|| data_op(fd, buf, len, flags, qh, ahandle, mh, true))
}

/// Start receiving into `buf` (inside registration `mh`).
#[unsafe(no_mangle)]
pub extern "C" fn exs_recv(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    qh: exs_qhandle_t,
    ahandle: exs_ahandle_t,
    mh: exs_mhandle_t,
) -> c_int {
    boundary(|| data_op(fd, buf, len, flags, qh, ahandle, mh, false))
}

/// Register `[addr, addr + len)`.
#[unsafe(no_mangle)]
pub extern "C" fn exs_mregister(addr: *mut c_void, len: usize, flags: c_int) -> exs_mhandle_t {
    boundary_handle(EXS_MHANDLE_INVALID, || {
        let l = lib()?;
        let m = Mem::register(&l.ctx, addr as usize, len, flags)?;
        let mut st = l.st();
        if st.mems.len() >= MEMS_MAX {
            return Err(fail(
                libc::ENOMEM,
                format!("{MEMS_MAX} registrations already"),
            ));
        }
        st.next_mh += 1;
        let mh = st.next_mh;
        st.mems.insert(mh, m);
        Ok(mh)
    })
}

/// Deregister; `EBUSY` while an operation in flight uses it.
#[unsafe(no_mangle)]
pub extern "C" fn exs_mderegister(mh: exs_mhandle_t) -> c_int {
    boundary(|| {
        let l = lib()?;
        let mut st = l.st();
        let m = st
            .mems
            .get(&mh)
            .ok_or_else(|| fail(libc::EINVAL, format!("{mh} is not a memory registration")))?;
        if m.busy > 0 {
            return Err(fail(
                libc::EBUSY,
                format!(
                    "registration {mh} is used by {} operations in flight",
                    m.busy
                ),
            ));
        }
        st.mems.remove(&mh);
        Ok(0)
    })
}

fn range(v: c_long, lo: usize, hi: usize, what: &str) -> XResult<usize> {
    if v < lo as c_long || v as u128 > hi as u128 {
        return Err(fail(
            libc::EINVAL,
            format!("{what} {v} outside [{lo}, {hi}]"),
        ));
    }
    Ok(v as usize)
}

/// Tuning (`EXS_F_*`; OR `EXS_F_GET` to read). Returns the value read, or 0.
#[unsafe(no_mangle)]
pub extern "C" fn exs_fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_long {
    boundary(|| {
        let l = lib()?;
        let get = cmd & EXS_F_GET != 0;
        let cmd = cmd & !EXS_F_GET;
        let mut st = l.st();
        match cmd {
            EXS_F_BUSY_POLL => {
                if get {
                    return Ok(st.lib_opts.busy_poll as c_long);
                }
                let on = range(arg, 0, 1, "EXS_F_BUSY_POLL")? == 1;
                st.lib_opts.busy_poll = on;
                l.engine
                    .busy_poll
                    .store(on, std::sync::atomic::Ordering::Relaxed);
                return Ok(0);
            }
            EXS_F_CPU => {
                if get {
                    return Ok(st.lib_opts.cpu.map_or(-1, |c| c as c_long));
                }
                let cpu = if arg < 0 {
                    None
                } else {
                    Some(range(arg, 0, 1023, "EXS_F_CPU")?)
                };
                l.engine.pin(cpu)?;
                st.lib_opts.cpu = cpu;
                return Ok(0);
            }
            _ => {}
        }
        if let Target::Kernel = st.target(fd) {
            return Err(fail(
                libc::EOPNOTSUPP,
                format!("exs_fcntl command {cmd} applies to EXS sockets; {fd} is a kernel one"),
            ));
        }
        let s = st.sock(fd)?;
        let shaping = cmd != EXS_F_INLINE_MAX && cmd != EXS_F_SPLIT_MIN;
        if !get && shaping && matches!(s.state, SockState::Conn(_)) {
            return Err(fail(
                libc::EISCONN,
                "this setting shapes the connection: set it before exs_connect or exs_listen",
            ));
        }
        let o: &mut Opts = &mut s.opts;
        let v = match cmd {
            EXS_F_SMALL_MAX => {
                if !get {
                    o.small_max = range(arg, 0, SMALL_MAX_LIMIT, "EXS_F_SMALL_MAX")?;
                }
                o.small_max as c_long
            }
            EXS_F_INLINE_MAX => {
                if !get {
                    o.inline_max = range(arg, 0, INLINE_MAX_LIMIT, "EXS_F_INLINE_MAX")?;
                }
                o.inline_max as c_long
            }
            EXS_F_RCVBUF => {
                if !get {
                    o.rcvbuf = range(arg, 1, RCVBUF_LIMIT, "EXS_F_RCVBUF")?;
                }
                o.rcvbuf as c_long
            }
            EXS_F_NO_RCVBUF => {
                if !get {
                    o.no_rcvbuf = range(arg, 0, 1, "EXS_F_NO_RCVBUF")? == 1;
                }
                o.no_rcvbuf as c_long
            }
            EXS_F_ADV_CREDITS => {
                if !get {
                    o.adv = range(arg, 1, ADV_LIMIT, "EXS_F_ADV_CREDITS")?;
                }
                o.adv as c_long
            }
            EXS_F_SPLIT_MIN => {
                if !get {
                    o.split_min = range(arg, 0, SPLIT_MIN_LIMIT, "EXS_F_SPLIT_MIN")?;
                }
                o.split_min as c_long
            }
            EXS_F_SMALL_SLOTS => {
                if !get {
                    o.slots = range(arg, 1, SLOTS_LIMIT, "EXS_F_SMALL_SLOTS")?;
                }
                o.slots as c_long
            }
            _ => {
                return Err(fail(
                    libc::EINVAL,
                    format!("unknown exs_fcntl command {cmd}"),
                ));
            }
        };
        let opts = *o;
        if (cmd == EXS_F_INLINE_MAX || cmd == EXS_F_SPLIT_MIN)
            && !get
            && let SockState::Conn(r) = s.state
        {
            st.with_conn(r, |_, c| {
                c.opts.inline_max = opts.inline_max;
                c.opts.split_min = opts.split_min;
            });
        }
        Ok(if get { v } else { 0 })
    })
}

/// Write `a` for getsockname/getpeername.
fn put_addr(
    a: std::net::SocketAddr,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> XResult<c_int> {
    if addr.is_null() || len.is_null() {
        return Err(fail(libc::EFAULT, "address or length is NULL"));
    }
    let (ss, n) = sockaddr_of(a);
    // SAFETY: the caller gives `*len` writable bytes at `addr` (getsockname(2)'s contract).
    unsafe {
        let cap = (*len as usize).min(n);
        std::ptr::copy_nonoverlapping(&ss as *const _ as *const u8, addr as *mut u8, cap);
        *len = n as libc::socklen_t;
    }
    Ok(0)
}

/// The local address (an EXS listener: the port it got).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn exs_getsockname(
    fd: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    boundary(|| {
        let l = lib()?;
        let mut st = l.st();
        if let Target::Kernel = st.target(fd) {
            // SAFETY: getsockname(2)'s contract, passed on.
            return check(unsafe { libc::getsockname(fd, addr, len) }, "getsockname");
        }
        let s = st.sock(fd)?;
        let a = match &s.state {
            SockState::Conn(r) => {
                let r = *r;
                st.with_conn(r, |_, c| c.ep.local_sockaddr()).flatten()
            }
            _ => s.bound,
        };
        let a = a.ok_or_else(|| fail(libc::EINVAL, format!("socket {fd} has no address")))?;
        put_addr(a, addr, len)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn exs_getpeername(
    fd: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    boundary(|| {
        let l = lib()?;
        let mut st = l.st();
        if let Target::Kernel = st.target(fd) {
            // SAFETY: getpeername(2)'s contract, passed on.
            return check(unsafe { libc::getpeername(fd, addr, len) }, "getpeername");
        }
        let s = st.sock(fd)?;
        let SockState::Conn(r) = s.state else {
            return Err(fail(
                libc::ENOTCONN,
                format!("socket {fd} is not connected"),
            ));
        };
        let a = st.with_conn(r, |_, c| c.peer_addr).flatten();
        let a =
            a.ok_or_else(|| fail(libc::ENOTCONN, format!("socket {fd}: peer address unknown")))?;
        put_addr(a, addr, len)
    })
}

fn put_int(v: c_int, val: *mut c_void, len: *mut libc::socklen_t) -> XResult<c_int> {
    if val.is_null() || len.is_null() {
        return Err(fail(libc::EFAULT, "option value or length is NULL"));
    }
    // SAFETY: the caller gives `*len` writable bytes at `val` (getsockopt(2)'s contract).
    unsafe {
        if (*len as usize) < std::mem::size_of::<c_int>() {
            return Err(fail(libc::EINVAL, "option buffer smaller than an int"));
        }
        *(val as *mut c_int) = v;
        *len = std::mem::size_of::<c_int>() as libc::socklen_t;
    }
    Ok(0)
}

fn put_str(s: &str, val: *mut c_void, len: *mut libc::socklen_t) -> XResult<c_int> {
    if val.is_null() || len.is_null() {
        return Err(fail(libc::EFAULT, "option value or length is NULL"));
    }
    // SAFETY: as `put_int`.
    unsafe {
        let cap = *len as usize;
        if cap < s.len() + 1 {
            return Err(fail(
                libc::EINVAL,
                format!("option buffer of {cap} bytes for {} ", s.len() + 1),
            ));
        }
        std::ptr::copy_nonoverlapping(s.as_ptr(), val as *mut u8, s.len());
        *(val as *mut u8).add(s.len()) = 0;
        *len = (s.len() + 1) as libc::socklen_t;
    }
    Ok(0)
}

/// Socket options: SOL_SOCKET's SO_TYPE, SO_DOMAIN, SO_ERROR, SO_RCVBUF, SO_ACCEPTCONN on
/// EXS sockets (kernel sockets: the kernel's), and `SOL_EXS`/`EXS_SO_TRANSPORT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn exs_getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut libc::socklen_t,
) -> c_int {
    boundary(|| {
        let l = lib()?;
        let mut st = l.st();
        if let Target::Kernel = st.target(fd) {
            if level == SOL_EXS && name == EXS_SO_TRANSPORT {
                return put_str("kernel", val, len);
            }
            // SAFETY: getsockopt(2)'s contract, passed on.
            return check(
                unsafe { libc::getsockopt(fd, level, name, val, len) },
                "getsockopt",
            );
        }
        let s = st.sock(fd)?;
        let (ty, domain, rcvbuf, listening) = (
            s.ty,
            s.domain,
            s.opts.rcvbuf,
            matches!(s.state, SockState::Listening(_)),
        );
        let conn = match s.state {
            SockState::Conn(r) => Some(r),
            _ => None,
        };
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_TYPE) => put_int(ty.code() as c_int, val, len),
            (libc::SOL_SOCKET, libc::SO_DOMAIN) => put_int(domain, val, len),
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
                put_int(rcvbuf.min(c_int::MAX as usize) as c_int, val, len)
            }
            (libc::SOL_SOCKET, libc::SO_ACCEPTCONN) => put_int(listening as c_int, val, len),
            (libc::SOL_SOCKET, libc::SO_ERROR) => {
                let e = conn
                    .and_then(|r| st.with_conn(r, |_, c| c.err.as_ref().map(|e| e.errno)))
                    .flatten()
                    .unwrap_or(0);
                put_int(e, val, len)
            }
            (SOL_EXS, EXS_SO_TRANSPORT) => {
                let t = conn
                    .and_then(|r| st.with_conn(r, |_, c| c.ep.transport()))
                    .flatten()
                    .unwrap_or("none");
                put_str(t, val, len)
            }
            _ => Err(fail(
                libc::ENOPROTOOPT,
                format!("option {level}/{name} is not known for EXS sockets"),
            )),
        }
    })
}
