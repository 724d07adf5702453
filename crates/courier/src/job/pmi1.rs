//! The PMI-1 wire protocol (MPICH's hydra `mpiexec`; `courier run` serves it too): lines of
//! `key=value` pairs on the socket `PMI_FD` names. Rank and size come from `PMI_RANK` and
//! `PMI_SIZE`, the node layout from the `PMI_process_mapping` key. Values are text of
//! bounded length, so Courier's binary values go through `text` (base64, chunked).

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::text::{self, MAX_LINE};
use super::{Info, Launcher, LauncherKind};
use crate::base::{Error, Result, Status};

/// A line (PMI-1) or length-framed (PMI-2) text conversation with a launcher.
pub(super) struct Conn {
    sock: UnixStream,
    buf: Vec<u8>,
    what: &'static str,
    /// Set once an answer did not come in time: the conversation is out of step.
    broken: Option<String>,
}

/// The socket `PMI_FD` names, taken once per process.
pub(super) fn take_fd(what: &'static str) -> Result<Conn> {
    let text = std::env::var("PMI_FD").unwrap_or_default();
    let fd: i32 = text.trim().parse().map_err(|_| {
        Error::msg(
            Status::InvalidParam,
            format!("{what}: PMI_FD={text:?} is not a file descriptor number"),
        )
    })?;
    if fd < 3 {
        return Err(Error::msg(
            Status::InvalidParam,
            format!("{what}: PMI_FD={fd} names a standard stream"),
        ));
    }
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: fstat fills a struct we own; a bad descriptor is an error return.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return Err(Error::msg(
            Status::InvalidParam,
            format!(
                "{what}: PMI_FD={fd} is not an open descriptor ({})",
                std::io::Error::last_os_error()
            ),
        ));
    }
    // SAFETY: fstat succeeded and filled it.
    let st = unsafe { st.assume_init() };
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(Error::msg(
            Status::InvalidParam,
            format!("{what}: PMI_FD={fd} is not a socket"),
        ));
    }
    // SAFETY: an open socket the launcher left to this process for PMI; the job takes it
    // once per process.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    super::crun::set_cloexec(fd)?;
    Ok(Conn {
        sock: UnixStream::from(owned),
        buf: Vec::new(),
        what,
        broken: None,
    })
}

impl Conn {
    pub(super) fn write(&mut self, data: &[u8]) -> Result<()> {
        if let Some(why) = &self.broken {
            return Err(Error::msg(Status::IoError, why.clone()));
        }
        self.sock
            .write_all(data)
            .map_err(|e| Error::io(&format!("{}: writing to the launcher", self.what), e))
    }

    fn fill(&mut self, deadline: Option<Instant>, doing: &str) -> Result<()> {
        if let Some(why) = &self.broken {
            return Err(Error::msg(Status::IoError, why.clone()));
        }
        let left = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    let why = format!(
                        "{}: no answer from the launcher for {doing} in time",
                        self.what
                    );
                    self.broken = Some(format!("{why}; the conversation is out of step since"));
                    return Err(Error::msg(Status::Timeout, why));
                }
                Some(left.max(Duration::from_millis(1)))
            }
            None => None,
        };
        self.sock
            .set_read_timeout(left)
            .map_err(|e| Error::io("PMI: socket timeout", e))?;
        let mut chunk = [0u8; 4096];
        match self.sock.read(&mut chunk) {
            Ok(0) => {
                let why = format!(
                    "{}: the launcher closed the PMI socket during {doing}",
                    self.what
                );
                self.broken = Some(why.clone());
                Err(Error::msg(Status::PeerFailure, why))
            }
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(())
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(Error::io(
                &format!("{}: reading from the launcher", self.what),
                e,
            )),
        }
    }

    /// The next newline-terminated line.
    pub(super) fn line(&mut self, deadline: Option<Instant>, doing: &str) -> Result<String> {
        loop {
            if let Some(p) = self.buf.iter().position(|&b| b == b'\n') {
                let l: Vec<u8> = self.buf.drain(..=p).collect();
                return String::from_utf8(l).map_err(|_| {
                    Error::msg(
                        Status::ProtocolError,
                        format!("{}: a reply that is not UTF-8", self.what),
                    )
                });
            }
            if self.buf.len() > MAX_LINE {
                return Err(Error::msg(
                    Status::ProtocolError,
                    format!("{}: a reply line longer than {MAX_LINE} bytes", self.what),
                ));
            }
            self.fill(deadline, doing)?;
        }
    }

    /// The next PMI-2 message: a 6-character decimal length, then that many bytes.
    pub(super) fn framed(&mut self, deadline: Option<Instant>, doing: &str) -> Result<String> {
        loop {
            if self.buf.len() >= 6 {
                let n: usize = std::str::from_utf8(&self.buf[..6])
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
                    .filter(|&n| n <= MAX_LINE)
                    .ok_or_else(|| {
                        Error::msg(
                            Status::ProtocolError,
                            format!(
                                "{}: a reply whose length field {:?} is not a number up to {MAX_LINE}",
                                self.what,
                                String::from_utf8_lossy(&self.buf[..6])
                            ),
                        )
                    })?;
                if self.buf.len() >= 6 + n {
                    let m: Vec<u8> = self.buf.drain(..6 + n).skip(6).collect();
                    return String::from_utf8(m).map_err(|_| {
                        Error::msg(
                            Status::ProtocolError,
                            format!("{}: a reply that is not UTF-8", self.what),
                        )
                    });
                }
            }
            self.fill(deadline, doing)?;
        }
    }
}

