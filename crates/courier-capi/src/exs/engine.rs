//! Progress and the completion thread.
//!
//! One thread at a time progresses (a try-lock): Courier's worker (whose callbacks deliver
//! EXS messages and completions), the signal words of connections with advertisements out,
//! and the kernel sockets with operations queued.
//!
//! Completions are found one of two ways (`exs_fcntl(EXS_F_BUSY_POLL)`, and per queue
//! `EXS_QATTR_WAIT`):
//! - wait-for-notify: the completion thread sleeps on the worker's event fd, the kernel
//!   sockets' epoll and a wake-up eventfd, progresses when woken and queues the events; a
//!   thread in `exs_qdequeue` sleeps on the queue until they come;
//! - busy-polling: the thread in `exs_qdequeue` progresses itself, spinning. While any
//!   thread busy-polls (and for 2 ms after), the completion thread naps instead of sleeping
//!   on the worker (which would wake it, to find nothing, at every message), so the two
//!   never compete for the CPU. It still runs then every 1 ms, for the connections nobody
//!   waits on.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use courier_core::Worker;

use super::conn::ConnRef;
use super::sock::State;
use super::{Lib, XResult, fail};

pub(crate) struct Engine {
    progressing: AtomicBool,
    /// Threads busy-polling now.
    pollers: AtomicU32,
    /// When the last busy-poller left (ns since `epoch`).
    last_poll: AtomicU64,
    epoch: Instant,
    /// The completion thread sleeps on `ct_epoll` (a busy-poller must wake it to nap).
    ct_sleeping: AtomicBool,
    wake: OwnedFd,
    ct_epoll: OwnedFd,
    pub kepoll: OwnedFd,
    /// Kernel sockets with operations queued.
    pub kactive: AtomicUsize,
    /// Connections with advertisements out (`State::watch` non-empty).
    pub busy_poll: AtomicBool,
    /// Connections in `State::deferred`.
    deferred: AtomicUsize,
    /// CPU of the completion thread (-1: any).
    pub cpu: AtomicI32,
    ct_tid: AtomicI32,
}

/// How long after the last busy-poller the completion thread goes back to sleeping on the
/// worker.
const POLL_LINGER: Duration = Duration::from_millis(2);
/// Its nap while a thread busy-polls.
const NAP: Duration = Duration::from_millis(1);
/// Its longest sleep (keepalives, close deadlines).
const SLEEP_MAX_MS: i32 = 100;

fn new_fd(raw: i32, what: &str) -> XResult<OwnedFd> {
    if raw < 0 {
        let e = std::io::Error::last_os_error();
        return Err(fail(
            e.raw_os_error().unwrap_or(libc::EIO),
            format!("{what}: {e}"),
        ));
    }
    // SAFETY: a descriptor we just opened and own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

fn epoll_add(ep: RawFd, fd: RawFd, tag: u64) -> XResult<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: tag,
    };
    // SAFETY: our epoll, a descriptor we hold, an event on the stack.
    if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(fail(
            e.raw_os_error().unwrap_or(libc::EIO),
            format!("epoll_ctl: {e}"),
        ));
    }
    Ok(())
}

