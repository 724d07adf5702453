//! Hostile peers, as real processes (this test binary re-run with `COURIER_TEST_ROLE`),
//! over shared memory and tcp: floods of unexpected tag messages, stream bytes and
//! unanswered gets are held to the victim's configured budget (its peak RSS is measured)
//! while a legitimate client keeps its round trips; idle connections in setup cost the
//! victim no CPU; a peer that stops progressing (SIGSTOP, or a process that no longer
//! calls into Courier) fails within `COURIER_KEEPALIVE_TIMEOUT` instead of holding a
//! wait forever; peer churn grows neither descriptors nor maps.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier::*;

/// `bench_hostile`, the full-size numbers (`bench/hostile.sh`).
#[path = "hostile/bench.rs"]
mod bench;
mod common;
use common::cputime::{CallTimes, thread_cpu_ns, thread_usage};

/// Pings waiting for their answer: the endpoint and the data.
type Replies = Arc<Mutex<Vec<(Endpoint, Vec<u8>)>>>;

const AM_PING: u16 = 1;
const AM_PONG: u16 = 2;
const FLOOD_TAG: u64 = 0x99;
const REGION: usize = 1 << 20;

/// The victim's budget in these tests: small, so that a flood reaches it in a moment.
const VICTIM_LIMITS: [(&str, &str); 4] = [
    ("COURIER_MAX_UNEXPECTED_EP", "2m"),
    ("COURIER_MAX_UNEXPECTED", "4m"),
    ("COURIER_MAX_STREAM_EP", "2m"),
    ("COURIER_MAX_REPLY_QUEUE", "1m"),
];

fn all_features() -> Features {
    Features {
        rma: true,
        atomics: true,
        ..Features::default()
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

// ----- children -------------------------------------------------------------------------

fn child_main() -> bool {
    let Ok(role) = std::env::var("COURIER_TEST_ROLE") else {
        return false;
    };
    let code = match role.as_str() {
        "victim" => run_victim(),
        "flood" => run_flood(),
        "stopper" => run_stopper(),
        "owner" => run_owner(),
        "slowget" => run_slow_get(),
        other => {
            eprintln!("unknown role {other}");
            3
        }
    };
    std::process::exit(code);
}

/// The victim: a worker that answers active-message pings (on the endpoint they came on),
/// posts no tag receive, reads no stream and maps a registered region for gets. It answers
/// after every progress call and sleeps when nothing arrives. Ends when its stdin closes.
fn run_victim() -> i32 {
    let ctx = Context::new(ContextParams::default().features(all_features())).unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let queue: Replies = Arc::default();
    let q2 = queue.clone();
    w.am_set_handler(AM_PING, move |m: &mut AmMessage| {
        if let Some(ep) = m.reply_ep() {
            q2.lock().unwrap().push((ep, m.data().to_vec()));
        }
    })
    .unwrap();
    let l = Listener::new(&w, "127.0.0.1:0".parse().unwrap(), |req: ConnRequest| {
        // Accepted endpoints are the worker's (the test counts nothing through them).
        let _ = req.accept(EndpointParams::default());
    })
    .unwrap();
    let mut region = vec![7u8; REGION];
    let mem = ctx
        // SAFETY: `region` outlives the region (the child exits with it mapped) and is not touched
        // again.
        .mem_map(unsafe { MemMapParams::register(region.as_mut_ptr(), REGION) })
        .unwrap();
    println!("ADDR {}", hex(&w.address().unwrap()));
    println!("RKEY {}", hex(&mem.pack_rkey().unwrap()));
    println!("BASE {}", region.as_ptr() as u64);
    println!("PORT {}", l.local_addr().port());
    std::io::stdout().flush().unwrap();
    // Stdin closing ends the victim.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d2 = done.clone();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::stdin().read_line(&mut s);
        d2.store(true, std::sync::atomic::Ordering::Release);
    });
    let mut calls = std::env::var_os("COURIER_TEST_PROGRESS_CPU").map(|_| CallTimes::default());
    while !done.load(std::sync::atomic::Ordering::Acquire) {
        // Pings are answered after every progress call, as a server answers what arrives:
        // answering only once the worker is idle would let a flooding peer (whose bytes
        // keep a tcp link busy for hundreds of calls in a row) postpone every answer.
        let t0 = calls.as_ref().map(|_| (thread_cpu_ns(), thread_usage()));
        let busy = w.progress() > 0;
        if let (Some(c), Some((t0, u0))) = (calls.as_mut(), t0) {
            c.add(thread_cpu_ns().saturating_sub(t0), || {
                thread_usage().since(u0)
            });
        }
        let replies: Vec<_> = std::mem::take(&mut *queue.lock().unwrap());
        for (ep, data) in replies {
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            if let Ok(mut r) = unsafe { ep.am_send_nb(AM_PONG, b"", &data, AmFlags::default()) } {
                let _ = r.wait_timeout(Duration::from_secs(5));
            }
        }
        if !busy && w.arm().unwrap_or(false) {
            let _ = w.wait(Some(Duration::from_millis(50)));
        }
    }
    if let Some(c) = calls {
        eprintln!("{}", c.line());
    }
    drop(mem);
    0
}

