//! The wire format between `courier run` and its ranks, as data.
//!
//! Each rank inherits one end of a Unix stream socket pair (`COURIER_RUN_FD`); the launcher
//! holds the other. The rank opens with an 8-byte hello (`"CRJ1"`, then its rank as u32
//! LE); every later message is a frame: a u32 LE length (of what follows), an opcode, and the
//! fields below (integers little-endian, strings and byte strings as a length then bytes).
//! The same socket also takes the PMI-1 text protocol (a first line starting `cmd=`), so
//! that MPICH-style programs run under `courier run` too.
//!
//! ```text
//! rank → launcher                         launcher → rank
//! PUT      key(u16) value(u32)            WELCOME  rank size local_rank local_size host(u32)
//! COMMIT                                           auth_key[32] jobid(u16)
//! FENCE    timeout_ms(u32)                DONE                      (fence passed)
//! GET      rank(u32) key(u16) timeout_ms  VALUE    value(u32)
//! ABORT    code(i32) message(u32)         FAIL     status(i32) message(u32)
//! FINALIZE
//! ```
//! Puts are visible to other ranks once committed; a get waits in the launcher until the
//! key is there (or the timeout, or the owner rank's exit); a fence is a barrier that also
//! commits. Every length is checked against the limits below before anything is read.

use crate::base::{Error, Result, Status};

/// The hello's magic.
pub const MAGIC: &[u8; 4] = b"CRJ1";
/// The environment variable naming the rank's end of the socket pair.
pub const ENV_FD: &str = "COURIER_RUN_FD";
/// Longest key.
pub const MAX_KEY: usize = 255;
/// Longest value.
pub const MAX_VALUE: usize = 1 << 20;
/// Longest abort or failure message.
pub const MAX_MESSAGE: usize = 4096;
/// Longest frame (opcode and fields): a put of the longest key and value.
pub const MAX_FRAME: usize = 1 + 2 + MAX_KEY + 4 + MAX_VALUE;

/// A message from a rank to the launcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Publish `key` = `value` (seen by others after the next commit or fence).
    Put {
        /// Key.
        key: String,
        /// Value.
        value: Vec<u8>,
    },
    /// Make this rank's puts visible.
    Commit,
    /// Commit, then wait for every rank's fence of the same number.
    Fence {
        /// How long the launcher waits before failing it (naming the missing ranks).
        timeout_ms: u32,
    },
    /// `rank`'s `key`, waiting until it is committed.
    Get {
        /// Owner rank.
        rank: u32,
        /// Key.
        key: String,
        /// How long the launcher waits for it.
        timeout_ms: u32,
    },
    /// End the whole job with `code`.
    Abort {
        /// Exit code for the launcher.
        code: i32,
        /// Why.
        message: String,
    },
    /// This rank is done with the exchange.
    Finalize,
}

/// A message from the launcher to a rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The answer to the hello.
    Welcome(Welcome),
    /// A fence passed.
    Done,
    /// A get's value.
    Value(Vec<u8>),
    /// A fence or get failed.
    Fail {
        /// Status code (`Status::code`).
        status: i32,
        /// What and why.
        message: String,
    },
}

/// What a rank learns at the hello.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Welcome {
    /// This rank.
    pub rank: u32,
    /// Ranks in the job.
    pub size: u32,
    /// Rank among the processes on this host.
    pub local_rank: u32,
    /// Processes on this host.
    pub local_size: u32,
    /// This host's index in the job.
    pub host: u32,
    /// The job's authentication key.
    pub auth_key: [u8; 32],
    /// The job's name.
    pub jobid: String,
}

mod op {
    pub const PUT: u8 = 1;
    pub const COMMIT: u8 = 2;
    pub const FENCE: u8 = 3;
    pub const GET: u8 = 4;
    pub const ABORT: u8 = 5;
    pub const FINALIZE: u8 = 6;
    pub const WELCOME: u8 = 0x80;
    pub const DONE: u8 = 0x81;
    pub const VALUE: u8 = 0x82;
    pub const FAIL: u8 = 0x83;
}

/// The hello a rank sends first.
pub fn hello(rank: u32) -> [u8; 8] {
    let mut h = [0u8; 8];
    h[..4].copy_from_slice(MAGIC);
    h[4..].copy_from_slice(&rank.to_le_bytes());
    h
}

/// The rank a hello claims, if it is one.
pub fn parse_hello(b: &[u8; 8]) -> Option<u32> {
    if &b[..4] != MAGIC {
        return None;
    }
    Some(u32::from_le_bytes([b[4], b[5], b[6], b[7]]))
}

fn frame(body: Vec<u8>) -> Vec<u8> {
    let mut f = Vec::with_capacity(body.len() + 4);
    f.extend_from_slice(&(body.len() as u32).to_le_bytes());
    f.extend_from_slice(&body);
    f
}

