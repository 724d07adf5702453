//! Socket plumbing for tcp: creating, tuning and connecting sockets, and listing interfaces.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{self, AddressFamily, SocketFlags, SocketType, sockopt};

use crate::base::config::TcpCongestion;
use crate::base::{Config, Error, Result, Status};

/// A new non-blocking, close-on-exec TCP socket for `addr`'s family.
pub(super) fn new_socket(addr: &SocketAddr) -> Result<OwnedFd> {
    let family = if addr.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    net::socket_with(
        family,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        Some(net::ipproto::TCP),
    )
    .map_err(|e| Error::io(&format!("tcp socket for {addr}"), e))
}

/// Apply buffer sizes (0 = keep the system default).
pub(super) fn set_buffers(
    fd: BorrowedFd<'_>,
    sndbuf: usize,
    rcvbuf: usize,
    what: &str,
) -> Result<()> {
    if sndbuf > 0 {
        sockopt::set_socket_send_buffer_size(fd, sndbuf)
            .map_err(|e| Error::io(&format!("{what}: SO_SNDBUF={sndbuf}"), e))?;
    }
    if rcvbuf > 0 {
        sockopt::set_socket_recv_buffer_size(fd, rcvbuf)
            .map_err(|e| Error::io(&format!("{what}: SO_RCVBUF={rcvbuf}"), e))?;
    }
    Ok(())
}

/// Raise a connected socket's receive buffer to `rcvbuf`, and the window it advertises
/// with it. The kernel derives the window's ceiling (`TCP_WINDOW_CLAMP`) from the buffer
/// only when its estimate of payload per buffer byte changes, which a steady stream does
/// not do: without the clamp raised by the same factor, the peer would go on seeing the
/// smaller buffer's window (bench/analysis.md).
pub(super) fn grow_rcvbuf(fd: BorrowedFd<'_>, rcvbuf: usize) -> std::io::Result<()> {
    let (before, clamp) = (sockopt::socket_recv_buffer_size(fd)?, window_clamp(fd)?);
    sockopt::set_socket_recv_buffer_size(fd, rcvbuf)?;
    let after = sockopt::socket_recv_buffer_size(fd)?;
    if before == 0 || after <= before || clamp <= 0 {
        return Ok(());
    }
    let raised = (clamp as u64 * after as u64 / before as u64).min(i32::MAX as u64) as i32;
    set_window_clamp(fd, raised)
}

/// The socket's `TCP_WINDOW_CLAMP`.
pub(super) fn window_clamp(fd: BorrowedFd<'_>) -> std::io::Result<i32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are live locals of the sizes passed; the kernel writes at most
    // `len` bytes into `v`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_WINDOW_CLAMP,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(v)
}

/// Set the socket's `TCP_WINDOW_CLAMP`.
fn set_window_clamp(fd: BorrowedFd<'_>, v: i32) -> std::io::Result<()> {
    // SAFETY: the kernel reads `size_of::<c_int>()` bytes from `v`, a live local.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_WINDOW_CLAMP,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Options every data socket gets: no Nagle delay.
pub(super) fn set_nodelay(fd: BorrowedFd<'_>, what: &str) -> Result<()> {
    sockopt::set_tcp_nodelay(fd, true).map_err(|e| Error::io(&format!("{what}: TCP_NODELAY"), e))
}

/// Choose a connected socket's congestion control (`COURIER_TCP_CONGESTION`). Between two
/// ends on one host no network is shared: reno lets the window open fully, where bbr
/// (the default on some systems) holds a loopback connection to about half of what it
/// carries otherwise (bench/analysis.md). Failure (an algorithm this process may not
/// use) only costs speed.
pub(super) fn set_congestion(
    fd: BorrowedFd<'_>,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    cc: &TcpCongestion,
) {
    let name = match cc {
        TcpCongestion::System => return,
        TcpCongestion::Named(n) => n.as_str(),
        TcpCongestion::Auto if same_host(peer, local) => "reno",
        TcpCongestion::Auto => return,
    };
    if let Err(e) = sockopt::set_tcp_congestion(fd, name) {
        // One the user named that the kernel lacks is worth a word, once per process.
        static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if matches!(cc, TcpCongestion::Named(_))
            && !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            let have =
                std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
                    .map(|s| s.trim().to_string())
                    .unwrap_or_else(|_| "unknown".into());
            tracing::warn!(
                "COURIER_TCP_CONGESTION={name}: the kernel refused it ({e}); tcp connections keep the system's congestion control (loaded here: {have})"
            );
        } else {
            tracing::debug!(
                "tcp to {peer}: congestion control {name} refused ({e}); the system's stays"
            );
        }
    }
}

/// Whether a connection between `local` and `peer` stays on this host: the peer is a
/// loopback address or the kernel routed to it from the same address.
pub(super) fn same_host(peer: SocketAddr, local: Option<SocketAddr>) -> bool {
    let plain = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        ip => ip,
    };
    let p = plain(peer.ip());
    p.is_loopback() || local.is_some_and(|l| plain(l.ip()) == p)
}

/// The socket's local address, if the kernel reports an IP one.
pub(super) fn local_addr(fd: BorrowedFd<'_>) -> Option<SocketAddr> {
    net::getsockname(fd)
        .ok()
        .and_then(|a| SocketAddr::try_from(a).ok())
}

