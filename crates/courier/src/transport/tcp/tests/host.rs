//! Sockets, addresses and interfaces: listing and filtering interfaces, unreachable peers,
//! idle listeners, congestion control within the host, what "same host" means, whether
//! anything waits in the buffer.

use super::*;

#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn interfaces_list_and_filter() {
    let all = interfaces(&cfg(&[]));
    assert!(all.iter().any(|(n, a)| n == "lo" && *a == LO4), "{all:?}");
    let lo = interfaces(&cfg(&[("COURIER_NET_DEVICES", "lo")]));
    assert!(
        !lo.is_empty() && lo.iter().all(|(n, _)| n == "lo"),
        "{lo:?}"
    );
    assert!(interfaces(&cfg(&[("COURIER_NET_DEVICES", "nosuchdev0")])).is_empty());
}

#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn connect_to_closed_port_is_unreachable() {
    let addr = {
        let l = Listener::bind(SocketAddr::new(LO4, 0), &cfg(&[])).unwrap();
        l.local_addr()
    };
    let e = connect(addr, &cfg(&[]))
        .err()
        .expect("nobody listens there");
    assert_eq!(e.status(), Status::Unreachable, "{e}");
    assert!(
        e.detail().starts_with(&format!("connect to {addr}: ")),
        "{e}"
    );
}

#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn listener_reports_nothing_pending() {
    let mut l = Listener::bind(SocketAddr::new(LO4, 0), &cfg(&[])).unwrap();
    assert_ne!(l.local_addr().port(), 0);
    assert!(l.accept().unwrap().is_none());
    let _ = l.fd();
}

/// The congestion control the kernel reports for a socket.
fn congestion_of(fd: BorrowedFd<'_>) -> String {
    use std::os::fd::AsRawFd;
    let mut name = [0u8; 16];
    let mut len = name.len() as libc::socklen_t;
    // SAFETY: a live socket; `name` and `len` describe a writable buffer.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_mut_ptr().cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0, "TCP_CONGESTION: {}", std::io::Error::last_os_error());
    let n = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    String::from_utf8_lossy(&name[..n]).into_owned()
}

fn proc_sys(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn connections_within_the_host_use_reno_unless_told_otherwise() {
    // Reno is in the kernel and any process may pick it unless an administrator took it
    // out of the allowed list.
    let allowed = proc_sys("/proc/sys/net/ipv4/tcp_allowed_congestion_control");
    if !allowed.split_whitespace().any(|a| a == "reno") {
        eprintln!("reno is not allowed here ({allowed}); nothing to check");
        return;
    }
    let ((ctx, _), (atx, _)) = pair_on(LO4, &cfg(&[])).unwrap();
    assert_eq!(congestion_of(ctx.sock.as_fd()), "reno");
    assert_eq!(congestion_of(atx.sock.as_fd()), "reno");
    let system = proc_sys("/proc/sys/net/ipv4/tcp_congestion_control");
    let c = cfg(&[("COURIER_TCP_CONGESTION", "system")]);
    let ((ctx, _), (atx, _)) = pair_on(LO4, &c).unwrap();
    assert_eq!(congestion_of(ctx.sock.as_fd()), system);
    assert_eq!(congestion_of(atx.sock.as_fd()), system);
    // A name the kernel does not know costs nothing but the choice.
    let c = cfg(&[("COURIER_TCP_CONGESTION", "nosuchcc")]);
    let ((mut ctx, _), (_, mut arx)) = pair_on(LO4, &c).unwrap();
    assert_eq!(congestion_of(ctx.sock.as_fd()), system);
    let frames = vec![pattern(1, 100)];
    check(&frames, &exchange(&mut ctx, &mut arx, &frames));
}

#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn same_host_means_loopback_or_one_address_at_both_ends() {
    let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
    assert!(sock::same_host(sa("127.0.0.1:1"), None));
    assert!(sock::same_host(sa("127.3.2.1:1"), Some(sa("127.0.0.1:2"))));
    assert!(sock::same_host(sa("[::1]:1"), None));
    assert!(sock::same_host(sa("[::ffff:127.0.0.1]:1"), None));
    assert!(sock::same_host(sa("192.0.2.2:1"), Some(sa("192.0.2.2:2"))));
    assert!(sock::same_host(
        sa("[::ffff:192.0.2.2]:1"),
        Some(sa("192.0.2.2:2"))
    ));
    assert!(!sock::same_host(sa("192.0.2.3:1"), Some(sa("192.0.2.2:2"))));
    assert!(!sock::same_host(sa("192.0.2.3:1"), None));
}

#[test]
#[cfg_attr(
    miri,
    ignore = "sockets and epoll on them: system calls Miri does not model"
)]
fn maybe_ready_says_whether_anything_waits_in_the_buffer() {
    let ((mut tx, crx), (atx, mut rx)) = pair_for_tests();
    rx.poll_read().unwrap();
    // The preamble alone may have arrived: it is taken by the next peek.
    assert!(rx.peek().unwrap().is_none());
    assert!(
        !rx.maybe_ready(),
        "nothing buffered: progress may skip the link"
    );
    tx.send(&[b"ping"]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !rx.maybe_ready() {
        assert!(Instant::now() < deadline, "the frame did not arrive");
        wait_readable(rx.fd().unwrap(), 5);
        rx.poll_read().unwrap();
    }
    let f = rx.peek().unwrap().expect("a complete frame");
    // SAFETY: between peek and consume on a live link.
    assert_eq!(unsafe { f.bytes() }, b"ping");
    assert!(rx.maybe_ready(), "a frame handed out is still waiting");
    rx.consume();
    assert!(!rx.maybe_ready(), "everything buffered was consumed");
    // A close must be reported, so it counts as something waiting.
    drop((tx, crx));
    let deadline = Instant::now() + Duration::from_secs(5);
    let err = loop {
        assert!(Instant::now() < deadline, "the close was not seen");
        wait_readable(rx.fd().unwrap(), 5);
        if let Err(e) = rx.poll_read() {
            break e;
        }
    };
    assert_eq!(err.status(), Status::PeerFailure);
    assert!(rx.maybe_ready());
    drop(atx);
}