fn put_str(v: &mut Vec<u8>, s: &[u8], wide: bool) {
    if wide {
        v.extend_from_slice(&(s.len() as u32).to_le_bytes());
    } else {
        v.extend_from_slice(&(s.len() as u16).to_le_bytes());
    }
    v.extend_from_slice(s);
}

impl Request {
    /// The frame for this request. Lengths beyond the limits are refused here too.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut b = Vec::new();
        match self {
            Request::Put { key, value } => {
                check_key(key)?;
                if value.len() > MAX_VALUE {
                    return Err(Error::msg(
                        Status::InvalidParam,
                        format!(
                            "a job value of {} bytes is larger than courier run takes ({MAX_VALUE})",
                            value.len()
                        ),
                    ));
                }
                b.push(op::PUT);
                put_str(&mut b, key.as_bytes(), false);
                put_str(&mut b, value, true);
            }
            Request::Commit => b.push(op::COMMIT),
            Request::Fence { timeout_ms } => {
                b.push(op::FENCE);
                b.extend_from_slice(&timeout_ms.to_le_bytes());
            }
            Request::Get {
                rank,
                key,
                timeout_ms,
            } => {
                check_key(key)?;
                b.push(op::GET);
                b.extend_from_slice(&rank.to_le_bytes());
                put_str(&mut b, key.as_bytes(), false);
                b.extend_from_slice(&timeout_ms.to_le_bytes());
            }
            Request::Abort { code, message } => {
                b.push(op::ABORT);
                b.extend_from_slice(&code.to_le_bytes());
                put_str(&mut b, truncate(message).as_bytes(), true);
            }
            Request::Finalize => b.push(op::FINALIZE),
        }
        Ok(frame(b))
    }

    /// A request from a frame body (what follows the length).
    pub fn decode(body: &[u8]) -> Result<Request> {
        let mut r = Reader { b: body, pos: 0 };
        let req = match r.u8()? {
            op::PUT => {
                let key = r.key()?;
                let value = r.bytes(MAX_VALUE)?.to_vec();
                Request::Put { key, value }
            }
            op::COMMIT => Request::Commit,
            op::FENCE => Request::Fence {
                timeout_ms: r.u32()?,
            },
            op::GET => {
                let rank = r.u32()?;
                let key = r.key()?;
                Request::Get {
                    rank,
                    key,
                    timeout_ms: r.u32()?,
                }
            }
            op::ABORT => {
                let code = r.u32()? as i32;
                let message = String::from_utf8_lossy(r.bytes(MAX_MESSAGE)?).into_owned();
                Request::Abort { code, message }
            }
            op::FINALIZE => Request::Finalize,
            other => return Err(bad(format!("unknown request opcode {other}"))),
        };
        r.end()?;
        Ok(req)
    }
}

impl Reply {
    /// The frame for this reply.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            Reply::Welcome(w) => {
                b.push(op::WELCOME);
                for n in [w.rank, w.size, w.local_rank, w.local_size, w.host] {
                    b.extend_from_slice(&n.to_le_bytes());
                }
                b.extend_from_slice(&w.auth_key);
                let id = &w.jobid.as_bytes()[..w.jobid.len().min(MAX_KEY)];
                put_str(&mut b, id, false);
            }
            Reply::Done => b.push(op::DONE),
            Reply::Value(v) => {
                b.push(op::VALUE);
                put_str(&mut b, v, true);
            }
            Reply::Fail { status, message } => {
                b.push(op::FAIL);
                b.extend_from_slice(&status.to_le_bytes());
                put_str(&mut b, truncate(message).as_bytes(), true);
            }
        }
        frame(b)
    }

    /// A reply from a frame body.
    pub fn decode(body: &[u8]) -> Result<Reply> {
        let mut r = Reader { b: body, pos: 0 };
        let rep = match r.u8()? {
            op::WELCOME => {
                let rank = r.u32()?;
                let size = r.u32()?;
                let local_rank = r.u32()?;
                let local_size = r.u32()?;
                let host = r.u32()?;
                let mut auth_key = [0u8; 32];
                auth_key.copy_from_slice(r.take(32)?);
                let jobid = r.key_or_empty()?;
                if size == 0 || rank >= size || local_size == 0 || local_rank >= local_size {
                    return Err(bad(format!(
                        "the launcher's welcome is inconsistent: rank {rank} of {size}, local rank {local_rank} of {local_size}"
                    )));
                }
                Reply::Welcome(Welcome {
                    rank,
                    size,
                    local_rank,
                    local_size,
                    host,
                    auth_key,
                    jobid,
                })
            }
            op::DONE => Reply::Done,
            op::VALUE => Reply::Value(r.bytes(MAX_VALUE)?.to_vec()),
            op::FAIL => {
                let status = r.u32()? as i32;
                let message = String::from_utf8_lossy(r.bytes(MAX_MESSAGE)?).into_owned();
                Reply::Fail { status, message }
            }
            other => return Err(bad(format!("unknown reply opcode {other}"))),
        };
        r.end()?;
        Ok(rep)
    }
}