/// A hostile peer: connects to the victim's address and floods (`COURIER_TEST_FLOOD`:
/// tag, stream or get) without ever progressing, until `COURIER_TEST_FLOOD_BYTES` are
/// sent or its endpoint fails; prints `SENT <bytes>`.
fn run_flood() -> i32 {
    let kind = std::env::var("COURIER_TEST_FLOOD").unwrap();
    let var = |k: &str| std::env::var(k).unwrap();
    let total: usize = var("COURIER_TEST_FLOOD_BYTES").parse().unwrap();
    let secs: u64 = var("COURIER_TEST_FLOOD_SECS").parse().unwrap();
    let rounds: usize = var("COURIER_TEST_FLOOD_ROUNDS").parse().unwrap();
    let addr = unhex(&var("COURIER_TEST_ADDR"));
    let ctx = Context::new(ContextParams::default().features(all_features())).unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    // Tag messages small enough to go eagerly on every transport; gets of 32 KiB.
    let chunk = vec![0x5au8; if kind == "tag" { 2 << 10 } else { 32 << 10 }];
    let mut buf = vec![0u8; 32 << 10];
    let mut sent = 0usize;
    let mut failed = 0usize;
    let deadline = Instant::now() + Duration::from_secs(secs);
    // Each round a new connection, flooded until the victim fails it.
    while failed < rounds && sent < total && Instant::now() < deadline {
        let ep = w.connect(&addr, EndpointParams::default()).unwrap();
        if ep.wait_connected(Duration::from_secs(60)).is_err() {
            failed += 1;
            continue;
        }
        match kind.as_str() {
            "tag" | "stream" => {
                while sent < total && Instant::now() < deadline {
                    let r = if kind == "tag" {
                        // SAFETY: the request is waited for, or dropped (which waits), before its
                        // buffer is used again or goes; it is never forgotten.
                        unsafe { ep.tag_send_nb(&chunk, FLOOD_TAG) }
                    } else {
                        // SAFETY: the request is waited for, or dropped (which waits), before its
                        // buffer is used again or goes; it is never forgotten.
                        unsafe { ep.stream_send_nb(&chunk) }
                    };
                    let Ok(mut r) = r else { break };
                    // Waiting for the send to leave progresses the worker, which reads
                    // nothing of the victim but its failure.
                    if r.wait_timeout(Duration::from_secs(30)).is_err() {
                        break;
                    }
                    sent += chunk.len();
                }
            }
            "get" => {
                let key = ep.rkey_unpack(&unhex(&var("COURIER_TEST_RKEY"))).unwrap();
                let base: u64 = var("COURIER_TEST_BASE").parse().unwrap();
                // Through the victim's worker (no single-copy read of its memory).
                assert_eq!(key.path(), "remote", "the gets would not reach the victim");
                // Gets whose answers are never read: no progress while they go out.
                let mut n = 0u32;
                while sent < total && Instant::now() < deadline {
                    let b = Buf::One((buf.as_mut_ptr() as usize, buf.len()));
                    // SAFETY: `buf` lives until the process exits; the answers land in it
                    // only while this process progresses.
                    let r = unsafe { ep.get_raw(b, base, &key, Callback::None) };
                    if r.is_err() {
                        break;
                    }
                    sent += buf.len();
                    n = n.wrapping_add(1);
                    // Progress pushes the requests out (a link coalesces small frames
                    // until then); it also reads some answers, far slower than they are
                    // asked for.
                    if n.is_multiple_of(64) {
                        w.progress();
                        if ep.is_connected().is_err() {
                            break;
                        }
                    }
                }
                // Then no reading at all for a while: the victim answers what it has.
                let t0 = Instant::now();
                while ep.is_connected().is_ok() && t0.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(500));
                    w.progress();
                }
            }
            other => panic!("unknown flood {other}"),
        }
        failed += 1;
        ep.close_force();
    }
    println!("SENT {sent} ROUNDS {failed}");
    std::io::stdout().flush().unwrap();
    // Leave without waiting for requests in flight.
    std::process::exit(0);
}