impl Engine {
    pub fn new(worker: &Worker) -> XResult<Engine> {
        // SAFETY: plain system calls; results checked by `new_fd`.
        let wake = new_fd(
            unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) },
            "eventfd",
        )?;
        // SAFETY: as above.
        let ct_epoll = new_fd(
            unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) },
            "epoll_create1",
        )?;
        // SAFETY: as above.
        let kepoll = new_fd(
            unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) },
            "epoll_create1",
        )?;
        epoll_add(ct_epoll.as_raw_fd(), worker.event_fd(), 1)?;
        epoll_add(ct_epoll.as_raw_fd(), wake.as_raw_fd(), 2)?;
        epoll_add(ct_epoll.as_raw_fd(), kepoll.as_raw_fd(), 3)?;
        Ok(Engine {
            progressing: AtomicBool::new(false),
            pollers: AtomicU32::new(0),
            last_poll: AtomicU64::new(0),
            epoch: Instant::now(),
            ct_sleeping: AtomicBool::new(false),
            wake,
            ct_epoll,
            kepoll,
            kactive: AtomicUsize::new(0),
            deferred: AtomicUsize::new(0),
            busy_poll: AtomicBool::new(false),
            cpu: AtomicI32::new(-1),
            ct_tid: AtomicI32::new(0),
        })
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// A thread starts busy-polling: the completion thread must not sleep on the worker.
    pub fn poll_enter(&self) {
        self.pollers.fetch_add(1, Ordering::SeqCst);
        if self.ct_sleeping.load(Ordering::SeqCst) {
            self.kick();
        }
    }

    pub fn poll_leave(&self) {
        self.last_poll.store(self.now_ns(), Ordering::Relaxed);
        self.pollers.fetch_sub(1, Ordering::SeqCst);
    }

    /// After a call that issued Courier operations from the program's thread: wake the
    /// completion thread if it sleeps, so that it progresses (tcp coalesces small sends
    /// until the worker progresses) and arms again.
    pub fn kick_if_sleeping(&self) {
        if self.ct_sleeping.load(Ordering::SeqCst) {
            self.kick();
        }
    }

    /// Wake the completion thread.
    pub fn kick(&self) {
        let one: u64 = 1;
        // SAFETY: 8 bytes from a local into our eventfd.
        unsafe {
            libc::write(
                self.wake.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            );
        }
    }

    fn polled_lately(&self) -> bool {
        self.pollers.load(Ordering::SeqCst) > 0
            || self
                .now_ns()
                .saturating_sub(self.last_poll.load(Ordering::Relaxed))
                < POLL_LINGER.as_nanos() as u64
    }

    /// Pin the completion thread (`None`: let it run anywhere).
    pub fn pin(&self, cpu: Option<usize>) -> XResult<()> {
        self.cpu
            .store(cpu.map_or(-1, |c| c as i32), Ordering::Relaxed);
        let tid = self.ct_tid.load(Ordering::Relaxed);
        if tid > 0 {
            set_affinity(tid, cpu)?;
        }
        Ok(())
    }
}

fn set_affinity(tid: i32, cpu: Option<usize>) -> XResult<()> {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET stays within it (checked).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    match cpu {
        // SAFETY: `c` is below CPU_SETSIZE (checked), inside the set.
        Some(c) if c < libc::CPU_SETSIZE as usize => unsafe { libc::CPU_SET(c, &mut set) },
        Some(c) => return Err(fail(libc::EINVAL, format!("CPU {c} out of range"))),
        None => {
            for c in 0..libc::CPU_SETSIZE as usize {
                // SAFETY: as above.
                unsafe { libc::CPU_SET(c, &mut set) };
            }
        }
    }
    // SAFETY: the set on the stack, its size.
    let r = unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        return Err(fail(
            e.raw_os_error().unwrap_or(libc::EINVAL),
            format!("sched_setaffinity: {e}"),
        ));
    }
    Ok(())
}

/// One pass of progress (nothing if another thread is progressing); how much happened.
pub(crate) fn progress(l: &Lib) -> usize {
    let e = &l.engine;
    if e.progressing.swap(true, Ordering::Acquire) {
        return 0;
    }
    let mut n = l.worker.progress();
    n += poll_words(l);
    if e.kactive.load(Ordering::Relaxed) > 0 {
        n += super::ksock::poll(l);
    }
    n += close_endpoints(l);
    // A program thread that saw us progressing may have left us a connection (`defer`):
    // it looks again after saying so, we after saying we are done; one of us sees it.
    e.progressing.store(false, Ordering::SeqCst);
    if e.deferred.load(Ordering::SeqCst) > 0 {
        n += take_deferred(l);
    }
    n
}

/// Whether the protocol step of connection `r` (`recv::process`: its advertisements, what
/// arrived) was left to the thread progressing now. A program thread that posts a receive
/// would otherwise wait for the worker, which that thread holds while it reads (a large
/// payload over tcp takes a while), and then keep it waiting for the state: two wake-ups
/// per receive. The progressing thread takes it before its pass ends.
pub(crate) fn defer(st: &mut State, r: ConnRef) -> bool {
    let Some(l) = super::lib_opt() else {
        return false;
    };
    let e = &l.engine;
    if !e.progressing.load(Ordering::SeqCst) {
        return false;
    }
    if !st.deferred.contains(&r) {
        st.deferred.push(r);
    }
    e.deferred.store(st.deferred.len(), Ordering::SeqCst);
    if e.progressing.load(Ordering::SeqCst) {
        return true;
    }
    // That pass ended meanwhile, and may not have seen it: ours again.
    st.deferred.retain(|&x| x != r);
    e.deferred.store(st.deferred.len(), Ordering::SeqCst);
    false
}