/// Wait for `cmd` among replies; `pairs` of the reply line.
fn expect(pairs: &[(&str, &str)], cmd: &str, what: &str) -> Result<()> {
    match text::field(pairs, "cmd") {
        Some(c) if c == cmd => {}
        other => {
            return Err(Error::msg(
                Status::ProtocolError,
                format!("{what}: expected {cmd}, the launcher answered {other:?}"),
            ));
        }
    }
    match text::field(pairs, "rc") {
        None | Some("0") => Ok(()),
        Some(rc) => Err(Error::msg(
            Status::IoError,
            format!(
                "{what}: the launcher answered {cmd} with rc={rc} ({})",
                text::field(pairs, "msg").unwrap_or("no message")
            ),
        )),
    }
}

pub(super) struct Client {
    conn: Conn,
    kvsname: String,
    key_max: usize,
    val_max: usize,
    rank: u32,
}

fn env_u32(name: &str) -> Result<u32> {
    let v = std::env::var(name).unwrap_or_default();
    v.trim().parse().map_err(|_| {
        Error::msg(
            Status::InvalidParam,
            format!("PMI-1: {name}={v:?} is not a number"),
        )
    })
}

const LONG: Duration = Duration::from_secs(120);

pub(super) fn connect() -> Result<(Client, Info)> {
    let rank = env_u32("PMI_RANK")?;
    let size = env_u32("PMI_SIZE")?;
    if size == 0 || rank >= size {
        return Err(Error::msg(
            Status::InvalidParam,
            format!("PMI-1: PMI_RANK={rank} is not a rank of PMI_SIZE={size}"),
        ));
    }
    let mut conn = take_fd("PMI-1")?;
    let dl = || Some(Instant::now() + LONG);
    conn.write(b"cmd=init pmi_version=1 pmi_subversion=1\n")?;
    let l = conn.line(dl(), "init")?;
    expect(&text::pairs(&l, ' ')?, "response_to_init", "PMI-1 init")?;
    conn.write(b"cmd=get_maxes\n")?;
    let l = conn.line(dl(), "get_maxes")?;
    let p = text::pairs(&l, ' ')?;
    expect(&p, "maxes", "PMI-1 get_maxes")?;
    let num = |k: &str, d: usize| -> usize {
        text::field(&p, k).and_then(|v| v.parse().ok()).unwrap_or(d)
    };
    let key_max = num("keylen_max", 64).clamp(32, 4096);
    let val_max = num("vallen_max", 1024).clamp(64, 1 << 20);
    conn.write(b"cmd=get_my_kvsname\n")?;
    let l = conn.line(dl(), "get_my_kvsname")?;
    let p = text::pairs(&l, ' ')?;
    expect(&p, "my_kvsname", "PMI-1 get_my_kvsname")?;
    let kvsname = text::field(&p, "kvsname")
        .filter(|k| !k.is_empty())
        .ok_or_else(|| Error::new(Status::ProtocolError, "PMI-1: my_kvsname without a kvsname"))?
        .to_string();
    let mut c = Client {
        conn,
        kvsname: kvsname.clone(),
        key_max,
        val_max,
        rank,
    };
    // Where each rank runs, if the launcher says; otherwise every rank on one host.
    let (host, local_rank, local_size) = match c.raw_get("PMI_process_mapping", dl()) {
        Ok(Some(m)) => {
            let nodes = text::process_mapping(&m, size)?;
            text::locality(&nodes, rank)
        }
        _ => (0, rank, size),
    };
    let info = Info {
        kind: LauncherKind::Pmi1,
        rank,
        size,
        local_rank,
        local_size,
        host,
        jobid: kvsname,
    };
    Ok((c, info))
}

