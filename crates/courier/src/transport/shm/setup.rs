//! Setting a link up: the connector sends the segment in a hello over an abstract unix
//! socket; the acceptor checks and maps it, probes CMA, and replies; the connector probes
//! CMA too and confirms. Neither side blocks on the other.

use super::*;

// ---------------------------------------------------------------------------------------
// Connector
// ---------------------------------------------------------------------------------------

pub(super) fn unix_socket(flags: SocketFlags) -> Result<OwnedFd> {
    rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | flags,
        None,
    )
    .map_err(|e| Error::io("shm: creating a unix socket", e))
}

fn name_text(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

fn send_all(sock: &OwnedFd, buf: &[u8], what: &str) -> Result<()> {
    let mut sent = 0;
    while sent < buf.len() {
        match rustix::net::send(sock, &buf[sent..], SendFlags::NOSIGNAL) {
            Ok(n) => sent += n,
            Err(Errno::INTR) => {}
            Err(e) => {
                return Err(Error::msg(
                    Status::Unreachable,
                    format!("shm: sending the {what}: {e}"),
                ));
            }
        }
    }
    Ok(())
}

/// Why the process at the other end of `sock` may not use shared memory with this one:
/// only processes of the same user may (the kernel's `SO_PEERCRED`, which the peer cannot
/// forge; an abstract socket name is reachable by every user of the host).
fn foreign_user(sock: &OwnedFd) -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    match rustix::net::sockopt::socket_peercred(sock) {
        Ok(c) if c.uid.as_raw() == me => None,
        Ok(c) => Some(format!(
            "pid {} runs as uid {}, not as this process's user (uid {me}): shared memory is only for processes of the same user",
            c.pid.as_raw_nonzero().get(),
            c.uid.as_raw()
        )),
        Err(e) => Some(format!("cannot tell the peer's user (SO_PEERCRED: {e})")),
    }
}

fn peer_pid(sock: &OwnedFd) -> u32 {
    rustix::net::sockopt::socket_peercred(sock)
        .map(|c| c.pid.as_raw_nonzero().get() as u32)
        .unwrap_or(0)
}

/// The connecting side of a setup under way. The hello (with the segment) is sent;
/// `poll` reads the acceptor's reply without blocking and `finish` completes the setup.
/// Nothing here waits for the acceptor: its worker may be progressed by the very thread
/// that connects (two workers of one event loop), which waiting would starve.
pub struct Connecting {
    sock: OwnedFd,
    map: Mapping,
    n: usize,
    shown: String,
    acc_pid: u32,
    cma: CmaPolicy,
    wakeup: bool,
    reply: [u8; REPLY_LEN],
    got: usize,
    since: Instant,
}

