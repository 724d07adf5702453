//! The PMI-2 wire protocol (Slurm's `srun --mpi=pmi2`): after a PMI-1 style `init` line
//! asking for version 2, each message is a 6-character decimal length (left-aligned, padded
//! with spaces) followed by `cmd=NAME;key=value;...;`. Values may not contain `;`, so
//! Courier's binary values go through `text` (base64, chunked).

use std::time::{Duration, Instant};

use super::pmi1::{Conn, take_fd};
use super::text;
use super::{Info, Launcher, LauncherKind};
use crate::base::{Error, Result, Status};

/// PMI-2's key and value limits (`PMI2_MAX_KEYLEN`, `PMI2_MAX_VALLEN`).
const KEY_MAX: usize = 64;
const VAL_MAX: usize = 1024;
const LONG: Duration = Duration::from_secs(120);

pub(super) struct Client {
    conn: Conn,
    jobid: String,
    rank: u32,
}

fn frame(body: &str) -> Vec<u8> {
    format!("{:<6}{body}", body.len()).into_bytes()
}

/// A value that may go between `;` separators.
fn clean(v: &str) -> String {
    v.chars()
        .map(|c| if c == ';' || c == '\n' { '_' } else { c })
        .collect()
}

impl Client {
    fn call(
        &mut self,
        body: &str,
        reply: &str,
        deadline: Option<Instant>,
    ) -> Result<Vec<(String, String)>> {
        self.conn.write(&frame(body))?;
        let m = self.conn.framed(deadline, reply)?;
        let p = text::pairs(&m, ';')?;
        match text::field(&p, "cmd") {
            Some(c) if c == reply => {}
            other => {
                return Err(Error::msg(
                    Status::ProtocolError,
                    format!("PMI-2: expected {reply}, the launcher answered {other:?}"),
                ));
            }
        }
        if let Some(rc) = text::field(&p, "rc").filter(|rc| *rc != "0") {
            return Err(Error::msg(
                Status::IoError,
                format!(
                    "PMI-2: {reply} with rc={rc} ({})",
                    text::field(&p, "errmsg").unwrap_or("no message")
                ),
            ));
        }
        Ok(p.into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    fn raw_get(&mut self, key: &str, deadline: Option<Instant>) -> Result<Option<String>> {
        let body = format!("cmd=kvs-get;jobid={};srcid=-1;key={key};", self.jobid);
        let p = self.call(&body, "kvs-get-response", deadline)?;
        let found = p
            .iter()
            .find(|(k, _)| k == "found")
            .map(|(_, v)| v.as_str());
        if !matches!(found, Some("TRUE") | Some("true")) {
            return Ok(None);
        }
        Ok(p.into_iter().find(|(k, _)| k == "value").map(|(_, v)| v))
    }

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

fn get_field(p: &[(String, String)], k: &str) -> Option<String> {
    p.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone())
}

pub(super) fn connect() -> Result<(Client, Info)> {
    let env_rank = std::env::var("PMI_RANK").unwrap_or_default();
    let jobid_env = std::env::var("PMI_JOBID").unwrap_or_default();
    let mut conn = take_fd("PMI-2")?;
    let dl = || Some(Instant::now() + LONG);
    // The version handshake is one PMI-1 style line, written in one piece (Slurm reads it
    // with a single read).
    conn.write(b"cmd=init pmi_version=2 pmi_subversion=0\n")?;
    let l = conn.line(dl(), "init")?;
    let p = text::pairs(&l, ' ')?;
    if text::field(&p, "cmd") != Some("response_to_init") || text::field(&p, "rc") != Some("0") {
        return Err(Error::msg(
            Status::ProtocolError,
            format!("PMI-2: the launcher refused version 2: {:?}", l.trim()),
        ));
    }
    let mut c = Client {
        conn,
        jobid: jobid_env.clone(),
        rank: 0,
    };
    let p = c.call(
        &format!(
            "cmd=fullinit;pmijobid={};pmirank={};threaded=FALSE;",
            clean(&jobid_env),
            clean(env_rank.trim())
        ),
        "fullinit-response",
        dl(),
    )?;
    let num = |k: &str| -> Result<u32> {
        get_field(&p, k)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| {
                Error::msg(
                    Status::ProtocolError,
                    format!("PMI-2: fullinit-response without a numeric {k}"),
                )
            })
    };
    let rank = num("rank")?;
    let size = num("size")?;
    if size == 0 || rank >= size {
        return Err(Error::msg(
            Status::ProtocolError,
            format!("PMI-2: rank {rank} of {size} is impossible"),
        ));
    }
    c.rank = rank;
    let p = c.call("cmd=job-getid;", "job-getid-response", dl())?;
    if let Some(j) = get_field(&p, "jobid").filter(|j| !j.is_empty()) {
        c.jobid = j;
    }
    let mapping = c
        .call(
            "cmd=info-getjobattr;key=PMI_process_mapping;",
            "info-getjobattr-response",
            dl(),
        )
        .ok()
        .filter(|p| get_field(p, "found").as_deref() == Some("TRUE"))
        .and_then(|p| get_field(&p, "value"));
    let (host, local_rank, local_size) = match mapping {
        Some(m) => text::locality(&text::process_mapping(&m, size)?, rank),
        None => (0, rank, size),
    };
    let info = Info {
        kind: LauncherKind::Pmi2,
        rank,
        size,
        local_rank,
        local_size,
        host,
        jobid: c.jobid.clone(),
    };
    Ok((c, info))
}

impl Launcher for Client {
    fn put(&mut self, key: &str, value: &[u8]) -> Result<()> {
        text::check_key(key, KEY_MAX)?;
        for (i, part) in text::split(value, VAL_MAX)?.iter().enumerate() {
            let k = text::store_key(self.rank, key, i);
            self.call(
                &format!("cmd=kvs-put;key={k};value={part};"),
                "kvs-put-response",
                Some(Instant::now() + LONG),
            )?;
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<()> {
        Ok(())
    }

    fn fence(&mut self, timeout: Duration) -> Result<()> {
        self.call("cmd=kvs-fence;", "kvs-fence-response", Some(Instant::now() + timeout))
            .map(|_| ())
            .map_err(|e| {
                if e.status() == Status::Timeout {
                    Error::msg(
                        Status::Timeout,
                        format!("PMI-2 fence: not every rank reached it within {timeout:?} (PMI-2 does not say which ranks are missing)"),
                    )
                } else {
                    e
                }
            })
    }

    fn get(&mut self, rank: u32, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        text::check_key(key, KEY_MAX)?;
        let deadline = Instant::now() + timeout;
        let first = self
            .get_waiting(&text::store_key(rank, key, 0), deadline)?
            .ok_or_else(|| {
                Error::msg(
                    Status::Timeout,
                    format!("PMI-2: rank {rank}'s key {key:?} was not there within {timeout:?} (put, then a fence, comes first)"),
                )
            })?;
        let (n, head) = text::head(&first)?;
        let mut all = head.to_string();
        for i in 1..n {
            let part = self
                .get_waiting(&text::store_key(rank, key, i), deadline)?
                .ok_or_else(|| {
                    Error::msg(
                        Status::ProtocolError,
                        format!("PMI-2: rank {rank}'s key {key:?} lacks its part {i} of {n}"),
                    )
                })?;
            all.push_str(&part);
        }
        text::decode(&all)
    }

    fn abort(&mut self, _code: i32, message: &str) {
        let _ = self.conn.write(&frame(&format!(
            "cmd=abort;isworld=TRUE;msg={};",
            clean(message)
        )));
    }

    fn finalize(&mut self) {
        let _ = self.call(
            "cmd=finalize;",
            "finalize-response",
            Some(Instant::now() + Duration::from_secs(5)),
        );
    }
}
