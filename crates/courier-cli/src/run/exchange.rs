//! The exchange `courier run` serves its ranks: a key-value store per rank, fences, and
//! lookups that wait for a key, over each rank's socket; spoken either in Courier's own
//! protocol (`courier::job::runwire`) or in PMI-1's text lines (MPICH-style programs).
//!
//! This is the state machine only: bytes in from a rank, bytes out to ranks, events for the
//! launcher (an abort, a protocol violation). The launcher's loop owns the sockets and the
//! clock. Every length and count a rank sends is checked against a limit.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use courier::Status;
use courier::job::runwire::{self, Reply, Request, Welcome};
use courier::job::text;

/// Most bytes one rank may keep in the exchange (keys and values).
pub const MAX_STORED: usize = 64 << 20;
/// Most keys one rank may keep.
pub const MAX_KEYS: usize = 100_000;
/// PMI-1's limits, as `get_maxes` announces them.
const PMI_KVSNAME_MAX: usize = 256;
const PMI_KEY_MAX: usize = 256;
const PMI_VAL_MAX: usize = 1024;

/// Something the launcher must act on.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// A rank asked to end the job.
    Abort {
        rank: u32,
        code: i32,
        message: String,
    },
    /// A rank broke the protocol; the launcher ends the job.
    Violation { rank: u32, why: String },
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Proto {
    Unknown,
    Courier,
    Pmi1,
}

struct RankState {
    proto: Proto,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    pending: HashMap<String, Vec<u8>>,
    committed: HashMap<String, Vec<u8>>,
    stored: usize,
    /// Fences joined so far.
    fences: u64,
    /// The fence this rank waits in, and until when (None: no limit).
    waiting: Option<(u64, Option<Instant>)>,
    /// Why it left, once it has (socket closed or process ended).
    gone: Option<String>,
    /// Once it broke the protocol, nothing more is read from it.
    dead: bool,
}

struct PendingGet {
    from: u32,
    owner: u32,
    key: String,
    deadline: Instant,
}

/// The whole exchange.
pub struct Exchange {
    size: u32,
    jobid: String,
    auth_key: [u8; 32],
    pids: Vec<i32>,
    ranks: Vec<RankState>,
    gets: Vec<PendingGet>,
    pmi_kvs: HashMap<String, String>,
    pmi_stored: usize,
    events: Vec<Event>,
}

impl Exchange {
    /// An exchange for `pids.len()` ranks on one host.
    pub fn new(jobid: String, auth_key: [u8; 32], pids: Vec<i32>) -> Exchange {
        let size = pids.len() as u32;
        let ranks = (0..size)
            .map(|_| RankState {
                proto: Proto::Unknown,
                inbuf: Vec::new(),
                out: Vec::new(),
                pending: HashMap::new(),
                committed: HashMap::new(),
                stored: 0,
                fences: 0,
                waiting: None,
                gone: None,
                dead: false,
            })
            .collect();
        let mut pmi_kvs = HashMap::new();
        pmi_kvs.insert(
            "PMI_process_mapping".to_string(),
            format!("(vector,(0,1,{size}))"),
        );
        Exchange {
            size,
            jobid,
            auth_key,
            pids,
            ranks,
            gets: Vec::new(),
            pmi_kvs,
            pmi_stored: 0,
            events: Vec::new(),
        }
    }

    /// Bytes waiting to go to `rank` (taken).
    pub fn take_output(&mut self, rank: u32) -> Vec<u8> {
        std::mem::take(&mut self.ranks[rank as usize].out)
    }

    /// Whether anything waits to go to `rank`.
    pub fn has_output(&self, rank: u32) -> bool {
        !self.ranks[rank as usize].out.is_empty()
    }

    /// Events since the last call.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// The earliest deadline of a waiting fence or get.
    pub fn next_deadline(&self) -> Option<Instant> {
        let f = self
            .ranks
            .iter()
            .filter_map(|r| r.waiting.and_then(|w| w.1));
        let g = self.gets.iter().map(|g| g.deadline);
        f.chain(g).min()
    }