/// Connect with a deadline. The socket is non-blocking; we wait for writability with poll.
pub(super) fn connect_with_timeout(addr: SocketAddr, cfg: &Config) -> Result<OwnedFd> {
    let unreachable = |why: &dyn std::fmt::Display| {
        Error::msg(Status::Unreachable, format!("connect to {addr}: {why}"))
    };
    let fd = new_socket(&addr).map_err(|e| unreachable(&e.detail()))?;
    let what = format!("connect to {addr}");
    // Buffer sizes before connecting. The kernel picks the window scale for the largest
    // buffer the system allows, so a receive buffer grown later (`Rx::bulk_arrived`) fits it.
    set_buffers(
        fd.as_fd(),
        cfg.tcp_sndbuf,
        super::first_rcvbuf(cfg.tcp_rcvbuf),
        &what,
    )?;
    set_nodelay(fd.as_fd(), &what)?;
    loop {
        match net::connect(&fd, &addr) {
            Ok(()) => return Ok(fd),
            Err(Errno::INTR) => continue,
            Err(Errno::INPROGRESS) | Err(Errno::AGAIN) | Err(Errno::ALREADY) => break,
            Err(Errno::ISCONN) => return Ok(fd),
            Err(e) => return Err(unreachable(&e)),
        }
    }
    let timeout = cfg.tcp_connect_timeout;
    let deadline = Instant::now().checked_add(timeout);
    loop {
        let left = match deadline {
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return Err(Error::msg(
                        Status::Timeout,
                        format!("connect to {addr}: no answer within {timeout:?}"),
                    ));
                }
                Some(d - now)
            }
            None => None,
        };
        let ts = left.map(|l| Timespec {
            tv_sec: l.as_secs() as _,
            tv_nsec: l.subsec_nanos() as _,
        });
        let mut pfd = [PollFd::new(&fd, PollFlags::OUT)];
        match rustix::event::poll(&mut pfd, ts.as_ref()) {
            Ok(0) => continue, // deadline check above reports the timeout
            Ok(_) => break,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(unreachable(&format_args!("poll: {e}"))),
        }
    }
    match sockopt::socket_error(&fd) {
        Ok(Ok(())) => Ok(fd),
        Ok(Err(e)) => Err(unreachable(&e)),
        Err(e) => Err(unreachable(&format_args!("SO_ERROR: {e}"))),
    }
}

/// Whether an IPv6 address needs a scope id to be used (link-local); `IpAddr` cannot carry one.
fn needs_scope(ip: &Ipv6Addr) -> bool {
    (ip.segments()[0] & 0xffc0) == 0xfe80
}

/// Up interfaces with IPv4/IPv6 addresses, filtered by `filter` (None = all).
pub(super) fn interfaces(filter: Option<&[String]>) -> Vec<(String, IpAddr)> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        tracing::warn!(
            "getifaddrs failed: {}; tcp sees no interfaces",
            std::io::Error::last_os_error()
        );
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null()
            || ifa.ifa_name.is_null()
            || (ifa.ifa_flags & libc::IFF_UP as libc::c_uint) == 0
        {
            continue;
        }
        // SAFETY: non-null, NUL-terminated name owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: non-null sockaddr; its family says which struct it is.
        let family = unsafe { (*ifa.ifa_addr).sa_family } as libc::c_int;
        let ip = match family {
            libc::AF_INET => {
                // SAFETY: AF_INET addresses are sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: AF_INET6 addresses are sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                if needs_scope(&ip) {
                    continue;
                }
                IpAddr::V6(ip)
            }
            _ => continue,
        };
        if filter.is_some_and(|list| !list.contains(&name)) {
            continue;
        }
        out.push((name, ip));
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// A name for the device a local address belongs to: its interface, else the address.
pub(super) fn device_for(local: Option<SocketAddr>) -> String {
    let Some(local) = local else {
        return "unknown".into();
    };
    let ip = match local.ip() {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        ip => ip,
    };
    // Unfiltered: the device is a fact about the socket, whatever the selection.
    interfaces(None)
        .into_iter()
        .find(|(_, a)| *a == ip)
        .map(|(n, _)| n)
        .unwrap_or_else(|| ip.to_string())
}

/// Apply the keepalive settings to a TCP socket so a dead or unreachable peer is noticed by
/// the kernel within the timeout, whether or not the peer's application makes progress.
pub(crate) fn set_keepalive(fd: BorrowedFd<'_>, cfg: &Config) {
    if cfg.keepalive_timeout == Duration::MAX {
        return;
    }
    let iv = cfg.keepalive_interval.max(Duration::from_secs(1));
    let cnt = (cfg.keepalive_timeout.as_secs_f64() / iv.as_secs_f64())
        .ceil()
        .max(1.0) as u32;
    let _ = sockopt::set_socket_keepalive(fd, true);
    let _ = sockopt::set_tcp_keepidle(fd, iv);
    let _ = sockopt::set_tcp_keepintvl(fd, iv);
    let _ = sockopt::set_tcp_keepcnt(fd, cnt);
    let _ = sockopt::set_tcp_user_timeout(
        fd,
        cfg.keepalive_timeout.as_millis().min(u32::MAX as u128) as u32,
    );
}