impl Client {
    /// A store key's value; None when the launcher has no such key (yet).
    fn raw_get(&mut self, key: &str, deadline: Option<Instant>) -> Result<Option<String>> {
        let req = format!("cmd=get kvsname={} key={key}\n", self.kvsname);
        self.conn.write(req.as_bytes())?;
        let l = self.conn.line(deadline, "get")?;
        let p = text::pairs(&l, ' ')?;
        if text::field(&p, "cmd") != Some("get_result") {
            return Err(Error::msg(
                Status::ProtocolError,
                format!("PMI-1: a get answered with {:?}", l.trim()),
            ));
        }
        if text::field(&p, "rc") != Some("0") {
            return Ok(None);
        }
        Ok(Some(text::field(&p, "value").unwrap_or("").to_string()))
    }

    /// Ask until the key is there or the deadline passes (PMI-1 cannot wait for a key).
    fn get_waiting(&mut self, key: &str, deadline: Instant) -> Result<Option<String>> {
        let mut nap = Duration::from_millis(1);
        loop {
            if let Some(v) = self.raw_get(key, Some(deadline.max(Instant::now() + LONG)))? {
                return Ok(Some(v));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(nap.min(deadline.saturating_duration_since(Instant::now())));
            nap = (nap * 2).min(Duration::from_millis(50));
        }
    }
}

impl Launcher for Client {
    fn put(&mut self, key: &str, value: &[u8]) -> Result<()> {
        text::check_key(key, self.key_max)?;
        for (i, part) in text::split(value, self.val_max)?.iter().enumerate() {
            let k = text::store_key(self.rank, key, i);
            let req = format!("cmd=put kvsname={} key={k} value={part}\n", self.kvsname);
            self.conn.write(req.as_bytes())?;
            let l = self.conn.line(Some(Instant::now() + LONG), "put")?;
            expect(&text::pairs(&l, ' ')?, "put_result", "PMI-1 put")?;
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<()> {
        // PMI-1 publishes at the barrier.
        Ok(())
    }

    fn fence(&mut self, timeout: Duration) -> Result<()> {
        self.conn.write(b"cmd=barrier_in\n")?;
        let l = self
            .conn
            .line(Some(Instant::now() + timeout), "a fence")
            .map_err(|e| {
                if e.status() == Status::Timeout {
                    Error::msg(
                        Status::Timeout,
                        format!(
                            "PMI-1 fence: not every rank reached it within {timeout:?} (PMI-1 does not say which ranks are missing)"
                        ),
                    )
                } else {
                    e
                }
            })?;
        expect(&text::pairs(&l, ' ')?, "barrier_out", "PMI-1 fence")
    }

    fn get(&mut self, rank: u32, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        text::check_key(key, self.key_max)?;
        let deadline = Instant::now() + timeout;
        let k0 = text::store_key(rank, key, 0);
        let first = self.get_waiting(&k0, deadline)?.ok_or_else(|| {
            Error::msg(
                Status::Timeout,
                format!("PMI-1: rank {rank}'s key {key:?} was not there within {timeout:?} (put, then a fence, comes first)"),
            )
        })?;
        let (n, head) = text::head(&first)?;
        let mut all = head.to_string();
        for i in 1..n {
            let k = text::store_key(rank, key, i);
            let part = self.get_waiting(&k, deadline)?.ok_or_else(|| {
                Error::msg(
                    Status::ProtocolError,
                    format!("PMI-1: rank {rank}'s key {key:?} lacks its part {i} of {n}"),
                )
            })?;
            all.push_str(&part);
        }
        text::decode(&all)
    }

    fn abort(&mut self, code: i32, _message: &str) {
        let _ = self
            .conn
            .write(format!("cmd=abort exitcode={code}\n").as_bytes());
    }

    fn finalize(&mut self) {
        if self.conn.write(b"cmd=finalize\n").is_ok() {
            let _ = self
                .conn
                .line(Some(Instant::now() + Duration::from_secs(5)), "finalize");
        }
    }
}