    fn violation(&mut self, rank: u32, why: String) {
        let r = &mut self.ranks[rank as usize];
        if !r.dead {
            r.dead = true;
            r.inbuf.clear();
            self.events.push(Event::Violation { rank, why });
        }
    }

    /// Bytes that arrived from `rank`.
    pub fn input(&mut self, rank: u32, bytes: &[u8], now: Instant) {
        if self.ranks[rank as usize].dead {
            return;
        }
        self.ranks[rank as usize].inbuf.extend_from_slice(bytes);
        loop {
            let r = &self.ranks[rank as usize];
            if r.dead {
                return;
            }
            let progressed = match r.proto {
                Proto::Unknown => self.detect(rank),
                Proto::Courier => self.courier_step(rank, now),
                Proto::Pmi1 => self.pmi_step(rank),
            };
            if !progressed {
                return;
            }
        }
    }

    fn detect(&mut self, rank: u32) -> bool {
        let buf = &self.ranks[rank as usize].inbuf;
        if buf.len() < 4 {
            let ok = runwire::MAGIC.starts_with(buf)
                || b"cmd=".starts_with(buf)
                || b"mcmd".starts_with(buf);
            if !ok {
                self.violation(
                    rank,
                    format!("its first bytes {buf:02x?} are neither Courier's hello nor PMI"),
                );
            }
            return false;
        }
        if &buf[..4] == runwire::MAGIC {
            if buf.len() < 8 {
                return false;
            }
            let mut h = [0u8; 8];
            h.copy_from_slice(&buf[..8]);
            let claimed = runwire::parse_hello(&h).unwrap_or(u32::MAX);
            self.ranks[rank as usize].inbuf.drain(..8);
            if claimed != rank && claimed != u32::MAX {
                self.violation(rank, format!("it said hello as rank {claimed}"));
                return false;
            }
            self.ranks[rank as usize].proto = Proto::Courier;
            let w = Reply::Welcome(Welcome {
                rank,
                size: self.size,
                local_rank: rank,
                local_size: self.size,
                host: 0,
                auth_key: self.auth_key,
                jobid: self.jobid.clone(),
            });
            self.ranks[rank as usize].out.extend_from_slice(&w.encode());
            true
        } else if &buf[..4] == b"cmd=" || &buf[..4] == b"mcmd" {
            self.ranks[rank as usize].proto = Proto::Pmi1;
            true
        } else {
            let why = format!(
                "its first bytes {:02x?} are neither Courier's hello nor PMI",
                &buf[..4]
            );
            self.violation(rank, why);
            false
        }
    }

    // ----- Courier's protocol -----------------------------------------------------------------

    fn courier_step(&mut self, rank: u32, now: Instant) -> bool {
        let buf = &self.ranks[rank as usize].inbuf;
        if buf.len() < 4 {
            return false;
        }
        let n = match runwire::frame_len([buf[0], buf[1], buf[2], buf[3]]) {
            Ok(n) => n,
            Err(e) => {
                self.violation(rank, e.detail().to_string());
                return false;
            }
        };
        if buf.len() < 4 + n {
            return false;
        }
        let body: Vec<u8> = self.ranks[rank as usize]
            .inbuf
            .drain(..4 + n)
            .skip(4)
            .collect();
        match Request::decode(&body) {
            Ok(req) => self.request(rank, req, now),
            Err(e) => self.violation(rank, e.detail().to_string()),
        }
        true
    }

    fn reply(&mut self, rank: u32, r: Reply) {
        self.ranks[rank as usize].out.extend_from_slice(&r.encode());
    }

    fn fail(&mut self, rank: u32, status: Status, message: String) {
        if self.ranks[rank as usize].proto == Proto::Pmi1 {
            // PMI-1 has no failure answer to a barrier: its rank is ended by the launcher
            // when the job fails; say why in the reply it can read.
            let msg = message.replace([' ', '\n'], "_");
            self.ranks[rank as usize]
                .out
                .extend_from_slice(format!("cmd=barrier_out rc=-1 msg={msg}\n").as_bytes());
            return;
        }
        self.reply(
            rank,
            Reply::Fail {
                status: status.code(),
                message,
            },
        );
    }

