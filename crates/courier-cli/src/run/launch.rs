//! Starting the ranks and the launcher's loop: one thread, poll(2) over the signal fd,
//! stdin, and each rank's socket and output pipes; the exchange answers the sockets.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::CpuBind;
use super::exchange::{Event, Exchange};
use super::output::{Lines, Stream, write_to};
use super::sys::{self, Ended};
use crate::error::CliError;

/// mpirun's exit status when `--timeout` ends the job (ETIMEDOUT).
pub const EXIT_TIMEOUT: i32 = 110;
/// mpirun's exit status when the program cannot be started.
pub const EXIT_CANNOT_START: i32 = 132;
/// How long ranks get between SIGTERM and SIGKILL when the job is ended.
const GRACE: Duration = Duration::from_secs(3);
/// How long output is still forwarded after the last rank ended (a grandchild may hold
/// the pipe).
const DRAIN: Duration = Duration::from_secs(1);
/// A rank whose socket closed while its process lives is taken as having left after this.
const EOF_GRACE: Duration = Duration::from_millis(200);
/// Most bytes kept for rank 0's stdin before this launcher stops reading its own.
const STDIN_BUFFER: usize = 1 << 20;

/// What to start.
pub struct Plan {
    pub np: u32,
    pub env: Vec<(String, String)>,
    pub tag_output: bool,
    pub timeout: Option<Duration>,
    pub cpu_bind: CpuBind,
    pub command: Vec<String>,
}

const RULE: &str = "--------------------------------------------------------------------------";