/// Start connecting to the acceptor named `name` (abstract namespace, without the leading
/// NUL): connect and send the hello. Does not wait for the acceptor.
pub fn connect_start(name: &[u8], cfg: &Config) -> Result<Connecting> {
    let shown = name_text(name);
    let (memfd, map) = segment::create(cfg.shm_fifo_size)?;
    let n = cfg.shm_fifo_size;
    let sock = unix_socket(SocketFlags::empty())?;
    for t in [
        rustix::net::sockopt::Timeout::Recv,
        rustix::net::sockopt::Timeout::Send,
    ] {
        rustix::net::sockopt::set_socket_timeout(&sock, t, Some(SETUP_TIMEOUT))
            .map_err(|e| Error::io("shm: setting socket timeouts", e))?;
    }
    let addr = SocketAddrUnix::new_abstract_name(name).map_err(|_| {
        Error::msg(
            Status::InvalidAddress,
            format!("shm: acceptor name {shown:?} is too long"),
        )
    })?;
    loop {
        match rustix::net::connect(&sock, &addr) {
            Ok(()) => break,
            Err(Errno::INTR) => continue,
            Err(e @ (Errno::CONNREFUSED | Errno::NOENT)) => {
                return Err(Error::msg(
                    Status::Unreachable,
                    format!(
                        "shm: no acceptor named {shown:?} on this host ({e}); the peer process is gone or on another host"
                    ),
                ));
            }
            Err(Errno::AGAIN) => {
                return Err(Error::msg(
                    Status::Unreachable,
                    format!("shm: acceptor {shown:?} is not accepting (backlog full)"),
                ));
            }
            Err(e) => {
                return Err(Error::msg(
                    Status::Unreachable,
                    format!("shm: connecting to {shown:?}: {e}"),
                ));
            }
        }
    }
    if let Some(why) = foreign_user(&sock) {
        return Err(Error::msg(
            Status::AccessDenied,
            format!("shm: acceptor {shown:?}: {why}"),
        ));
    }
    let acc_pid = peer_pid(&sock);

    // Hello with the memfd.
    let hello = Hello {
        version: segment::VERSION,
        policy: policy_bits(cfg.shm_cma),
        ncells: n as u32,
        cell: segment::CELL as u32,
        size: map.len() as u64,
    }
    .emit();
    {
        let fds = [memfd.as_fd()];
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut anc = SendAncillaryBuffer::new(&mut space);
        if !anc.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(Error::new(
                Status::IoError,
                "shm: ancillary buffer too small for one fd",
            ));
        }
        let sent = loop {
            match rustix::net::sendmsg(
                &sock,
                &[IoSlice::new(&hello)],
                &mut anc,
                SendFlags::NOSIGNAL,
            ) {
                Err(Errno::INTR) => continue,
                r => break r,
            }
        }
        .map_err(|e| {
            Error::msg(
                Status::Unreachable,
                format!("shm: sending the segment to {shown:?}: {e}"),
            )
        })?;
        if sent < HELLO_LEN {
            send_all(&sock, &hello[sent..], "hello")?;
        }
    }
    drop(memfd);
    rustix::io::ioctl_fionbio(&sock, true)
        .map_err(|e| Error::io("shm: making the socket non-blocking", e))?;
    Ok(Connecting {
        sock,
        map,
        n,
        shown,
        acc_pid,
        cma: cfg.shm_cma,
        wakeup: cfg.wakeup,
        reply: [0u8; REPLY_LEN],
        got: 0,
        since: Instant::now(),
    })
}

/// Connect to the acceptor named `name` and finish the setup, blocking until it answers
/// (at most `SETUP_TIMEOUT`): for a caller whose acceptor runs on another thread.
#[cfg(test)]
pub fn connect(name: &[u8], cfg: &Config) -> Result<(Tx, Rx)> {
    let mut c = connect_start(name, cfg)?;
    while !c.poll()? {
        std::thread::sleep(Duration::from_micros(50));
    }
    c.finish()
}