    fn request(&mut self, rank: u32, req: Request, now: Instant) {
        match req {
            Request::Put { key, value } => self.put(rank, key, value),
            Request::Commit => {
                self.commit(rank);
                self.serve_gets(now);
            }
            Request::Fence { timeout_ms } => {
                self.commit(rank);
                self.serve_gets(now);
                let dl = now + Duration::from_millis(timeout_ms as u64);
                self.enter_fence(rank, Some(dl));
            }
            Request::Get {
                rank: owner,
                key,
                timeout_ms,
            } => {
                if owner >= self.size {
                    self.fail(
                        rank,
                        Status::InvalidParam,
                        format!("rank {owner} is not in this job of {}", self.size),
                    );
                    return;
                }
                let deadline = now + Duration::from_millis(timeout_ms as u64);
                self.gets.push(PendingGet {
                    from: rank,
                    owner,
                    key,
                    deadline,
                });
                self.serve_gets(now);
            }
            Request::Abort { code, message } => {
                self.events.push(Event::Abort {
                    rank,
                    code,
                    message,
                });
            }
            Request::Finalize => {
                self.leave(rank, "it finalized".into(), now);
            }
        }
    }

    fn put(&mut self, rank: u32, key: String, value: Vec<u8>) {
        let r = &mut self.ranks[rank as usize];
        r.stored += key.len() + value.len();
        let keys = r.pending.len() + r.committed.len();
        if r.stored > MAX_STORED || keys >= MAX_KEYS {
            let why = format!(
                "it put more than the exchange keeps for one rank ({MAX_STORED} bytes, {MAX_KEYS} keys)"
            );
            self.violation(rank, why);
            return;
        }
        r.pending.insert(key, value);
    }

    fn commit(&mut self, rank: u32) {
        let r = &mut self.ranks[rank as usize];
        let p = std::mem::take(&mut r.pending);
        r.committed.extend(p);
    }

    // ----- fences -----------------------------------------------------------------------------

    fn enter_fence(&mut self, rank: u32, deadline: Option<Instant>) {
        let r = &mut self.ranks[rank as usize];
        r.fences += 1;
        r.waiting = Some((r.fences, deadline));
        self.check_fences();
    }

    fn missing(&self, n: u64) -> Vec<u32> {
        (0..self.size)
            .filter(|&x| self.ranks[x as usize].fences < n)
            .collect()
    }

    fn describe(&self, ranks: &[u32]) -> String {
        let shown: Vec<String> = ranks
            .iter()
            .take(16)
            .map(|&r| format!("{r} (pid {})", self.pids[r as usize]))
            .collect();
        let more = if ranks.len() > 16 {
            format!(" and {} more", ranks.len() - 16)
        } else {
            String::new()
        };
        format!("{}{more}", shown.join(", "))
    }

    fn check_fences(&mut self) {
        for rank in 0..self.size {
            let Some((n, _)) = self.ranks[rank as usize].waiting else {
                continue;
            };
            let missing = self.missing(n);
            if missing.is_empty() {
                self.ranks[rank as usize].waiting = None;
                if self.ranks[rank as usize].proto == Proto::Pmi1 {
                    self.ranks[rank as usize]
                        .out
                        .extend_from_slice(b"cmd=barrier_out rc=0\n");
                } else {
                    self.reply(rank, Reply::Done);
                }
                continue;
            }
            // A missing rank that has left can never come.
            if let Some(&g) = missing
                .iter()
                .find(|&&m| self.ranks[m as usize].gone.is_some())
            {
                let why = self.ranks[g as usize].gone.clone().unwrap_or_default();
                self.ranks[rank as usize].waiting = None;
                let msg = format!(
                    "fence {n}: rank {} left the job before joining it ({why})",
                    self.describe(&[g])
                );
                self.fail(rank, Status::PeerFailure, msg);
            }
        }
    }

