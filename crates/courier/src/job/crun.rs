//! The client of `courier run`'s own exchange: one Unix stream socket inherited from the
//! launcher (`COURIER_RUN_FD`), spoken as `runwire` says. Requests are answered in order,
//! one at a time; puts and commits are not answered at all.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::runwire::{self, Reply, Request, Welcome};
use super::{Info, Launcher, LauncherKind, ms};
use crate::base::{Error, Result, Status};

pub(super) struct Client {
    sock: UnixStream,
    /// Set when a reply did not come in time: the stream is out of step from then on.
    broken: Option<String>,
}

/// Take the socket `COURIER_RUN_FD` names, say hello and read the welcome.
pub(super) fn connect(fd_text: &str) -> Result<(Client, Info, [u8; 32])> {
    let fd: i32 = fd_text.trim().parse().map_err(|_| {
        Error::msg(
            Status::InvalidParam,
            format!(
                "{}={fd_text:?} is not a file descriptor number",
                runwire::ENV_FD
            ),
        )
    })?;
    if fd < 3 {
        return Err(Error::msg(
            Status::InvalidParam,
            format!(
                "{}={fd} names a standard stream, not courier run's socket",
                runwire::ENV_FD
            ),
        ));
    }
    check_socket(fd)?;
    // SAFETY: `fd` is an open Unix socket (checked above) that courier run left to this
    // process for this purpose alone, and Job::init takes it once per process (the job is a
    // process-wide singleton).
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // Children this rank starts do not inherit it (their own Job::init then finds no such
    // descriptor and says so, rather than speaking on a socket that is not the launcher's).
    set_cloexec(fd)?;
    let sock = UnixStream::from(owned);
    let mut c = Client { sock, broken: None };
    let claimed: u32 = std::env::var("PMI_RANK")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(u32::MAX);
    c.sock
        .write_all(&runwire::hello(claimed))
        .map_err(|e| Error::io("courier run: saying hello to the launcher", e))?;
    let w: Welcome = match c.read_reply(Some(Duration::from_secs(60)), "the welcome")? {
        Reply::Welcome(w) => w,
        other => {
            return Err(Error::msg(
                Status::ProtocolError,
                format!("courier run answered the hello with {other:?}, not a welcome"),
            ));
        }
    };
    let info = Info {
        kind: LauncherKind::CourierRun,
        rank: w.rank,
        size: w.size,
        local_rank: w.local_rank,
        local_size: w.local_size,
        host: w.host,
        jobid: w.jobid.clone(),
    };
    Ok((c, info, w.auth_key))
}

fn check_socket(fd: i32) -> Result<()> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: fstat writes a stat struct into the buffer we own; an invalid fd is an error
    // return, not undefined behaviour.
    let rc = unsafe { libc::fstat(fd, st.as_mut_ptr()) };
    if rc != 0 {
        return Err(Error::msg(
            Status::InvalidParam,
            format!(
                "{}={fd}: no such open file descriptor ({}); was this process started by courier run?",
                runwire::ENV_FD,
                std::io::Error::last_os_error()
            ),
        ));
    }
    // SAFETY: fstat succeeded, so it filled the struct.
    let st = unsafe { st.assume_init() };
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(Error::msg(
            Status::InvalidParam,
            format!("{}={fd} is not a socket", runwire::ENV_FD),
        ));
    }
    Ok(())
}

pub(super) fn set_cloexec(fd: i32) -> Result<()> {
    // SAFETY: fcntl on a descriptor this process owns; no memory is passed.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    if rc != 0 {
        return Err(Error::io(
            "setting close-on-exec on the launcher's socket",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

impl Client {
    fn send(&mut self, req: &Request) -> Result<()> {
        if let Some(why) = &self.broken {
            return Err(Error::msg(Status::IoError, why.clone()));
        }
        let f = req.encode()?;
        self.sock
            .write_all(&f)
            .map_err(|e| Error::io("courier run: writing to the launcher (did it exit?)", e))
    }

    /// The next reply, waiting at most `limit` (None: for ever).
    fn read_reply(&mut self, limit: Option<Duration>, what: &str) -> Result<Reply> {
        let start = Instant::now();
        let mut head = [0u8; 4];
        self.read_full(&mut head, limit, start, what)?;
        let n = runwire::frame_len(head)?;
        let mut body = vec![0u8; n];
        self.read_full(&mut body, limit, start, what)?;
        Reply::decode(&body)
    }

    fn read_full(
        &mut self,
        buf: &mut [u8],
        limit: Option<Duration>,
        start: Instant,
        what: &str,
    ) -> Result<()> {
        let mut got = 0;
        while got < buf.len() {
            let left = match limit {
                Some(l) => {
                    let left = l.saturating_sub(start.elapsed());
                    if left.is_zero() {
                        let why = format!("courier run: no answer for {what} within {:?}", l);
                        self.broken = Some(format!(
                            "{why}; the launcher connection is out of step since"
                        ));
                        return Err(Error::msg(Status::Timeout, why));
                    }
                    Some(left.max(Duration::from_millis(1)))
                }
                None => None,
            };
            self.sock
                .set_read_timeout(left)
                .map_err(|e| Error::io("courier run: socket timeout", e))?;
            match self.sock.read(&mut buf[got..]) {
                Ok(0) => {
                    let why = format!(
                        "courier run: the launcher closed its socket while this rank waited for {what}"
                    );
                    self.broken = Some(why.clone());
                    return Err(Error::msg(Status::PeerFailure, why));
                }
                Ok(n) => got += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(Error::io("courier run: reading from the launcher", e)),
            }
        }
        Ok(())
    }

    fn answer(&mut self, timeout: Duration, what: &str) -> Result<Reply> {
        // The launcher enforces the timeout and answers with the ranks it waited for; this
        // side waits a little longer so that its answer, not a bare timeout, is what we see.
        let reply = self.read_reply(Some(timeout + Duration::from_secs(5)), what)?;
        if let Reply::Fail { status, message } = reply {
            let st = Status::from_code(status).unwrap_or(Status::IoError);
            return Err(Error::msg(st, message));
        }
        Ok(reply)
    }
}

impl Launcher for Client {
    fn put(&mut self, key: &str, value: &[u8]) -> Result<()> {
        self.send(&Request::Put {
            key: key.to_string(),
            value: value.to_vec(),
        })
    }

    fn commit(&mut self) -> Result<()> {
        self.send(&Request::Commit)
    }

    fn fence(&mut self, timeout: Duration) -> Result<()> {
        self.send(&Request::Fence {
            timeout_ms: ms(timeout),
        })?;
        match self.answer(timeout, "a fence")? {
            Reply::Done => Ok(()),
            other => Err(Error::msg(
                Status::ProtocolError,
                format!("courier run answered a fence with {other:?}"),
            )),
        }
    }

    fn get(&mut self, rank: u32, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.send(&Request::Get {
            rank,
            key: key.to_string(),
            timeout_ms: ms(timeout),
        })?;
        match self.answer(timeout, "a get")? {
            Reply::Value(v) => Ok(v),
            other => Err(Error::msg(
                Status::ProtocolError,
                format!("courier run answered a get with {other:?}"),
            )),
        }
    }

    fn abort(&mut self, code: i32, message: &str) {
        let _ = self.send(&Request::Abort {
            code,
            message: message.to_string(),
        });
        // The launcher ends every rank, this one included; wait for that a while.
        let _ = self.read_reply(Some(Duration::from_secs(10)), "the abort");
    }

    fn finalize(&mut self) {
        let _ = self.send(&Request::Finalize);
        let _ = self.sock.shutdown(std::net::Shutdown::Write);
    }
}