/// A peer that asks for more than the victim lets answers occupy before it reads them:
/// `COURIER_TEST_GETS` gets of 32 KiB, then no progress for 3 s, then it takes every
/// answer (`flush`) and checks them; prints `GOT <gets> <answers all right>`.
fn run_slow_get() -> i32 {
    let var = |k: &str| std::env::var(k).unwrap();
    let gets: usize = var("COURIER_TEST_GETS").parse().unwrap();
    let ctx = Context::new(ContextParams::default().features(all_features())).unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let ep = w
        .connect(&unhex(&var("COURIER_TEST_ADDR")), EndpointParams::default())
        .unwrap();
    ep.wait_connected(Duration::from_secs(60)).unwrap();
    let key = ep.rkey_unpack(&unhex(&var("COURIER_TEST_RKEY"))).unwrap();
    let base: u64 = var("COURIER_TEST_BASE").parse().unwrap();
    assert_eq!(key.path(), "remote", "the gets would not reach the victim");
    let mut buf = vec![0u8; 32 << 10];
    for n in 0..gets {
        let b = Buf::One((buf.as_mut_ptr() as usize, buf.len()));
        // SAFETY: `buf` lives until the process exits and is read only after `flush`,
        // which waits for every answer.
        unsafe { ep.get_raw(b, base, &key, Callback::None) }.unwrap();
        // The requests go out (a link coalesces small frames until progress).
        if n % 64 == 63 {
            w.progress();
        }
    }
    w.progress();
    println!("PAUSED");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let ok = ep.flush().is_ok() && buf.iter().all(|&b| b == 7);
    println!("GOT {gets} {ok}");
    std::io::stdout().flush().unwrap();
    0
}

/// A peer that posts a receive for a 4 MiB tag message, says READY, then stops calling
/// into Courier (the case of issue 36); the test may also SIGSTOP it.
fn run_stopper() -> i32 {
    let ctx = Context::new(ContextParams::default()).unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    println!("ADDR {}", hex(&w.address().unwrap()));
    std::io::stdout().flush().unwrap();
    let t0 = Instant::now();
    let ep = loop {
        w.progress();
        if let Some(ep) = w.incoming_endpoint() {
            break ep;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "no connection");
    };
    let mut buf = vec![0u8; 4 << 20];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let r = unsafe { w.tag_recv_nb(&mut buf, 1, u64::MAX) }.unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    // Alive, and no longer progressing: until stdin closes.
    let mut s = String::new();
    let _ = std::io::stdin().read_line(&mut s);
    std::mem::forget(r);
    drop(ep);
    0
}