/// The protocol steps left to this thread (`defer`).
fn take_deferred(l: &Lib) -> usize {
    let mut st = l.st();
    let rs = std::mem::take(&mut st.deferred);
    l.engine.deferred.store(0, Ordering::SeqCst);
    for &r in &rs {
        st.with_conn(r, super::recv::process);
    }
    rs.len()
}

/// Look at the signal words of connections with advertisements out.
fn poll_words(l: &Lib) -> usize {
    let mut st = l.st();
    if st.watch.is_empty() {
        return 0;
    }
    let watch = st.watch.clone();
    let mut n = 0;
    for r in watch {
        st.with_conn(r, |st, c| {
            let before = c.rx_progress();
            super::recv::process(st, c);
            if c.rx_progress() != before {
                n += 1;
            }
        });
    }
    n
}

/// Whether a watched connection's signal word changed since it was last looked at.
fn words_changed(l: &Lib) -> bool {
    let st = l.st();
    st.watch.iter().any(|r| {
        st.conns
            .get(r.idx as usize)
            .filter(|s| s.generation == r.generation)
            .and_then(|s| s.conn.as_ref())
            .is_some_and(|c| c.word_changed())
    })
}

/// Close endpoints whose connections ended (outside the state's lock: closing progresses).
fn close_endpoints(l: &Lib) -> usize {
    let eps = {
        let mut st = l.st();
        if st.closing_eps.is_empty() {
            return 0;
        }
        std::mem::take(&mut st.closing_eps)
    };
    let n = eps.len();
    for ep in eps {
        ep.close_force();
    }
    n
}

pub(crate) fn start_thread(l: &'static Lib) -> XResult<()> {
    std::thread::Builder::new()
        .name("exs-completion".into())
        .spawn(move || completion_thread(l))
        .map_err(|e| fail(libc::EAGAIN, format!("completion thread: {e}")))?;
    Ok(())
}

fn completion_thread(l: &'static Lib) {
    let e = &l.engine;
    // SAFETY: gettid has no arguments.
    let tid = unsafe { libc::gettid() };
    e.ct_tid.store(tid, Ordering::Relaxed);
    let cpu = e.cpu.load(Ordering::Relaxed);
    if cpu >= 0 {
        let _ = set_affinity(tid, Some(cpu as usize));
    }
    let mut last_expire = Instant::now();
    loop {
        if last_expire.elapsed() >= Duration::from_millis(SLEEP_MAX_MS as u64) {
            last_expire = Instant::now();
            super::conn::expire_closing(&mut l.st());
        }
        if e.polled_lately() {
            std::thread::sleep(NAP);
            if !e.busy_poll.load(Ordering::Relaxed) || e.pollers.load(Ordering::SeqCst) == 0 {
                progress(l);
            }
            continue;
        }
        if progress(l) > 0 {
            continue;
        }
        // Said before arming: a thread that issues an operation after this sees it and
        // kicks us (`kick_if_sleeping`); one that issued before is flushed by the arm.
        e.ct_sleeping.store(true, Ordering::SeqCst);
        match l.worker.arm() {
            Ok(true) => {}
            Ok(false) => {
                e.ct_sleeping.store(false, Ordering::SeqCst);
                continue;
            }
            Err(err) => {
                e.ct_sleeping.store(false, Ordering::SeqCst);
                tracing::warn!("EXS completion thread: arm: {err}");
                std::thread::sleep(NAP);
                continue;
            }
        }
        // Armed: a peer that writes a signal word from now on rings the worker. One it
        // wrote before (and did not ring, seeing us awake) is found by this look.
        if e.pollers.load(Ordering::SeqCst) > 0 || words_changed(l) {
            e.ct_sleeping.store(false, Ordering::SeqCst);
            continue;
        }
        // Signal words written by a same-host peer ring the worker's fd; nothing else can
        // change without waking one of these fds.
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: our epoll and an array on the stack.
        let k =
            unsafe { libc::epoll_wait(e.ct_epoll.as_raw_fd(), evs.as_mut_ptr(), 4, SLEEP_MAX_MS) };
        e.ct_sleeping.store(false, Ordering::SeqCst);
        for ev in evs.iter().take(k.max(0) as usize) {
            if ev.u64 == 2 {
                let mut v: u64 = 0;
                // SAFETY: 8 bytes into a local from our non-blocking eventfd.
                unsafe {
                    libc::read(
                        e.wake.as_raw_fd(),
                        &mut v as *mut u64 as *mut libc::c_void,
                        8,
                    );
                }
            }
        }
    }
}
