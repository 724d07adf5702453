//! The few system calls `courier run` needs beyond std, each wrapped once: a signal fd,
//! waitpid, kill, poll, non-blocking descriptors, CPU affinity.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Signals the launcher takes through its signal fd (blocked for normal delivery).
pub const HANDLED: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGCHLD];

fn sigset(sigs: &[i32]) -> libc::sigset_t {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::zeroed();
    // SAFETY: sigemptyset/sigaddset initialise and fill the set we own.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        for &s in sigs {
            libc::sigaddset(set.as_mut_ptr(), s);
        }
        set.assume_init()
    }
}

/// Block `HANDLED` and make a signal fd for them. Children started after this get an empty
/// mask again (std resets it in the child).
pub fn signal_fd() -> io::Result<OwnedFd> {
    let set = sigset(&HANDLED);
    // SAFETY: a valid set; the old mask is not wanted. Called before any thread starts.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    // SAFETY: a valid set; -1 asks for a new descriptor.
    let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Signals waiting on the signal fd.
pub fn read_signals(fd: &OwnedFd) -> Vec<i32> {
    let mut out = Vec::new();
    loop {
        let mut info = std::mem::MaybeUninit::<libc::signalfd_siginfo>::zeroed();
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: reads one siginfo record into a buffer of its size.
        let n = unsafe { libc::read(fd.as_raw_fd(), info.as_mut_ptr() as *mut libc::c_void, size) };
        if n as usize != size {
            return out;
        }
        // SAFETY: the kernel filled the whole record.
        out.push(unsafe { info.assume_init() }.ssi_signo as i32);
    }
}

/// How a child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// exit(status).
    Exited(i32),
    /// Killed by a signal.
    Signaled(i32),
}

/// A child that has ended, if any (never blocks).
pub fn reap() -> Option<(i32, Ended)> {
    let mut status = 0;
    // SAFETY: waitpid writes the status we own; WNOHANG never blocks.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    if pid <= 0 {
        return None;
    }
    let how = if libc::WIFEXITED(status) {
        Ended::Exited(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        Ended::Signaled(libc::WTERMSIG(status))
    } else {
        return None;
    };
    Some((pid, how))
}

/// Send `sig` to the process group `pgid` (each rank leads its own).
pub fn kill_group(pgid: i32, sig: i32) {
    if pgid > 0 {
        // SAFETY: kill has no memory arguments; a group that is gone is ESRCH.
        unsafe {
            libc::kill(-pgid, sig);
        }
    }
}

/// A signal's name, as strsignal says it.
pub fn signal_name(sig: i32) -> String {
    // SAFETY: strsignal returns a pointer to a string valid until the next call; copied at
    // once, on the launcher's one thread.
    let p = unsafe { libc::strsignal(sig) };
    if p.is_null() {
        return format!("signal {sig}");
    }
    // SAFETY: non-null, NUL-terminated.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// Make `fd` non-blocking.
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own; no memory passed.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl < 0 || libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Read what is there (non-blocking): Ok(None) = nothing now, Ok(Some(0)) = end.
pub fn read_some(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: reads into a buffer we own, of its length.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
    if n >= 0 {
        return Ok(Some(n as usize));
    }
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
        _ => Err(e),
    }
}

/// Write what fits (non-blocking): how many bytes went.
pub fn write_some(fd: RawFd, data: &[u8]) -> io::Result<usize> {
    // SAFETY: writes from a buffer we own, of its length. SIGPIPE is ignored by the launcher,
    // so a closed reader is EPIPE.
    let n = unsafe { libc::write(fd, data.as_ptr() as *const libc::c_void, data.len()) };
    if n >= 0 {
        return Ok(n as usize);
    }
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
        _ => Err(e),
    }
}

/// poll(2) over `fds`, at most `timeout_ms` (-1: no limit).
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: an array of pollfd structs we own, with its length.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(n as usize)
}

/// A Unix stream socket pair, both ends close-on-exec.
pub fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: socketpair writes two descriptors into the array we own.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two new descriptors that we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    let mut set = std::mem::MaybeUninit::<libc::cpu_set_t>::zeroed();
    // SAFETY: sched_getaffinity fills a cpu_set_t we own, of its size.
    let rc = unsafe {
        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set.as_mut_ptr())
    };
    if rc != 0 {
        return vec![0];
    }
    // SAFETY: filled by the call above.
    let set = unsafe { set.assume_init() };
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: CPU_ISSET reads the set within its size.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Ensure descriptors 0, 1 and 2 are open (on /dev/null if not), so that no socket or pipe
/// made later lands on a standard stream's number.
pub fn standard_streams() {
    for fd in 0..3 {
        // SAFETY: F_GETFD probes a descriptor number; no memory passed.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            let flags = if fd == 0 {
                libc::O_RDONLY
            } else {
                libc::O_WRONLY
            };
            // SAFETY: opens /dev/null (a static NUL-terminated path); the lowest free
            // number is the missing stream's, and it is kept for the process's life.
            unsafe {
                libc::open(c"/dev/null".as_ptr(), flags);
            }
        }
    }
}

/// Ignore SIGPIPE, so that a write to a closed pipe or socket is an error, not death.
pub fn ignore_sigpipe() {
    // SAFETY: sets a disposition at start-up, before any thread.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}