/// An owner of memory for the churn test: maps a region, prints its address and key,
/// keeps progressing until killed.
fn run_owner() -> i32 {
    let ctx = Context::new(ContextParams::default().features(all_features())).unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let mem = ctx.mem_map(MemMapParams::allocate(64 << 10)).unwrap();
    println!("ADDR {}", hex(&w.address().unwrap()));
    println!("RKEY {}", hex(&mem.pack_rkey().unwrap()));
    println!("BASE {}", mem.as_ptr() as u64);
    std::io::stdout().flush().unwrap();
    loop {
        if w.progress() == 0 && w.arm().unwrap_or(false) {
            let _ = w.wait(Some(Duration::from_millis(50)));
        }
    }
}

// ----- parent side -------------------------------------------------------------------------

struct Proc {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Proc {
    fn start(role: &str, env: &[(&str, String)]) -> Proc {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.env("COURIER_TEST_ROLE", role)
            .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn child");
        let out = BufReader::new(child.stdout.take().unwrap());
        Proc { child, out }
    }

    /// The value of the next `KEY value` line.
    fn read(&mut self, key: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.out.read_line(&mut line).unwrap();
            assert!(n > 0, "child ended before printing {key}");
            // The test harness may have started the line ("test child_entry ... ").
            if let Some(i) = line.find(key) {
                return line[i + key.len()..].trim().to_string();
            }
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// End it (closing stdin, then by pid) and return its stderr.
    fn finish(mut self) -> String {
        // SAFETY: signals our own child, by pid (a stopped one goes on, to see stdin close).
        unsafe { libc::kill(self.pid(), libc::SIGCONT) };
        drop(self.child.stdin.take());
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            // SAFETY: signals our own child, by pid.
            unsafe { libc::kill(self.pid(), libc::SIGCONT) };
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        err
    }
}

/// `VmRSS` or `VmHWM` of process `pid`, in bytes.
fn vm(pid: i32, field: &str) -> usize {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with(field)).unwrap();
    let kb: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb << 10
}

/// User plus system CPU time of process `pid`.
fn cpu(pid: i32) -> Duration {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime), counted from the state field (3).
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_nanos(ticks * 1_000_000_000 / hz.max(1))
}

/// How the legitimate client waits for each answer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ClientWait {
    /// Progress its worker in a loop, never giving the CPU away.
    Poll,
    /// As the library's blocking waits do (`courier::Backoff`): spin, yield, then sleep.
    Backoff,
    /// Sleep until its worker has an event.
    Sleep,
}

/// A legitimate client of the victim: round trips of an active message, waiting for each
/// answer as `wait` says.
struct Client {
    wait: ClientWait,
    _ctx: Context,
    w: Worker,
    ep: Endpoint,
    got: Arc<Mutex<usize>>,
}

impl Client {
    fn connect(addr: &[u8], tls: &str) -> Client {
        let ctx = Context::new(ContextParams::default().config("COURIER_TLS", tls)).unwrap();
        let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
        let got: Arc<Mutex<usize>> = Arc::default();
        let g2 = got.clone();
        w.am_set_handler(AM_PONG, move |_m: &mut AmMessage| {
            *g2.lock().unwrap() += 1;
        })
        .unwrap();
        let ep = w.connect(addr, EndpointParams::default()).unwrap();
        let c = Client {
            wait: ClientWait::Poll,
            _ctx: ctx,
            w,
            ep,
            got,
        };
        c.round_trip();
        assert_eq!(c.ep.transport(), Some(tls), "the client's transport");
        c
    }