impl Connecting {
    /// Read what has arrived of the acceptor's reply. `Ok(true)`: all of it (`finish`
    /// next); `Ok(false)`: not yet. An error if the acceptor closed, or has not answered
    /// within `SETUP_TIMEOUT`.
    pub fn poll(&mut self) -> Result<bool> {
        while self.got < REPLY_LEN {
            match rustix::net::recv(&self.sock, &mut self.reply[self.got..], RecvFlags::DONTWAIT) {
                Ok((_, 0)) => {
                    return Err(Error::msg(
                        Status::Rejected,
                        format!(
                            "shm: {:?} closed the connection during setup (setup reply); see its log",
                            self.shown
                        ),
                    ));
                }
                Ok((_, k)) => self.got += k,
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) if self.since.elapsed() <= SETUP_TIMEOUT => return Ok(false),
                Err(Errno::AGAIN) => {
                    return Err(Error::msg(
                        Status::Timeout,
                        format!(
                            "shm: no setup reply from {:?} within {SETUP_TIMEOUT:?} (is its worker progressed?)",
                            self.shown
                        ),
                    ));
                }
                Err(e) => {
                    return Err(Error::msg(
                        Status::Unreachable,
                        format!("shm: reading the setup reply: {e}"),
                    ));
                }
            }
        }
        Ok(true)
    }

    /// The socket the acceptor's reply arrives on (readable when `poll` may move on).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Complete the setup once `poll` said the reply is all there: check it, decide on
    /// CMA, confirm, and build the link.
    pub fn finish(self) -> Result<(Tx, Rx)> {
        let Connecting {
            sock,
            map,
            n,
            shown,
            acc_pid,
            cma: policy,
            wakeup,
            reply,
            got,
            ..
        } = self;
        if got < REPLY_LEN {
            return Err(Error::new(
                Status::InvalidParam,
                "shm: setup finished before the reply was read",
            ));
        }
        let (rflags, rpid) = match Reply::parse(&reply) {
            Some(Reply::Ok { flags, pid }) => (flags, pid),
            Some(Reply::No { pid: rpid, reason }) => {
                let why = match reason {
                    reason::BAD_SEGMENT => {
                        "it could not use our shared segment (different Courier build?)"
                            .to_string()
                    }
                    reason::CMA_REQUIRED => {
                        "it requires CMA (COURIER_SHM_CMA=yes) and process_vm_readv on us was refused"
                            .to_string()
                    }
                    r => format!("reason code {r}"),
                };
                return Err(Error::msg(
                    Status::Rejected,
                    format!("shm: acceptor {shown:?} (pid {rpid}) rejected the connection: {why}"),
                ));
            }
            None => {
                return Err(Error::msg(
                    Status::ProtocolError,
                    format!("shm: acceptor {shown:?} sent a malformed setup reply"),
                ));
            }
        };

        // CMA decision: both policies allow it and both directions work.
        let ours = policy_bits(policy);
        let want = ours & policy::CMA_ALLOWED != 0 && rflags & policy::CMA_ALLOWED != 0;
        let mut why_not = String::new();
        let mut cma = false;
        if want {
            if rflags & policy::CMA_WORKS == 0 {
                why_not = "the peer cannot read our memory with process_vm_readv".into();
            } else {
                match probe_cma(acc_pid, &map, 1) {
                    Ok(()) => cma = true,
                    Err(e) => why_not = e,
                }
            }
        } else {
            why_not = "COURIER_SHM_CMA=no on one side".into();
        }
        let required = (ours | rflags) & policy::CMA_REQUIRED != 0;
        let abort = required && !cma;
        let cflags = if abort {
            confirm::ABORT
        } else if cma {
            confirm::CMA
        } else {
            0
        };
        let confirm = emit_confirm(cflags);
        // Our incoming FIFO is the acceptor's outgoing one: say whether we may sleep before
        // the confirmation lets it send; on our outgoing one, whether we may sleep waiting
        // for room.
        // SAFETY: the mapping holds both FIFOs of `n` cells (checked at creation).
        unsafe { FifoRef::new(map.base().add(segment::fifo_offset(n, 1)), n) }.set_sleeper(wakeup);
        // SAFETY: as above.
        unsafe { FifoRef::new(map.base().add(segment::fifo_offset(n, 0)), n) }
            .set_producer_sleeps(wakeup);
        send_all(&sock, &confirm, "setup confirmation")?;
        if abort {
            let who = if ours & policy::CMA_REQUIRED != 0 {
                "COURIER_SHM_CMA=yes here"
            } else {
                "the peer sets COURIER_SHM_CMA=yes"
            };
            return Err(Error::msg(
                Status::Unsupported,
                format!("shm: CMA is required ({who}) but unavailable: {why_not}"),
            ));
        }
        let pid = if acc_pid != 0 { acc_pid } else { rpid };
        tracing::debug!("shm: connected to {shown:?} (pid {pid}), {n} cells per FIFO, cma {cma}");
        make_link(sock, map, n, 0, pid, cma)
    }
}

// ---------------------------------------------------------------------------------------
// Acceptor
// ---------------------------------------------------------------------------------------

enum Stage {
    /// Waiting for the hello (and its memfd).
    Hello { memfd: Option<OwnedFd> },
    /// Replied; waiting for the confirmation.
    Confirm {
        map: Mapping,
        ncells: usize,
        cma_ok: bool,
    },
}

pub(super) struct Pending {
    sock: OwnedFd,
    pub(super) since: Instant,
    buf: [u8; HELLO_LEN],
    got: usize,
    stage: Stage,
    pid: u32,
}

enum Step {
    Wait,
    /// Setup finished: build the link from the segment, with or without CMA.
    Done(Mapping, usize, bool),
    /// Drop the connection; `true`: warn (misbehaving peer), `false`: debug.
    Drop(String, bool),
}

/// Accepts shm connections on an abstract unix socket.
pub struct Acceptor {
    listener: OwnedFd,
    /// Watches the listener and every connection being set up, so that `fd()` becomes
    /// readable whenever `accept` can make progress.
    epoll: OwnedFd,
    name: Vec<u8>,
    policy: CmaPolicy,
    wakeup: bool,
    pub(super) pending: Vec<Pending>,
    ready: VecDeque<(Tx, Rx)>,
}