fn boxed(text: &str) -> String {
    format!("{RULE}\n{}\n{RULE}\n", text.trim_end())
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most the buffer's length.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// The program as the ranks' exec will find it, or why it cannot be started.
fn resolve(prog: &str, env: &[(String, String)]) -> Result<std::path::PathBuf, String> {
    let executable = |p: &std::path::Path| -> Result<(), String> {
        let meta = std::fs::metadata(p).map_err(|e| format!("{e}"))?;
        if meta.is_dir() {
            return Err("it is a directory".into());
        }
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
            .map_err(|_| "its name has a NUL byte".to_string())?;
        // SAFETY: access reads a NUL-terminated path.
        if unsafe { libc::access(c.as_ptr(), libc::X_OK) } != 0 {
            return Err("it is not executable (permission denied)".into());
        }
        Ok(())
    };
    if prog.contains('/') {
        let p = std::path::PathBuf::from(prog);
        executable(&p)?;
        return Ok(p);
    }
    let path = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .or_else(|| std::env::var("PATH").ok())
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    let mut why = "not found in PATH".to_string();
    for dir in path.split(':').filter(|d| !d.is_empty()) {
        let p = std::path::Path::new(dir).join(prog);
        if p.exists() {
            match executable(&p) {
                Ok(()) => return Ok(std::path::PathBuf::from(prog)),
                Err(e) => why = format!("{}: {e}", p.display()),
            }
        }
    }
    Err(why)
}

fn cannot_start(prog: &str, why: &str, rank: u32) -> i32 {
    eprint!(
        "{}",
        boxed(&format!(
            "courier run was unable to launch the specified application as it could not access\nor execute an executable:\n\nExecutable: {prog}\nNode: {}\nWhy: {why}\n\nwhile attempting to start process rank {rank}.",
            hostname()
        ))
    );
    EXIT_CANNOT_START
}

struct Rank {
    pid: i32,
    sock: Option<OwnedFd>,
    sock_out: Vec<u8>,
    sock_eof: Option<Instant>,
    left: bool,
    out: Option<OwnedFd>,
    err: Option<OwnedFd>,
    out_lines: Lines,
    err_lines: Lines,
    ended: Option<Ended>,
}

/// Why the job is ending; the first one decides the exit status and the message.
#[derive(Debug)]
enum Failure {
    Exit {
        rank: u32,
        pid: i32,
        code: i32,
    },
    Signal {
        rank: u32,
        pid: i32,
        sig: i32,
    },
    Abort {
        rank: u32,
        pid: i32,
        code: i32,
        message: String,
    },
    Violation {
        rank: u32,
        pid: i32,
        why: String,
    },
    Timeout {
        secs: f64,
    },
    Interrupted {
        sig: i32,
    },
}

impl Failure {
    fn code(&self) -> i32 {
        match self {
            Failure::Exit { code, .. } => *code,
            Failure::Signal { sig, .. } => 128 + sig,
            // As mpirun and Hydra: the abort's code, 0 included (OpenSHMEM's
            // `shmem_global_exit(0)` ends every PE with status 0); a non-zero code whose
            // low byte is 0 still fails.
            Failure::Abort { code, .. } => match code & 0xff {
                0 if *code != 0 => 1,
                c => c,
            },
            Failure::Violation { .. } => 1,
            Failure::Timeout { .. } => EXIT_TIMEOUT,
            Failure::Interrupted { sig } => 128 + sig,
        }
    }

    fn message(&self, jobid: &str) -> String {
        match self {
            Failure::Exit { rank, pid, code } => format!(
                "{}{}",
                boxed(
                    "Primary job  terminated normally, but 1 process returned\na non-zero exit code. Per user-direction, the job has been aborted."
                ),
                boxed(&format!(
                    "courier run detected that one or more processes exited with non-zero status, thus causing\nthe job to be terminated. The first process to do so was:\n\n  Process name: [{jobid},{rank}]\n  Rank:         {rank}\n  PID:          {pid}\n  Exit code:    {code}"
                ))
            ),
            Failure::Signal { rank, pid, sig } => boxed(&format!(
                "courier run noticed that process rank {rank} with PID {pid} on node {} exited on signal {sig} ({}).",
                hostname(),
                sys::signal_name(*sig)
            )),
            Failure::Abort {
                rank,
                pid,
                code,
                message,
            } => boxed(&format!(
                "Job::abort was invoked on rank {rank} (PID {pid}) with errorcode {code}:\n  {message}\n\nNOTE: an abort makes courier run kill every rank of the job."
            )),
            Failure::Violation { rank, pid, why } => boxed(&format!(
                "courier run: process rank {rank} with PID {pid} broke the launcher protocol:\n  {why}\nThe job has been aborted."
            )),
            Failure::Timeout { secs } => boxed(&format!(
                "The user-provided time limit for job execution has been reached:\n\n  Timeout: {secs} seconds\n\nThe job will now be aborted.  Please check your code and/or\nadjust/remove the job execution time limit (as specified by --timeout)."
            )),
            Failure::Interrupted { sig } => boxed(&format!(
                "courier run received {} and forwarded it to every rank; the job has been ended.",
                sys::signal_name(*sig)
            )),
        }
    }
}

struct Launcher {
    jobid: String,
    ranks: Vec<Rank>,
    by_pid: HashMap<i32, u32>,
    ex: Exchange,
    failure: Option<Failure>,
    ending_since: Option<Instant>,
    killed: bool,
    stdin_open: bool,
    stdin_to: Option<OwnedFd>,
    stdin_buf: Vec<u8>,
    stdout_ok: bool,
    stderr_ok: bool,
    last_end: Option<Instant>,
}

/// Start the job and serve it until every rank has ended; the exit status.
pub fn run(plan: Plan) -> Result<i32, CliError> {
    sys::standard_streams();
    sys::ignore_sigpipe();
    let prog = plan.command[0].clone();
    if let Err(why) = resolve(&prog, &plan.env) {
        return Ok(cannot_start(&prog, &why, 0));
    }
    let sigfd = sys::signal_fd().map_err(|e| CliError::run(format!("run: signal fd: {e}")))?;
    let auth_key = courier::job::new_auth_key()?;
    // SAFETY: getpid has no arguments and cannot fail.
    let my_pid = unsafe { libc::getpid() };
    let jobid = format!("courier-{my_pid}");
    let cpus = sys::allowed_cpus();
    if plan.cpu_bind == CpuBind::Core && plan.np as usize > cpus.len() {
        eprintln!(
            "courier run: note: {} ranks bound to {} CPUs: some share a CPU",
            plan.np,
            cpus.len()
        );
    }
    let mut ranks = Vec::with_capacity(plan.np as usize);
    let mut by_pid = HashMap::new();
    let mut stdin_to = None;
    for r in 0..plan.np {
        match spawn(&plan, r, &cpus, my_pid) {
            Ok((rank, stdin)) => {
                by_pid.insert(rank.pid, r);
                if let Some(s) = stdin {
                    stdin_to = Some(s);
                }
                ranks.push(rank);
            }
            Err(e) => {
                for rk in &ranks {
                    sys::kill_group(rk.pid, libc::SIGKILL);
                }
                reap_all_blocking(&ranks);
                return Ok(cannot_start(&prog, &e.to_string(), r));
            }
        }
    }
    let pids = ranks.iter().map(|r| r.pid).collect();
    let mut l = Launcher {
        ex: Exchange::new(jobid.clone(), auth_key, pids),
        jobid,
        ranks,
        by_pid,
        failure: None,
        ending_since: None,
        killed: false,
        stdin_open: stdin_to.is_some(),
        stdin_to,
        stdin_buf: Vec::new(),
        stdout_ok: true,
        stderr_ok: true,
        last_end: None,
    };
    if let Some(s) = &l.stdin_to {
        let _ = sys::set_nonblocking(s.as_raw_fd());
    }
    let deadline = plan.timeout.map(|t| (Instant::now() + t, t.as_secs_f64()));
    l.serve(&sigfd, deadline);
    // Whatever a failed job's ranks left behind in their process groups goes too.
    if l.failure.is_some() {
        for r in &l.ranks {
            sys::kill_group(r.pid, libc::SIGKILL);
        }
    }
    Ok(match &l.failure {
        Some(f) => {
            eprint!("{}", f.message(&l.jobid));
            f.code()
        }
        None => 0,
    })
}

/// Wait for each of `ranks` (after SIGKILL at a failed start).
fn reap_all_blocking(ranks: &[Rank]) {
    let mut status = 0;
    for r in ranks {
        // SAFETY: waitpid on our own child, status into a local.
        unsafe {
            libc::waitpid(r.pid, &mut status, 0);
        }
    }
}

fn spawn(
    plan: &Plan,
    r: u32,
    cpus: &[usize],
    parent: i32,
) -> std::io::Result<(Rank, Option<OwnedFd>)> {
    let (mine, theirs) = sys::socket_pair()?;
    let fd = theirs.as_raw_fd();
    let mut cmd = Command::new(&plan.command[0]);
    cmd.args(&plan.command[1..]);
    for (k, v) in &plan.env {
        cmd.env(k, v);
    }
    cmd.env(courier::job::runwire::ENV_FD, fd.to_string())
        .env("PMI_FD", fd.to_string())
        .env("PMI_RANK", r.to_string())
        .env("PMI_SIZE", plan.np.to_string())
        .env("COURIER_RUN_RANK", r.to_string())
        .env("COURIER_RUN_SIZE", plan.np.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if r == 0 {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .process_group(0);
    let bind = plan
        .cpu_bind
        .binds(plan.np as usize, cpus.len())
        .then(|| cpus[r as usize % cpus.len()]);
    let mut set = std::mem::MaybeUninit::<libc::cpu_set_t>::zeroed();
    if let Some(c) = bind {
        // SAFETY: CPU_SET writes within the zeroed set we own.
        unsafe { libc::CPU_SET(c, &mut *set.as_mut_ptr()) };
    }
    // SAFETY: zeroed, then possibly one bit set: a valid cpu_set_t.
    let set = unsafe { set.assume_init() };
    let mut empty = std::mem::MaybeUninit::<libc::sigset_t>::zeroed();
    // SAFETY: sigemptyset initialises the set we own.
    unsafe { libc::sigemptyset(empty.as_mut_ptr()) };
    // SAFETY: initialised just above.
    let empty = unsafe { empty.assume_init() };
    // SAFETY: the closure runs in the child between fork and exec and makes only
    // async-signal-safe system calls (sigprocmask, fcntl, prctl, getppid,
    // sched_setaffinity); it touches
    // no lock and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            // The launcher blocks the signals it reads from its signal fd; ranks start with
            // none blocked.
            if libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The rank's end of the socket pair survives exec.
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Ends with the launcher, even if it is killed outright.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            if bind.is_some()
                && libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    drop(theirs);
    let out: OwnedFd = child
        .stdout
        .take()
        .map(OwnedFd::from)
        .ok_or_else(|| std::io::Error::other("no stdout pipe"))?;
    let err: OwnedFd = child
        .stderr
        .take()
        .map(OwnedFd::from)
        .ok_or_else(|| std::io::Error::other("no stderr pipe"))?;
    let stdin = child.stdin.take().map(OwnedFd::from);
    for f in [&mine, &out, &err] {
        sys::set_nonblocking(f.as_raw_fd())?;
    }
    let rank = Rank {
        pid: child.id() as i32,
        sock: Some(mine),
        sock_out: Vec::new(),
        sock_eof: None,
        left: false,
        out: Some(out),
        err: Some(err),
        out_lines: Lines::new(r, Stream::Out, plan.tag_output),
        err_lines: Lines::new(r, Stream::Err, plan.tag_output),
        ended: None,
    };
    Ok((rank, stdin))
}

#[derive(Clone, Copy)]
enum Source {
    Signals,
    Stdin,
    StdinTo,
    Sock(u32),
    Out(u32),
    Err(u32),
}

impl Launcher {
    fn all_ended(&self) -> bool {
        self.ranks.iter().all(|r| r.ended.is_some())
    }

    fn fail(&mut self, f: Failure) {
        if self.failure.is_none() {
            self.failure = Some(f);
        }
        self.end_job(libc::SIGTERM);
    }

    fn end_job(&mut self, sig: i32) {
        if self.ending_since.is_none() {
            self.ending_since = Some(Instant::now());
        }
        for r in &self.ranks {
            if r.ended.is_none() {
                sys::kill_group(r.pid, sig);
            }
        }
    }

    fn serve(&mut self, sigfd: &OwnedFd, deadline: Option<(Instant, f64)>) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let now = Instant::now();
            if self.all_ended() {
                let outputs_open = self
                    .ranks
                    .iter()
                    .any(|r| r.out.is_some() || r.err.is_some());
                let drained = self.last_end.is_some_and(|t| now >= t + DRAIN);
                if !outputs_open || drained {
                    self.close_outputs();
                    return;
                }
            }
            if let Some((dl, secs)) = deadline {
                if now >= dl && self.failure.is_none() {
                    self.fail(Failure::Timeout { secs });
                }
            }
            if let Some(t) = self.ending_since {
                if !self.killed && now >= t + GRACE {
                    self.killed = true;
                    self.end_job(libc::SIGKILL);
                }
            }
            self.settle_eofs(now);
            self.ex.tick(now);
            self.flush_sockets();
            self.handle_events();

            let (mut fds, srcs) = self.poll_set(sigfd);
            let mut wake: Vec<Instant> = Vec::new();
            if let Some(d) = self.ex.next_deadline() {
                wake.push(d);
            }
            if let Some((dl, _)) = deadline {
                wake.push(dl);
            }
            if let Some(t) = self.ending_since {
                if !self.killed {
                    wake.push(t + GRACE);
                }
            }
            if let Some(t) = self.last_end {
                wake.push(t + DRAIN);
            }
            for r in &self.ranks {
                if let Some(t) = r.sock_eof {
                    wake.push(t + EOF_GRACE);
                }
            }
            let timeout = wake
                .iter()
                .min()
                .map(|w| w.saturating_duration_since(now).as_millis().min(60_000) as i32 + 1)
                .unwrap_or(60_000);
            if sys::poll(&mut fds, timeout).is_err() {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            for (p, src) in fds.iter().zip(srcs) {
                if p.revents == 0 {
                    continue;
                }
                match src {
                    Source::Signals => self.on_signals(sigfd),
                    Source::Stdin => self.on_stdin(&mut buf),
                    Source::StdinTo => self.flush_stdin(),
                    Source::Sock(r) => self.on_sock(r, &mut buf, p.revents),
                    Source::Out(r) => self.on_output(r, Stream::Out, &mut buf),
                    Source::Err(r) => self.on_output(r, Stream::Err, &mut buf),
                }
            }
        }
    }

    fn poll_set(&self, sigfd: &OwnedFd) -> (Vec<libc::pollfd>, Vec<Source>) {
        let mut fds = Vec::with_capacity(self.ranks.len() * 3 + 3);
        let mut srcs = Vec::with_capacity(fds.capacity());
        let mut add = |fd: RawFd, events: i16, s: Source| {
            fds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
            srcs.push(s);
        };
        add(sigfd.as_raw_fd(), libc::POLLIN, Source::Signals);
        if self.stdin_open && self.stdin_buf.len() < STDIN_BUFFER {
            add(0, libc::POLLIN, Source::Stdin);
        }
        if let Some(s) = &self.stdin_to {
            if !self.stdin_buf.is_empty() {
                add(s.as_raw_fd(), libc::POLLOUT, Source::StdinTo);
            }
        }
        for (i, r) in self.ranks.iter().enumerate() {
            let i = i as u32;
            if let Some(s) = &r.sock {
                if r.sock_eof.is_none() {
                    let mut ev = libc::POLLIN;
                    if !r.sock_out.is_empty() {
                        ev |= libc::POLLOUT;
                    }
                    add(s.as_raw_fd(), ev, Source::Sock(i));
                }
            }
            if let Some(o) = &r.out {
                add(o.as_raw_fd(), libc::POLLIN, Source::Out(i));
            }
            if let Some(e) = &r.err {
                add(e.as_raw_fd(), libc::POLLIN, Source::Err(i));
            }
        }
        (fds, srcs)
    }

    fn on_signals(&mut self, sigfd: &OwnedFd) {
        for sig in sys::read_signals(sigfd) {
            if sig == libc::SIGCHLD {
                continue;
            }
            // Forward it; the ranks decide what it means, and the job ends when they do.
            if self.failure.is_none() {
                self.failure = Some(Failure::Interrupted { sig });
            }
            self.end_job(sig);
        }
        self.reap();
    }

    fn reap(&mut self) {
        while let Some((pid, how)) = sys::reap() {
            let Some(&r) = self.by_pid.get(&pid) else {
                continue;
            };
            let now = Instant::now();
            self.ranks[r as usize].ended = Some(how);
            self.last_end = Some(now);
            if r == 0 {
                self.stdin_open = false;
                self.stdin_to = None;
                self.stdin_buf.clear();
            }
            let why = match how {
                Ended::Exited(c) => format!("it exited with status {c}"),
                Ended::Signaled(s) => {
                    format!("it was killed by signal {s} ({})", sys::signal_name(s))
                }
            };
            self.leave(r, why, now);
            if self.ending_since.is_none() {
                match how {
                    Ended::Exited(0) => {}
                    Ended::Exited(code) => self.fail(Failure::Exit { rank: r, pid, code }),
                    Ended::Signaled(sig) => self.fail(Failure::Signal { rank: r, pid, sig }),
                }
            }
        }
    }

    fn leave(&mut self, r: u32, why: String, now: Instant) {
        let rk = &mut self.ranks[r as usize];
        if !rk.left {
            rk.left = true;
            rk.sock = None;
            rk.sock_out.clear();
            self.ex.leave(r, why, now);
        }
    }

    /// A socket that closed while its process lives counts as having left after a moment
    /// (the process's exit, when it comes first, gives the better reason).
    fn settle_eofs(&mut self, now: Instant) {
        self.reap();
        for r in 0..self.ranks.len() {
            if let Some(t) = self.ranks[r].sock_eof {
                if now >= t + EOF_GRACE {
                    self.ranks[r].sock_eof = None;
                    self.leave(
                        r as u32,
                        "it closed its connection to the launcher".into(),
                        now,
                    );
                }
            }
        }
    }

    fn on_stdin(&mut self, buf: &mut [u8]) {
        // SAFETY: a blocking read of what poll said is there, into our buffer.
        let n = unsafe { libc::read(0, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
        if n <= 0 {
            self.stdin_open = false;
            if self.stdin_buf.is_empty() {
                self.stdin_to = None;
            }
            return;
        }
        self.stdin_buf.extend_from_slice(&buf[..n as usize]);
        self.flush_stdin();
    }

    fn flush_stdin(&mut self) {
        if let Some(s) = &self.stdin_to {
            match sys::write_some(s.as_raw_fd(), &self.stdin_buf) {
                Ok(n) => {
                    self.stdin_buf.drain(..n);
                }
                Err(_) => {
                    // Rank 0 closed its stdin: what it did not read is dropped.
                    self.stdin_buf.clear();
                    self.stdin_open = false;
                    self.stdin_to = None;
                    return;
                }
            }
        }
        if !self.stdin_open && self.stdin_buf.is_empty() {
            self.stdin_to = None;
        }
    }

    fn on_sock(&mut self, r: u32, buf: &mut [u8], revents: i16) {
        let Some(fd) = self.ranks[r as usize].sock.as_ref().map(|s| s.as_raw_fd()) else {
            return;
        };
        if revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
            loop {
                match sys::read_some(fd, buf) {
                    Ok(Some(0)) | Err(_) => {
                        self.ranks[r as usize].sock_eof = Some(Instant::now());
                        break;
                    }
                    Ok(Some(n)) => self.ex.input(r, &buf[..n], Instant::now()),
                    Ok(None) => break,
                }
            }
        }
        self.flush_sockets();
        self.handle_events();
    }

    fn flush_sockets(&mut self) {
        for r in 0..self.ranks.len() {
            if self.ex.has_output(r as u32) {
                let out = self.ex.take_output(r as u32);
                self.ranks[r].sock_out.extend_from_slice(&out);
            }
            let rk = &mut self.ranks[r];
            if rk.sock_out.is_empty() {
                continue;
            }
            let Some(s) = &rk.sock else {
                rk.sock_out.clear();
                continue;
            };
            match sys::write_some(s.as_raw_fd(), &rk.sock_out) {
                Ok(n) => {
                    rk.sock_out.drain(..n);
                }
                Err(_) => rk.sock_out.clear(),
            }
        }
    }

    fn handle_events(&mut self) {
        for ev in self.ex.take_events() {
            match ev {
                Event::Abort {
                    rank,
                    code,
                    message,
                } => {
                    let pid = self.ranks[rank as usize].pid;
                    self.fail(Failure::Abort {
                        rank,
                        pid,
                        code,
                        message,
                    });
                }
                Event::Violation { rank, why } => {
                    let pid = self.ranks[rank as usize].pid;
                    self.fail(Failure::Violation { rank, pid, why });
                }
            }
        }
    }

    fn on_output(&mut self, r: u32, stream: Stream, buf: &mut [u8]) {
        let rk = &mut self.ranks[r as usize];
        let (pipe, lines) = match stream {
            Stream::Out => (&mut rk.out, &mut rk.out_lines),
            Stream::Err => (&mut rk.err, &mut rk.err_lines),
        };
        let Some(fd) = pipe.as_ref().map(|p| p.as_raw_fd()) else {
            return;
        };
        let mut text = Vec::new();
        let mut closed = false;
        // A bounded amount per wake, so one chatty rank does not starve the others.
        for _ in 0..4 {
            match sys::read_some(fd, buf) {
                Ok(Some(0)) | Err(_) => {
                    closed = true;
                    break;
                }
                Ok(Some(n)) => lines.push(&buf[..n], &mut text),
                Ok(None) => break,
            }
        }
        if closed {
            lines.finish(&mut text);
            *pipe = None;
        }
        let ok = match stream {
            Stream::Out => &mut self.stdout_ok,
            Stream::Err => &mut self.stderr_ok,
        };
        if *ok {
            *ok = write_to(stream, &text);
        }
    }

    fn close_outputs(&mut self) {
        for r in 0..self.ranks.len() {
            for stream in [Stream::Out, Stream::Err] {
                let mut text = Vec::new();
                let rk = &mut self.ranks[r];
                let (pipe, lines) = match stream {
                    Stream::Out => (&mut rk.out, &mut rk.out_lines),
                    Stream::Err => (&mut rk.err, &mut rk.err_lines),
                };
                lines.finish(&mut text);
                *pipe = None;
                write_to(stream, &text);
            }
        }
    }
}