    /// One round trip; panics if it takes more than 30 s (a hang, not a slow machine).
    fn round_trip(&self) -> Duration {
        let before = *self.got.lock().unwrap();
        let t0 = Instant::now();
        let flags = AmFlags {
            reply: true,
            ..Default::default()
        };
        self.ep.am_send(AM_PING, b"", b"ping", flags).unwrap();
        let mut backoff = courier::Backoff::new();
        while *self.got.lock().unwrap() == before {
            let moved = self.w.progress() > 0;
            match self.wait {
                ClientWait::Poll => {}
                ClientWait::Backoff if moved => backoff.busy(),
                ClientWait::Backoff => backoff.idle(&self.w).unwrap(),
                ClientWait::Sleep => {
                    if !moved && self.w.arm().unwrap_or(false) {
                        let _ = self.w.wait(Some(Duration::from_millis(50)));
                    }
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the legitimate client's round trip hung"
            );
        }
        t0.elapsed()
    }
}

fn victim_env() -> Vec<(&'static str, String)> {
    VICTIM_LIMITS
        .iter()
        .map(|(k, v)| (*k, v.to_string()))
        .collect()
}

/// The flooder's environment: a flood of `kind` over `tls` of at most `bytes`, `secs` and
/// `rounds`, against the victim's address, key and base (as it printed them).
fn flood_env(
    kind: &str,
    tls: &str,
    bytes: usize,
    secs: u64,
    rounds: u64,
    [addr, rkey, base]: [String; 3],
) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("COURIER_TEST_FLOOD", kind.to_string()),
        ("COURIER_TEST_FLOOD_BYTES", bytes.to_string()),
        ("COURIER_TEST_FLOOD_SECS", secs.to_string()),
        ("COURIER_TEST_FLOOD_ROUNDS", rounds.to_string()),
        ("COURIER_TEST_ADDR", addr),
        ("COURIER_TEST_RKEY", rkey),
        ("COURIER_TEST_BASE", base),
        ("COURIER_TLS", tls.to_string()),
    ];
    if kind == "get" {
        // Through the owner, not by single-copy reads of its memory.
        env.push(("COURIER_SHM_CMA", "no".into()));
    }
    env
}

/// A flood of `kind` over `tls` against a victim with a small budget: the victim's peak
/// RSS stays within idle + `bound_mib`, it names the limit, and a legitimate client's
/// round trips go on during and after it.
fn flood(kind: &str, tls: &str, var: &str, bound_mib: usize) {
    let mut victim = Proc::start("victim", &victim_env());
    let addr = victim.read("ADDR");
    let rkey = victim.read("RKEY");
    let base = victim.read("BASE");
    let client = Client::connect(&unhex(&addr), tls);
    let idle = vm(victim.pid(), "VmRSS:");
    // A flood of up to 512 MiB over 3 connections in turn: without limits the victim
    // would keep most of it.
    let env = flood_env(kind, tls, 512 << 20, 60, 3, [addr, rkey, base]);
    let mut flooder = Proc::start("flood", &env);
    // Round trips while it floods.
    let mut trips = 0;
    let t0 = Instant::now();
    while !matches!(flooder.child.try_wait(), Ok(Some(_))) {
        client.round_trip();
        trips += 1;
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the flooder did not end"
        );
    }
    let sent = flooder.read("SENT");
    let flood_err = flooder.finish();
    client.round_trip();
    let peak = vm(victim.pid(), "VmHWM:");
    let err = victim.finish();
    let grew = peak.saturating_sub(idle) >> 20;
    eprintln!(
        "{kind} flood over {tls}: {sent} bytes sent, victim idle {} MiB, peak +{grew} MiB, {trips} round trips meanwhile",
        idle >> 20
    );
    assert!(
        grew <= bound_mib,
        "the victim's RSS grew by {grew} MiB under a {kind} flood over {tls}, more than {bound_mib} MiB; victim said:\n{err}\nflooder said:\n{flood_err}"
    );
    assert!(
        err.contains(var),
        "the victim did not name {var} when the {kind} flood over {tls} reached it:\n{err}\nflooder said:\n{flood_err}"
    );
}

#[test]
fn flood_unexpected_tags_shm() {
    flood("tag", "shm", "COURIER_MAX_UNEXPECTED_EP", 48);
}

#[test]
fn flood_unexpected_tags_tcp() {
    flood("tag", "tcp", "COURIER_MAX_UNEXPECTED_EP", 48);
}

#[test]
fn flood_stream_bytes_shm() {
    flood("stream", "shm", "COURIER_MAX_STREAM_EP", 48);
}

#[test]
fn flood_stream_bytes_tcp() {
    flood("stream", "tcp", "COURIER_MAX_STREAM_EP", 48);
}

#[test]
fn flood_unanswered_gets_shm() {
    flood("get", "shm", "COURIER_MAX_REPLY_QUEUE", 48);
}