impl Acceptor {
    /// Bind a fresh abstract unix socket named `courier-<pid>-<random hex>`.
    pub fn bind(cfg: &Config) -> Result<Acceptor> {
        let listener = unix_socket(SocketFlags::NONBLOCK)?;
        let mut tries = 0;
        let name = loop {
            let name = format!(
                "courier-{}-{:016x}",
                std::process::id(),
                crate::base::sys::random_u64()
            )
            .into_bytes();
            let addr = SocketAddrUnix::new_abstract_name(&name)
                .map_err(|e| Error::io("shm: abstract name", e))?;
            match rustix::net::bind(&listener, &addr) {
                Ok(()) => break name,
                Err(Errno::ADDRINUSE) if tries < 8 => tries += 1,
                Err(e) => return Err(Error::io("shm: binding an abstract unix socket", e)),
            }
        };
        rustix::net::listen(&listener, 128).map_err(|e| Error::io("shm: listen", e))?;
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)
            .map_err(|e| Error::io("shm: epoll_create", e))?;
        epoll::add(
            &ep,
            &listener,
            epoll::EventData::new_u64(u64::MAX),
            epoll::EventFlags::IN,
        )
        .map_err(|e| Error::io("shm: epoll_ctl", e))?;
        Ok(Acceptor {
            listener,
            epoll: ep,
            name,
            policy: cfg.shm_cma,
            wakeup: cfg.wakeup,
            pending: Vec::new(),
            ready: VecDeque::new(),
        })
    }

    /// Whether connections are in the middle of their setup (a hello answered, its
    /// confirmation not read yet).
    pub fn setting_up(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Socket name (abstract namespace, without the leading NUL).
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// Fd to watch for readability. It is an epoll fd that covers the listening socket and
    /// the connections still being set up; when it is readable, call [`accept`](Self::accept)
    /// until it returns `None`.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.epoll.as_fd()
    }

    /// Drop the connection being set up at `i` if its setup has taken longer than
    /// `SETUP_TIMEOUT` (with a warning); whether it did.
    fn drop_if_late(&mut self, i: usize) -> bool {
        if self.pending[i].since.elapsed() <= SETUP_TIMEOUT {
            return false;
        }
        let p = self.remove(i);
        tracing::warn!(
            "shm: dropping connection from pid {}: setup not finished within {SETUP_TIMEOUT:?}",
            p.pid
        );
        true
    }

    /// Drop connections whose setup has taken too long. `accept` does it too, but only runs
    /// when the acceptor is readable, which a peer that says nothing never makes it.
    pub fn expire(&mut self) {
        let mut i = 0;
        while i < self.pending.len() {
            if !self.drop_if_late(i) {
                i += 1;
            }
        }
    }

    /// Return a connection that is fully set up, if any; never blocks. Misbehaving peers are
    /// dropped with a warning; `Err` only if the listening socket itself failed.
    pub fn accept(&mut self) -> Result<Option<(Tx, Rx)>> {
        loop {
            match rustix::net::accept_with(
                &self.listener,
                SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            ) {
                Ok(s) => self.add_pending(s),
                Err(Errno::AGAIN) => break,
                Err(Errno::INTR | Errno::CONNABORTED | Errno::PROTO) => {}
                Err(e @ (Errno::MFILE | Errno::NFILE | Errno::NOBUFS | Errno::NOMEM)) => {
                    tracing::warn!(
                        "shm: cannot accept a connection on {:?} now: {e}",
                        name_text(&self.name)
                    );
                    break;
                }
                Err(e) => {
                    return Err(Error::io(
                        &format!("shm: accept on {:?}", name_text(&self.name)),
                        e,
                    ));
                }
            }
        }
        let mut i = 0;
        while i < self.pending.len() {
            let step = self.step(i);
            match step {
                Step::Wait => {
                    if !self.drop_if_late(i) {
                        i += 1;
                    }
                }
                Step::Done(map, n, cma) => {
                    let p = self.remove(i);
                    let pid = p.pid;
                    match make_link(p.sock, map, n, 1, pid, cma) {
                        Ok(link) => {
                            tracing::debug!("shm: accepted connection from pid {pid}, cma {cma}");
                            self.ready.push_back(link);
                        }
                        Err(e) => tracing::warn!("shm: dropping connection from pid {pid}: {e}"),
                    }
                }
                Step::Drop(why, warn) => {
                    let p = self.remove(i);
                    if warn {
                        tracing::warn!("shm: dropping connection from pid {}: {why}", p.pid);
                    } else {
                        tracing::debug!("shm: connection from pid {} abandoned: {why}", p.pid);
                    }
                }
            }
        }
        Ok(self.ready.pop_front())
    }

    fn add_pending(&mut self, sock: OwnedFd) {
        if self.pending.len() >= MAX_PENDING {
            let p = self.remove(0);
            tracing::warn!(
                "shm: too many connections being set up; dropping the oldest (pid {})",
                p.pid
            );
        }
        if let Some(why) = foreign_user(&sock) {
            tracing::warn!(
                "shm: refusing a connection on {:?}: {why}",
                name_text(&self.name)
            );
            return;
        }
        let pid = peer_pid(&sock);
        let flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
        if let Err(e) = epoll::add(&self.epoll, &sock, epoll::EventData::new_u64(0), flags) {
            tracing::warn!("shm: dropping connection from pid {pid}: epoll_ctl: {e}");
            return;
        }
        self.pending.push(Pending {
            sock,
            since: Instant::now(),
            buf: [0; HELLO_LEN],
            got: 0,
            stage: Stage::Hello { memfd: None },
            pid,
        });
    }

    fn remove(&mut self, i: usize) -> Pending {
        let p = self.pending.swap_remove(i);
        let _ = epoll::delete(&self.epoll, &p.sock);
        p
    }
}