/// The length a frame header announces, checked against `MAX_FRAME`.
pub fn frame_len(header: [u8; 4]) -> Result<usize> {
    let n = u32::from_le_bytes(header) as usize;
    if n == 0 || n > MAX_FRAME {
        return Err(bad(format!(
            "a frame of {n} bytes (the limit is {MAX_FRAME}, and none is empty)"
        )));
    }
    Ok(n)
}

/// A key the protocol takes: 1 to `MAX_KEY` bytes of UTF-8.
pub fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(Error::msg(
            Status::InvalidParam,
            format!(
                "job key of {} bytes: keys are 1 to {MAX_KEY} bytes",
                key.len()
            ),
        ));
    }
    Ok(())
}

fn truncate(s: &str) -> &str {
    if s.len() <= MAX_MESSAGE {
        return s;
    }
    let mut end = MAX_MESSAGE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn bad(what: String) -> Error {
    Error::msg(
        Status::ProtocolError,
        format!("courier run protocol: {what}"),
    )
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.b.len() - self.pos < n {
            return Err(bad(format!(
                "message truncated: {n} bytes wanted at offset {} of {}",
                self.pos,
                self.b.len()
            )));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn bytes(&mut self, max: usize) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(bad(format!("a field of {n} bytes (at most {max})")));
        }
        self.take(n)
    }
    fn key_or_empty(&mut self) -> Result<String> {
        let s = self.take(2)?;
        let n = u16::from_le_bytes([s[0], s[1]]) as usize;
        if n > MAX_KEY {
            return Err(bad(format!("a key of {n} bytes (at most {MAX_KEY})")));
        }
        let k = self.take(n)?;
        String::from_utf8(k.to_vec()).map_err(|_| bad("a key that is not UTF-8".into()))
    }
    fn key(&mut self) -> Result<String> {
        let k = self.key_or_empty()?;
        if k.is_empty() {
            return Err(bad("an empty key".into()));
        }
        Ok(k)
    }
    fn end(&self) -> Result<()> {
        if self.pos != self.b.len() {
            return Err(bad(format!(
                "{} bytes after the message",
                self.b.len() - self.pos
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(f: &[u8]) -> &[u8] {
        let n = frame_len([f[0], f[1], f[2], f[3]]).unwrap();
        assert_eq!(n, f.len() - 4);
        &f[4..]
    }

    #[test]
    fn requests_round_trip() {
        let reqs = [
            Request::Put {
                key: "addr".into(),
                value: vec![1, 2, 3],
            },
            Request::Commit,
            Request::Fence { timeout_ms: 5000 },
            Request::Get {
                rank: 7,
                key: "addr".into(),
                timeout_ms: 10,
            },
            Request::Abort {
                code: -3,
                message: "bye".into(),
            },
            Request::Finalize,
        ];
        for r in reqs {
            let f = r.encode().unwrap();
            assert_eq!(Request::decode(body(&f)).unwrap(), r);
        }
    }

    #[test]
    fn replies_round_trip() {
        let reps = [
            Reply::Welcome(Welcome {
                rank: 1,
                size: 4,
                local_rank: 1,
                local_size: 4,
                host: 0,
                auth_key: [9; 32],
                jobid: "courier-1".into(),
            }),
            Reply::Done,
            Reply::Value(vec![0; 100]),
            Reply::Fail {
                status: -20,
                message: "ranks 2, 3 did not join".into(),
            },
        ];
        for r in reps {
            let f = r.encode();
            assert_eq!(Reply::decode(body(&f)).unwrap(), r);
        }
    }

    #[test]
    fn bad_input_is_refused() {
        assert!(frame_len([0, 0, 0, 0]).is_err());
        assert!(frame_len(((MAX_FRAME + 1) as u32).to_le_bytes()).is_err());
        assert!(Request::decode(&[99]).is_err());
        assert!(Request::decode(&[op::FENCE, 1, 2]).is_err());
        assert!(Request::decode(&[op::COMMIT, 0]).is_err());
        // A put whose value length runs past the frame.
        assert!(Request::decode(&[op::PUT, 1, 0, b'k', 200, 0, 0, 0, 1]).is_err());
        assert!(Request::decode(&[op::PUT, 0, 0, 0, 0, 0, 0]).is_err());
        // A welcome whose rank is outside the job.
        let mut w = Reply::Welcome(Welcome {
            rank: 0,
            size: 1,
            local_rank: 0,
            local_size: 1,
            host: 0,
            auth_key: [0; 32],
            jobid: String::new(),
        })
        .encode();
        w[5] = 3;
        assert!(Reply::decode(&w[4..]).is_err());
        assert_eq!(parse_hello(&hello(5)), Some(5));
        assert_eq!(parse_hello(b"cmd=init"), None);
        assert!(
            Request::Put {
                key: String::new(),
                value: vec![]
            }
            .encode()
            .is_err()
        );
    }
}