#[test]
fn flood_unanswered_gets_tcp() {
    // Answers enter the tcp link's own send queue (up to 64 MiB,
    // `transport::tcp::HIGH_WATER`) only while it holds less than COURIER_MAX_REPLY_QUEUE.
    flood("get", "tcp", "COURIER_MAX_REPLY_QUEUE", 48);
}

/// A peer that asks for 96 MiB of gets, reads nothing for a while, then reads: answers
/// wait for it in the victim (a tcp link holding at most COURIER_MAX_REPLY_QUEUE of them,
/// the rest as entries whose data stays in the region, instead of filling the link's
/// 64 MiB queue; over shm, as many as its FIFO holds); the endpoint is not failed, every
/// answer arrives and is right, the victim sleeps while the peer does not read, and a
/// legitimate client's round trips go on meanwhile.
#[test]
fn slow_reader_gets_answers_with_bounded_memory_tcp() {
    slow_reader("tcp");
}

#[test]
fn slow_reader_gets_answers_with_bounded_memory_shm() {
    slow_reader("shm");
}

fn slow_reader(tls: &str) {
    // Its 3 s without reading are not taken for a hung peer (the keepalive test's case).
    let mut env = victim_env();
    env.push(("COURIER_KEEPALIVE_TIMEOUT", "30s".into()));
    let mut victim = Proc::start("victim", &env);
    let addr = victim.read("ADDR");
    let rkey = victim.read("RKEY");
    let base = victim.read("BASE");
    let client = Client::connect(&unhex(&addr), tls);
    let idle = vm(victim.pid(), "VmRSS:");
    let gets = 3072;
    let mut reader = Proc::start(
        "slowget",
        &[
            ("COURIER_TEST_GETS", gets.to_string()),
            ("COURIER_TEST_ADDR", addr),
            ("COURIER_TEST_RKEY", rkey),
            ("COURIER_TEST_BASE", base),
            ("COURIER_TLS", tls.to_string()),
            // Through the victim's worker (no single-copy read of its memory).
            ("COURIER_SHM_CMA", "no".to_string()),
        ],
    );
    // While the reader does not read, the victim has answers it cannot send: it sleeps
    // until the socket has room, spending next to no CPU (it used to spin a whole CPU
    // until the peer read). Measured over 2 s with a round trip every 10 ms.
    reader.read("PAUSED");
    let (c0, t0) = (cpu(victim.pid()), Instant::now());
    let mut trips = 0;
    while t0.elapsed() < Duration::from_secs(2) {
        client.round_trip();
        trips += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    let (spent, window) = (cpu(victim.pid()) - c0, t0.elapsed());
    while !matches!(reader.child.try_wait(), Ok(Some(_))) {
        client.round_trip();
        trips += 1;
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the slow reader did not end"
        );
    }
    let got = reader.read("GOT");
    let reader_err = reader.finish();
    client.round_trip();
    let peak = vm(victim.pid(), "VmHWM:");
    let err = victim.finish();
    let grew = peak.saturating_sub(idle) >> 20;
    eprintln!(
        "slow reader over {tls}: {gets} gets of 32 KiB, victim idle {} MiB, peak +{grew} MiB, {trips} round trips meanwhile, victim CPU {spent:?} in {window:?} while the reader paused",
        idle >> 20
    );
    assert!(
        spent < window / 4,
        "the victim spent {spent:?} of CPU in {window:?} holding answers for a peer that did not read them"
    );
    assert_eq!(
        got,
        format!("{gets} true"),
        "the slow reader did not get every answer right; victim said:\n{err}\nreader said:\n{reader_err}"
    );
    assert!(
        !err.contains("COURIER_MAX_REPLY_QUEUE"),
        "the victim failed a peer that reads its answers late:\n{err}"
    );
    // 96 MiB asked, COURIER_MAX_REPLY_QUEUE=1m: the link's queue holds about 1 MiB, the
    // kernel's socket buffers a few more, the waiting entries well under 1 MiB.
    assert!(
        grew <= 32,
        "the victim's RSS grew by {grew} MiB holding answers for a slow reader; victim said:\n{err}"
    );
}