/// Tell a connecting peer why it is refused (best effort).
fn reject(p: &Pending, code: u32) {
    let r = Reply::No {
        pid: std::process::id(),
        reason: code,
    }
    .emit();
    let _ = rustix::net::send(&p.sock, &r, SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
}

impl Acceptor {
    /// Make progress on pending connection `i`.
    fn step(&mut self, i: usize) -> Step {
        let policy = self.policy;
        let wakeup = self.wakeup;
        let p = &mut self.pending[i];
        let want = match p.stage {
            Stage::Hello { .. } => HELLO_LEN,
            Stage::Confirm { .. } => CONFIRM_LEN,
        };
        // Read what is there of the current message.
        while p.got < want {
            let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(2))];
            let mut anc = RecvAncillaryBuffer::new(&mut space);
            let mut iov = [IoSliceMut::new(&mut p.buf[p.got..want])];
            match rustix::net::recvmsg(
                &p.sock,
                &mut iov,
                &mut anc,
                RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
            ) {
                Ok(r) if r.bytes == 0 => {
                    return Step::Drop("peer closed the connection during setup".into(), true);
                }
                Ok(r) => {
                    p.got += r.bytes;
                    for msg in anc.drain() {
                        if let RecvAncillaryMessage::ScmRights(fds) = msg {
                            for fd in fds {
                                match &mut p.stage {
                                    Stage::Hello { memfd: slot @ None } => *slot = Some(fd),
                                    _ => {
                                        return Step::Drop(
                                            "peer passed unexpected file descriptors".into(),
                                            true,
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
                Err(Errno::AGAIN) => return Step::Wait,
                Err(Errno::INTR) => {}
                Err(e) => return Step::Drop(format!("reading setup message: {e}"), true),
            }
        }
        let stage = std::mem::replace(&mut p.stage, Stage::Hello { memfd: None });
        p.got = 0;
        match stage {
            Stage::Hello { memfd } => {
                let Some(memfd) = memfd else {
                    return Step::Drop("hello carried no shared segment fd".into(), true);
                };
                let Some(h) = Hello::parse(&p.buf) else {
                    return Step::Drop("not a Courier shm hello (bad magic)".into(), true);
                };
                let (version, cflags, size) = (h.version, h.policy, h.size);
                let (ncells, cell) = (h.ncells as usize, h.cell as usize);
                if version != segment::VERSION || cell != segment::CELL {
                    reject(p, reason::BAD_SEGMENT);
                    return Step::Drop(
                        format!(
                            "peer speaks layout version {version} with {cell}-byte cells; we speak {} with {}",
                            segment::VERSION,
                            segment::CELL
                        ),
                        true,
                    );
                }
                let map = match usize::try_from(size)
                    .map_err(|_| "segment size overflows".to_string())
                    .and_then(|s| segment::open(&memfd, ncells, s))
                {
                    Ok(m) => m,
                    Err(why) => {
                        reject(p, reason::BAD_SEGMENT);
                        return Step::Drop(format!("bad shared segment: {why}"), true);
                    }
                };
                drop(memfd);
                let h = map.header();
                h.pid[1].store(std::process::id(), Relaxed);
                h.map_base[1].store(map.base() as u64, Relaxed);
                let ours = policy_bits(policy);
                let mut rflags = ours;
                let mut cma_ok = false;
                if ours & policy::CMA_ALLOWED != 0 && cflags & policy::CMA_ALLOWED != 0 {
                    match probe_cma(p.pid, &map, 0) {
                        Ok(()) => {
                            cma_ok = true;
                            rflags |= policy::CMA_WORKS;
                        }
                        Err(why) if ours & policy::CMA_REQUIRED != 0 => {
                            reject(p, reason::CMA_REQUIRED);
                            return Step::Drop(
                                format!(
                                    "CMA required (COURIER_SHM_CMA=yes) but unavailable: {why}"
                                ),
                                true,
                            );
                        }
                        Err(_) => {}
                    }
                }
                // Our incoming FIFO: say whether we may sleep before the reply lets the
                // connector send; our outgoing one: whether we may sleep waiting for room.
                // SAFETY: `segment::open` checked the mapping holds both FIFOs.
                unsafe { FifoRef::new(map.base().add(segment::fifo_offset(ncells, 0)), ncells) }
                    .set_sleeper(wakeup);
                // SAFETY: as above.
                unsafe { FifoRef::new(map.base().add(segment::fifo_offset(ncells, 1)), ncells) }
                    .set_producer_sleeps(wakeup);
                let r = Reply::Ok {
                    flags: rflags,
                    pid: std::process::id(),
                }
                .emit();
                match rustix::net::send(&p.sock, &r, SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
                    Ok(REPLY_LEN) => {}
                    Ok(_) | Err(_) => {
                        return Step::Drop("could not send the setup reply".into(), true);
                    }
                }
                p.stage = Stage::Confirm {
                    map,
                    ncells,
                    cma_ok,
                };
                // The confirmation may already be there.
                self.step(i)
            }
            Stage::Confirm {
                map,
                ncells,
                cma_ok,
            } => {
                let mut b = [0u8; CONFIRM_LEN];
                b.copy_from_slice(&p.buf[..CONFIRM_LEN]);
                let Some(f) = parse_confirm(&b) else {
                    return Step::Drop("malformed setup confirmation".into(), true);
                };
                if f & confirm::ABORT != 0 {
                    return Step::Drop(
                        "the connecting side gave up (CMA required but unavailable)".into(),
                        false,
                    );
                }
                let cma = f & confirm::CMA != 0;
                if cma && !cma_ok {
                    return Step::Drop(
                        "peer claims CMA works although our probe failed".into(),
                        true,
                    );
                }
                if policy == CmaPolicy::Yes && !cma {
                    return Step::Drop(
                        "CMA required (COURIER_SHM_CMA=yes) but the peer cannot use it".into(),
                        true,
                    );
                }
                Step::Done(map, ncells, cma)
            }
        }
    }
}

/// Whether shared memory can work in this process: memfd, shared mappings and abstract
/// unix sockets. `Err` says what is missing (for `courier info`).
pub fn probe(cfg: &Config) -> std::result::Result<(), String> {
    let (_fd, map) = segment::create(cfg.shm_fifo_size).map_err(|e| e.to_string())?;
    drop(map);
    let a = Acceptor::bind(cfg).map_err(|e| e.to_string())?;
    drop(a);
    Ok(())
}

/// A sentence on whether CMA (`process_vm_readv`) is likely to work between processes here,
/// from the Yama ptrace policy (for `courier info`; the real decision is a per-link probe).
pub fn cma_status() -> String {
    match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .map(|s| s.trim().to_string())
    {
        Ok(s) if s == "0" => "likely (Yama ptrace_scope 0)".into(),
        Ok(s) if s == "1" => {
            "only towards descendant processes (Yama ptrace_scope 1); probed per link".into()
        }
        Ok(s) => format!("unlikely (Yama ptrace_scope {s}); probed per link"),
        Err(_) => "no Yama policy; probed per link".into(),
    }
}