    /// Time passed: fail the fences and gets whose time is up.
    pub fn tick(&mut self, now: Instant) {
        for rank in 0..self.size {
            let Some((n, Some(dl))) = self.ranks[rank as usize].waiting else {
                continue;
            };
            if now >= dl {
                self.ranks[rank as usize].waiting = None;
                let missing = self.missing(n);
                let msg = format!(
                    "fence {n} timed out: {} of {} ranks did not join it: {}",
                    missing.len(),
                    self.size,
                    self.describe(&missing)
                );
                self.fail(rank, Status::Timeout, msg);
            }
        }
        self.serve_gets(now);
    }

    fn serve_gets(&mut self, now: Instant) {
        let gets = std::mem::take(&mut self.gets);
        for g in gets {
            let owner = &self.ranks[g.owner as usize];
            if let Some(v) = owner.committed.get(&g.key) {
                let v = v.clone();
                self.reply(g.from, Reply::Value(v));
            } else if let Some(why) = owner.gone.clone() {
                let msg = format!(
                    "rank {}'s key {:?} was never committed: it left the job ({why})",
                    self.describe(&[g.owner]),
                    g.key
                );
                self.fail(g.from, Status::PeerFailure, msg);
            } else if now >= g.deadline {
                let msg = format!(
                    "rank {}'s key {:?} was not committed in time",
                    self.describe(&[g.owner]),
                    g.key
                );
                self.fail(g.from, Status::Timeout, msg);
            } else {
                self.gets.push(g);
            }
        }
    }

    /// `rank` left the exchange (its socket closed, or its process ended): `why` says how.
    pub fn leave(&mut self, rank: u32, why: String, now: Instant) {
        let r = &mut self.ranks[rank as usize];
        if r.gone.is_none() {
            r.gone = Some(why);
        }
        r.waiting = None;
        self.gets.retain(|g| g.from != rank);
        self.check_fences();
        self.serve_gets(now);
    }

    // ----- PMI-1 ------------------------------------------------------------------------------

    fn pmi_step(&mut self, rank: u32) -> bool {
        let buf = &self.ranks[rank as usize].inbuf;
        let Some(p) = buf.iter().position(|&b| b == b'\n') else {
            if buf.len() > text::MAX_LINE {
                self.violation(
                    rank,
                    format!("a PMI line longer than {} bytes", text::MAX_LINE),
                );
            }
            return false;
        };
        let line: Vec<u8> = self.ranks[rank as usize].inbuf.drain(..=p).collect();
        let Ok(line) = String::from_utf8(line) else {
            self.violation(rank, "a PMI line that is not UTF-8".into());
            return false;
        };
        if line.starts_with("mcmd=") {
            // Spawning more processes is not offered.
            self.pmi_out(
                rank,
                "cmd=spawn_result rc=-1 errmsg=courier_run_does_not_spawn",
            );
            return true;
        }
        let pairs = match text::pairs(&line, ' ') {
            Ok(p) => p,
            Err(e) => {
                self.violation(rank, e.detail().to_string());
                return false;
            }
        };
        let cmd = text::field(&pairs, "cmd").unwrap_or("");
        let owned: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let cmd = cmd.to_string();
        self.pmi_command(rank, &cmd, &owned);
        true
    }

    fn pmi_out(&mut self, rank: u32, line: &str) {
        let out = &mut self.ranks[rank as usize].out;
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }

    fn pmi_command(&mut self, rank: u32, cmd: &str, p: &[(String, String)]) {
        let get = |k: &str| p.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
        match cmd {
            "init" => {
                let v = get("pmi_version").unwrap_or("1");
                if v == "1" {
                    self.pmi_out(rank, "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0");
                } else {
                    self.pmi_out(rank, "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=-1");
                }
            }
            "get_maxes" => self.pmi_out(
                rank,
                &format!(
                    "cmd=maxes rc=0 kvsname_max={PMI_KVSNAME_MAX} keylen_max={PMI_KEY_MAX} vallen_max={PMI_VAL_MAX}"
                ),
            ),
            "get_appnum" => self.pmi_out(rank, "cmd=appnum rc=0 appnum=0"),
            "get_my_kvsname" => {
                let l = format!("cmd=my_kvsname rc=0 kvsname={}", self.jobid);
                self.pmi_out(rank, &l);
            }
            "get_universe_size" => {
                let l = format!("cmd=universe_size rc=0 size={}", self.size);
                self.pmi_out(rank, &l);
            }
            "put" => {
                let (Some(k), Some(v)) = (get("key"), get("value")) else {
                    self.pmi_out(rank, "cmd=put_result rc=-1 msg=put_without_key_or_value");
                    return;
                };
                if k.len() > PMI_KEY_MAX || v.len() > PMI_VAL_MAX {
                    self.pmi_out(rank, "cmd=put_result rc=-1 msg=key_or_value_too_long");
                    return;
                }
                self.pmi_stored += k.len() + v.len();
                if self.pmi_stored > MAX_STORED * 4 || self.pmi_kvs.len() >= MAX_KEYS * 16 {
                    self.violation(rank, "it filled the PMI store past its limit".into());
                    return;
                }
                let (k, v) = (k.to_string(), v.to_string());
                self.pmi_kvs.insert(k, v);
                self.pmi_out(rank, "cmd=put_result rc=0 msg=success");
            }
            "get" => {
                let k = get("key").unwrap_or("");
                let l = match self.pmi_kvs.get(k) {
                    Some(v) => format!("cmd=get_result rc=0 msg=success value={v}"),
                    None => "cmd=get_result rc=-1 msg=key_not_found".to_string(),
                };
                self.pmi_out(rank, &l);
            }
            "barrier_in" => self.enter_fence(rank, None),
            "finalize" => {
                self.pmi_out(rank, "cmd=finalize_ack rc=0");
            }
            "abort" => {
                let code = get("exitcode").and_then(|c| c.parse().ok()).unwrap_or(1);
                let message = get("message").unwrap_or("PMI_Abort").replace('_', " ");
                self.events.push(Event::Abort {
                    rank,
                    code,
                    message,
                });
            }
            other => {
                let l = format!("cmd={other}_result rc=-1 msg=unsupported_by_courier_run");
                self.pmi_out(rank, &l);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(n: usize) -> Exchange {
        Exchange::new("job".into(), [5; 32], (100..100 + n as i32).collect())
    }

    fn replies(e: &mut Exchange, rank: u32) -> Vec<Reply> {
        let out = e.take_output(rank);
        let mut v = Vec::new();
        let mut b = &out[..];
        while !b.is_empty() {
            let n = runwire::frame_len([b[0], b[1], b[2], b[3]]).unwrap();
            v.push(Reply::decode(&b[4..4 + n]).unwrap());
            b = &b[4 + n..];
        }
        v
    }

    fn send(e: &mut Exchange, rank: u32, r: Request, now: Instant) {
        e.input(rank, &r.encode().unwrap(), now);
    }

    #[test]
    fn hello_put_fence_get() {
        let now = Instant::now();
        let mut e = ex(2);
        for r in 0..2 {
            e.input(r, &runwire::hello(r), now);
            match &replies(&mut e, r)[..] {
                [Reply::Welcome(w)] => {
                    assert_eq!((w.rank, w.size), (r, 2));
                    assert_eq!(w.auth_key, [5; 32]);
                }
                other => panic!("{other:?}"),
            }
        }
        send(
            &mut e,
            0,
            Request::Put {
                key: "a".into(),
                value: vec![1, 2],
            },
            now,
        );
        // A get before the commit waits.
        send(
            &mut e,
            1,
            Request::Get {
                rank: 0,
                key: "a".into(),
                timeout_ms: 1000,
            },
            now,
        );
        assert!(replies(&mut e, 1).is_empty());
        send(&mut e, 0, Request::Fence { timeout_ms: 1000 }, now);
        assert_eq!(replies(&mut e, 1), vec![Reply::Value(vec![1, 2])]);
        assert!(replies(&mut e, 0).is_empty(), "fence passed with one rank");
        send(&mut e, 1, Request::Fence { timeout_ms: 1000 }, now);
        assert_eq!(replies(&mut e, 0), vec![Reply::Done]);
        assert_eq!(replies(&mut e, 1), vec![Reply::Done]);
    }

    #[test]
    fn a_fence_times_out_naming_the_missing_ranks() {
        let now = Instant::now();
        let mut e = ex(4);
        for r in 0..4 {
            e.input(r, &runwire::hello(r), now);
            e.take_output(r);
        }
        send(&mut e, 0, Request::Fence { timeout_ms: 10 }, now);
        send(&mut e, 2, Request::Fence { timeout_ms: 10 }, now);
        e.tick(now + Duration::from_millis(20));
        match &replies(&mut e, 0)[..] {
            [Reply::Fail { status, message }] => {
                assert_eq!(*status, Status::Timeout.code());
                assert!(message.contains("1 (pid 101), 3 (pid 103)"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_rank_that_leaves_fails_the_fence_and_gets() {
        let now = Instant::now();
        let mut e = ex(2);
        for r in 0..2 {
            e.input(r, &runwire::hello(r), now);
            e.take_output(r);
        }
        send(
            &mut e,
            0,
            Request::Get {
                rank: 1,
                key: "x".into(),
                timeout_ms: 60_000,
            },
            now,
        );
        send(&mut e, 0, Request::Fence { timeout_ms: 60_000 }, now);
        e.leave(1, "it exited with status 0".into(), now);
        let r = replies(&mut e, 0);
        assert_eq!(r.len(), 2, "{r:?}");
        for rep in r {
            match rep {
                Reply::Fail { status, message } => {
                    assert_eq!(status, Status::PeerFailure.code());
                    assert!(
                        message.contains("1 (pid 101)") && message.contains("exited"),
                        "{message}"
                    );
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn garbage_and_impostors_are_violations() {
        let now = Instant::now();
        let mut e = ex(2);
        e.input(0, b"GET / HTTP/1.1\r\n", now);
        e.input(1, &runwire::hello(0), now);
        let ev = e.take_events();
        assert_eq!(ev.len(), 2, "{ev:?}");
        assert!(matches!(&ev[1], Event::Violation { rank: 1, why } if why.contains("as rank 0")));
        let mut e = ex(1);
        e.input(0, &runwire::hello(0), now);
        e.input(0, &[0xff, 0xff, 0xff, 0xff], now);
        assert!(matches!(
            &e.take_events()[..],
            [Event::Violation { rank: 0, .. }]
        ));
    }

    #[test]
    fn pmi1_conversation() {
        let now = Instant::now();
        let mut e = ex(2);
        let say = |e: &mut Exchange, r: u32, l: &str| {
            e.input(r, l.as_bytes(), now);
            String::from_utf8(e.take_output(r)).unwrap()
        };
        assert!(say(&mut e, 0, "cmd=init pmi_version=1 pmi_subversion=1\n").contains("rc=0"));
        assert!(say(&mut e, 0, "cmd=get_maxes\n").contains("vallen_max=1024"));
        assert_eq!(
            say(&mut e, 0, "cmd=get_my_kvsname\n"),
            "cmd=my_kvsname rc=0 kvsname=job\n"
        );
        assert!(say(&mut e, 0, "cmd=put kvsname=job key=k value=v1\n").contains("rc=0"));
        assert!(say(&mut e, 0, "cmd=barrier_in\n").is_empty());
        say(&mut e, 1, "cmd=init pmi_version=1 pmi_subversion=1\n");
        assert_eq!(say(&mut e, 1, "cmd=barrier_in\n"), "cmd=barrier_out rc=0\n");
        assert_eq!(
            String::from_utf8(e.take_output(0)).unwrap(),
            "cmd=barrier_out rc=0\n"
        );
        assert!(say(&mut e, 1, "cmd=get kvsname=job key=k\n").contains("value=v1"));
        assert!(
            say(&mut e, 1, "cmd=get kvsname=job key=PMI_process_mapping\n")
                .contains("(vector,(0,1,2))")
        );
        assert!(say(&mut e, 1, "cmd=get kvsname=job key=nope\n").contains("rc=-1"));
        say(&mut e, 1, "cmd=abort exitcode=7\n");
        assert!(matches!(
            &e.take_events()[..],
            [Event::Abort {
                rank: 1,
                code: 7,
                ..
            }]
        ));
    }
}