/// Many connections that connect and say nothing: the victim, asleep, spends no CPU on
/// them, keeps at most COURIER_MAX_CONNECTING of them, and a legitimate client connects
/// and round-trips meanwhile.
#[test]
fn idle_connections_in_setup_cost_no_cpu() {
    let mut env = victim_env();
    env.push(("COURIER_MAX_CONNECTING", "64".into()));
    let mut victim = Proc::start("victim", &env);
    let addr = victim.read("ADDR");
    let port: u16 = victim.read("PORT").parse().unwrap();
    let mut idle = Vec::new();
    for _ in 0..200 {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => idle.push(s),
            Err(e) => panic!("connect to the victim's listener: {e}"),
        }
    }
    // Let the victim accept them all, then measure its CPU over a window.
    std::thread::sleep(Duration::from_millis(500));
    let c0 = cpu(victim.pid());
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let spent = cpu(victim.pid()) - c0;
    let window = t0.elapsed();
    let client = Client::connect(&unhex(&addr), "tcp");
    let rtt = client.round_trip();
    let open = std::fs::read_dir(format!("/proc/{}/fd", victim.pid()))
        .unwrap()
        .count();
    drop(idle);
    let err = victim.finish();
    eprintln!(
        "200 idle connections: victim CPU {spent:?} over {window:?}, {open} descriptors open, a round trip {rtt:?}"
    );
    // Asleep with nothing to do: well under a tenth of the window even on a busy machine.
    assert!(
        spent < window / 10,
        "200 idle connections in setup cost the victim {spent:?} of CPU over {window:?}:\n{err}"
    );
    assert!(
        open < 150,
        "the victim holds {open} descriptors: more than COURIER_MAX_CONNECTING=64 connections in setup kept"
    );
    assert!(
        err.contains("COURIER_MAX_CONNECTING"),
        "the victim did not say why it dropped connections:\n{err}"
    );
}

/// A peer that posted its receive and then stopped progressing (issue 36), or was
/// stopped by SIGSTOP: the sender's wait ends with an error that names the peer and says
/// it is not progressing, within the keepalive timeout (1 s here; 15 s allowed).
fn silent_peer(tls: &str, sigstop: bool) {
    let mut peer = Proc::start("stopper", &[("COURIER_TLS", tls.to_string())]);
    let addr = unhex(&peer.read("ADDR"));
    let ctx = Context::new(
        ContextParams::default()
            .config("COURIER_TLS", tls)
            .config("COURIER_KEEPALIVE_INTERVAL", "1s")
            .config("COURIER_KEEPALIVE_TIMEOUT", "1s"),
    )
    .unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let ep = w.connect(&addr, EndpointParams::default()).unwrap();
    ep.wait_connected(Duration::from_secs(30)).unwrap();
    assert_eq!(ep.transport(), Some(tls));
    assert_eq!(peer.read("READY"), "");
    if sigstop {
        // SAFETY: signals our own child, by pid.
        assert_eq!(unsafe { libc::kill(peer.pid(), libc::SIGSTOP) }, 0);
    }
    let data = vec![1u8; 4 << 20];
    let t0 = Instant::now();
    // A synchronous send needs the peer to match it, whatever the link buffers.
    let r = ep.tag_send_sync(&data, 1);
    let took = t0.elapsed();
    let err = peer.finish();
    let e = r.expect_err("a send to a peer that does not progress completed");
    assert_eq!(e.status(), Status::PeerFailure, "{e}");
    let name = ep.peer();
    assert!(
        e.detail().contains("not progressing") && e.detail().contains(&name),
        "the error does not name the peer and say it is not progressing: {e}"
    );
    assert!(
        took < Duration::from_secs(15),
        "the wait took {took:?} with COURIER_KEEPALIVE_TIMEOUT=1s"
    );
    // The endpoint is failed: a flush says so at once.
    let f = ep.flush().expect_err("flush of a failed endpoint");
    assert_eq!(f.status(), Status::PeerFailure, "{f}");
    eprintln!("silent peer over {tls} (sigstop {sigstop}): failed after {took:?}: {e}\n{err}");
}

#[test]
fn silent_peer_fails_send_shm() {
    silent_peer("shm", false);
}

#[test]
fn silent_peer_fails_send_tcp() {
    silent_peer("tcp", false);
}

#[test]
fn stopped_peer_fails_send_shm() {
    silent_peer("shm", true);
}

#[test]
fn stopped_peer_fails_send_tcp() {
    silent_peer("tcp", true);
}

/// The issue-36 case with a plain (not synchronous) 4 MiB send over shared memory.
#[test]
fn silent_peer_fails_rendezvous_send_shm() {
    let mut peer = Proc::start("stopper", &[("COURIER_TLS", "shm".into())]);
    let addr = unhex(&peer.read("ADDR"));
    let ctx = Context::new(
        ContextParams::default()
            .config("COURIER_TLS", "shm")
            .config("COURIER_KEEPALIVE_INTERVAL", "1s")
            .config("COURIER_KEEPALIVE_TIMEOUT", "2s"),
    )
    .unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let ep = w.connect(&addr, EndpointParams::default()).unwrap();
    ep.wait_connected(Duration::from_secs(30)).unwrap();
    peer.read("READY");
    let data = vec![1u8; 4 << 20];
    let t0 = Instant::now();
    let r = ep.tag_send(&data, 1);
    let took = t0.elapsed();
    let err = peer.finish();
    let e = r.expect_err("a 4 MiB send to a peer that does not progress completed");
    assert_eq!(e.status(), Status::PeerFailure, "{e}");
    assert!(e.detail().contains("not progressing"), "{e}");
    assert!(took < Duration::from_secs(20), "took {took:?}\n{err}");
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn map_count() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count()
}

/// Peers that map memory, are reached one-sidedly (this process maps their key table and
/// segment), then die: this process's descriptors and mappings do not grow with them.
#[test]
fn peer_churn_releases_descriptors_and_maps() {
    let ctx = Context::new(
        ContextParams::default()
            .features(all_features())
            .config("COURIER_TLS", "shm"),
    )
    .unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let mut counts = Vec::new();
    for round in 0..12 {
        let mut owner = Proc::start("owner", &[("COURIER_TLS", "shm".into())]);
        let addr = unhex(&owner.read("ADDR"));
        let rkey = unhex(&owner.read("RKEY"));
        let base: u64 = owner.read("BASE").parse().unwrap();
        let failed = Arc::new(Mutex::new(false));
        let f2 = failed.clone();
        let ep = w
            .connect(
                &addr,
                EndpointParams::default().error_handler(move |_| *f2.lock().unwrap() = true),
            )
            .unwrap();
        ep.wait_connected(Duration::from_secs(30)).unwrap();
        {
            let key = ep.rkey_unpack(&rkey).unwrap();
            let mut buf = [0u8; 64];
            ep.get(&mut buf, base, &key).unwrap();
            ep.flush().unwrap();
        }
        // SAFETY: kills our own child, by pid.
        unsafe { libc::kill(owner.pid(), libc::SIGKILL) };
        let _ = owner.child.wait();
        let t0 = Instant::now();
        while !*failed.lock().unwrap() {
            w.progress();
            assert!(t0.elapsed() < Duration::from_secs(30), "peer death unseen");
        }
        drop(ep);
        let _ = owner.finish();
        counts.push((round, fd_count(), map_count()));
    }
    eprintln!("(round, fds, maps): {counts:?}");
    let (_, fd2, map2) = counts[2];
    let (_, fd_end, map_end) = counts[counts.len() - 1];
    // A peer whose exit was seen after its link's hangup is released by the next
    // failure: one peer's worth of slack, no growth with the number of peers.
    assert!(
        fd_end <= fd2 + 3,
        "descriptors grew with peer churn: {counts:?}"
    );
    assert!(
        map_end <= map2 + 4,
        "mappings grew with peer churn: {counts:?}"
    );
}

#[test]
fn child_entry() {
    // The entry point children run; as a plain test it does nothing.
    child_main();
}
