//! What the job tests share: a rank program (this test binary, re-entered with a role in
//! `COURIER_TEST_JOB_ROLE`), its checks, and the process-table check for orphans.
#![allow(dead_code)]

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use courier::{Context, ContextParams, Job, JobWorld, Worker, WorkerParams};

/// The arguments that re-enter this test binary as a rank.
pub fn rank_args() -> Vec<String> {
    vec![
        std::env::current_exe()
            .expect("test binary path")
            .to_string_lossy()
            .into_owned(),
        "--exact".into(),
        "rank_entry".into(),
        "--nocapture".into(),
        "--test-threads=1".into(),
    ]
}

fn say(line: &str) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{line}");
    let _ = o.flush();
}

const T: Duration = Duration::from_secs(60);

fn seed(src: u32, dst: u32, i: usize) -> u8 {
    (src as usize * 131 + dst as usize * 7 + i * 31) as u8
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A rank of a job under `courier run` (so with the job's key, and no configuration):
/// a process outside the job, on this host, without the key, connects to this rank's
/// worker and sends it a message. The rank must refuse it: the message never arrives, the
/// outsider's endpoint fails. Prints `OUTSIDER REFUSED` and exits 0.
fn refuse_outsider(job: &Job) {
    let ctx = Context::new(ContextParams::default()).expect("context");
    let w = Worker::new(&ctx, WorkerParams::default()).expect("worker");
    let mut b = [0u8; 8];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut rx = unsafe { w.tag_recv_nb(&mut b, 0x0b5, u64::MAX) }.expect("recv");
    let args = rank_args();
    let mut c = std::process::Command::new(&args[0]);
    c.args(&args[1..])
        .env("COURIER_TEST_JOB_ROLE", "outsider")
        .env("COURIER_TEST_ADDR", hex(&w.address().expect("address")))
        .env_remove(courier::job::runwire::ENV_FD)
        .stdout(std::process::Stdio::piped());
    let mut child = c.spawn().expect("spawn the outsider");
    let mut status = None;
    w.progress_until(T, || {
        status = child.try_wait().expect("wait for the outsider");
        status.is_some() || rx.test().is_some()
    })
    .expect("the outsider did not end in time");
    assert!(
        rx.test().is_none(),
        "the outsider's message reached rank {}",
        job.rank()
    );
    let out = child.wait_with_output().expect("outsider output");
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(status.is_some_and(|s| s.success()), "outsider: {out}");
    assert!(out.contains("OUTSIDER FAILED"), "outsider: {out}");
    say("OUTSIDER REFUSED");
    std::process::exit(0);
}

/// The outsider: no launcher, no key (`COURIER_AUTH=auto`); connects to the address in
/// `COURIER_TEST_ADDR`, sends, and prints how its endpoint failed.
fn outsider() -> ! {
    let a = std::env::var("COURIER_TEST_ADDR").expect("COURIER_TEST_ADDR");
    let addr: Vec<u8> = (0..a.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&a[i..i + 2], 16).expect("hex"))
        .collect();
    let ctx = Context::new(ContextParams::default()).expect("context");
    let w = Worker::new(&ctx, WorkerParams::default()).expect("worker");
    let failed = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let f2 = failed.clone();
    let params = courier::EndpointParams::default().error_handler(move |e: &courier::Error| {
        *f2.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
    });
    let ep = w.connect(&addr, params).expect("connect");
    let b = 1u64.to_le_bytes();
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let r = unsafe { ep.tag_send_nb(&b, 0x0b5) }.expect("send");
    let _ = w.progress_until(T, || {
        failed.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    });
    drop(r);
    match failed.lock().unwrap_or_else(|p| p.into_inner()).clone() {
        Some(e) => say(&format!("OUTSIDER FAILED {e}")),
        None => say("OUTSIDER CONNECTED"),
    }
    std::process::exit(0);
}

/// Ring and all-to-all with every byte checked, lazily then eagerly; the auth key compared
/// across ranks. Prints `RANK r/n OK` and exits 0.
fn ring(job: &Job) {
    let (r, n) = (job.rank(), job.size());
    let key = job.auth_key().expect("auth key");
    if r == 0 {
        job.put("test.key", &key).expect("put key");
    }
    let ctx = Context::new(ContextParams::default()).expect("context");
    let w = Worker::new(&ctx, WorkerParams::default()).expect("worker");
    let world = JobWorld::new(job, &w).expect("world");
    let k0 = job.get(0, "test.key", T).expect("get key");
    assert_eq!(k0, key, "rank {r}: the auth key differs from rank 0's");
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let len = 5000;
    let out: Vec<u8> = (0..len).map(|i| seed(r, right, i)).collect();
    let mut inb = vec![0u8; len];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let rx = unsafe { w.tag_recv_nb(&mut inb, 100 + left as u64, u64::MAX) }.expect("recv");
    let ep = world.endpoint(right).expect("endpoint");
    ep.tag_send(&out, 100 + r as u64).expect("send wait");
    rx.wait().expect("ring recv");
    assert!(
        inb.iter().enumerate().all(|(i, &b)| b == seed(left, r, i)),
        "rank {r}: ring data from {left} differs"
    );
    assert_eq!(
        world.connected(),
        1,
        "lazy wire-up made more than one endpoint"
    );
    world.barrier(T).expect("barrier after ring");
    world.connect_all().expect("connect all");
    assert_eq!(world.connected(), n as usize);
    let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; len]).collect();
    let mut rxs = Vec::new();
    for (p, b) in bufs.iter_mut().enumerate() {
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        rxs.push(unsafe { w.tag_recv_nb(b, 200 + p as u64, u64::MAX) }.expect("recv"));
    }
    let outs: Vec<Vec<u8>> = (0..n)
        .map(|p| (0..len).map(|i| seed(r, p, i) ^ 0x5a).collect())
        .collect();
    let mut sends = Vec::new();
    for p in 0..n {
        let ep = world.endpoint(p).expect("endpoint");
        sends.push(
            // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
            // used again or goes; it is never forgotten.
            unsafe { ep.tag_send_nb(&outs[p as usize], 200 + r as u64) }.expect("send"),
        );
    }
    for s in sends {
        s.wait().expect("all-to-all send");
    }
    for rx in rxs {
        rx.wait().expect("all-to-all recv");
    }
    for (p, b) in bufs.iter().enumerate() {
        assert!(
            b.iter()
                .enumerate()
                .all(|(i, &x)| x == seed(p as u32, r, i) ^ 0x5a),
            "rank {r}: all-to-all data from {p} differs"
        );
    }
    world.barrier(T).expect("final barrier");
    say(&format!(
        "RANK {r}/{n} OK local {}/{} host {} via {}",
        job.local_rank(),
        job.local_size(),
        job.host_id(),
        job.launcher().name()
    ));
}

/// The rank side of every job test; returns without doing anything outside a job test.
pub fn rank_main() {
    let Ok(role) = std::env::var("COURIER_TEST_JOB_ROLE") else {
        return;
    };
    say(&format!("PID {}", std::process::id()));
    let victim: u32 = std::env::var("COURIER_TEST_JOB_VICTIM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let env_rank: Option<u32> = [
        "PMI_RANK",
        "PMIX_RANK",
        "SLURM_PROCID",
        "OMPI_COMM_WORLD_RANK",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.parse().ok());
    match role.as_str() {
        "outsider" => outsider(),
        "die-before-init" if env_rank == Some(victim) => std::process::exit(5),
        "kill-before-init" if env_rank == Some(victim) => {
            // SAFETY: raise has no memory arguments.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        _ => {}
    }
    let job = Job::init().unwrap_or_else(|e| {
        say(&format!("INIT FAILED {e}"));
        // A launcher that ends the whole job when the first rank exits (hydra's
        // auto-cleanup) can do so before it forwards what that rank wrote last: give it
        // the time to, so that the line the tests look for is not lost.
        std::thread::sleep(Duration::from_millis(500));
        std::process::exit(3);
    });
    let r = job.rank();
    match role.as_str() {
        "ring" | "die-before-init" | "kill-before-init" => ring(&job),
        "refuse-outsider" => refuse_outsider(&job),
        "abort" => {
            job.barrier(T).expect("barrier");
            if r == victim {
                let code = std::env::var("COURIER_TEST_ABORT_CODE")
                    .ok()
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(7);
                job.abort(code, "the test's abort");
            }
            // The others stay busy (as ranks computing or blocked in communication
            // would) until the abort ends them. Not in a launcher fence: Open MPI 4.1's
            // mpirun crashes or hangs finalizing its PMIx server when an abort meets a
            // fence in flight (its own MPI_Abort, whose ranks wait in the BTL, does not).
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(120) {
                std::thread::sleep(Duration::from_millis(50));
            }
            say("SURVIVED ABORT: not ended within 120 s");
            std::process::exit(0);
        }
        "fence-missing" => {
            if r == victim {
                // Never joins: sleeps until the launcher ends it.
                std::thread::sleep(Duration::from_secs(300));
                std::process::exit(0);
            }
            let t = Instant::now();
            match job.fence(Duration::from_secs(2)) {
                Ok(()) => say("FENCE PASSED"),
                Err(e) => say(&format!("FENCE FAILED after {:?}: {e}", t.elapsed())),
            }
            std::process::exit(4);
        }
        "exit-early" => {
            // The victim leaves with status 0 before the fence: the others must not hang.
            if r == victim {
                std::process::exit(0);
            }
            match job.fence(Duration::from_secs(60)) {
                Ok(()) => say("FENCE PASSED"),
                Err(e) => say(&format!("FENCE FAILED: {e}")),
            }
            std::process::exit(4);
        }
        "info" => {
            say(&format!(
                "INFO rank {r} size {} local {}/{} host {} via {}",
                job.size(),
                job.local_rank(),
                job.local_size(),
                job.host_id(),
                job.launcher().name()
            ));
            job.barrier(T).expect("barrier");
        }
        other => panic!("unknown job role {other}"),
    }
    std::process::exit(0);
}

/// The PIDs ranks printed (`PID n` lines).
pub fn pids(out: &str) -> Vec<i32> {
    out.lines()
        .filter_map(|l| l.split("PID ").nth(1)?.trim().parse().ok())
        .collect()
}

/// Processes of `pids` still alive (not zombies), after waiting up to `limit` for them to
/// go: what a launcher left behind.
pub fn survivors(pids: &[i32], limit: Duration) -> Vec<i32> {
    let t = Instant::now();
    loop {
        let alive: Vec<i32> = pids
            .iter()
            .copied()
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .ok()
                    .and_then(|s| {
                        let state = s.rsplit(')').next()?.split_whitespace().next()?.to_string();
                        Some(state != "Z")
                    })
                    .unwrap_or(false)
            })
            .collect();
        if alive.is_empty() || t.elapsed() > limit {
            return alive;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether the environment can run a test that needs `what`: in CI a missing piece fails
/// the test; elsewhere it prints SKIPPED and the test returns.
pub fn require(ok: bool, test: &str, why: &str) -> bool {
    if ok {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false") {
        panic!("{test}: cannot run in CI: {why}");
    }
    eprintln!("SKIPPED: {test}: {why}");
    false
}

/// Run a launcher (`what` names it in messages) and collect its output, as
/// `Command::output` does, but end it if it runs past [`LAUNCH_DEADLINE`]: the launcher
/// leads its own process group, and a hung one is killed with everything it started in
/// that group instead of holding the test (and CI) forever. The output then ends with a
/// line saying so, and the status is the kill's.
pub fn output_within(c: &mut Command, what: &str) -> Output {
    c.process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t = Instant::now();
    let mut child = c.spawn().expect("run the launcher");
    let pid = child.id() as libc::pid_t;
    let (mut so, mut se) = (
        child.stdout.take().expect("piped"),
        child.stderr.take().expect("piped"),
    );
    let out = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = std::io::Read::read_to_end(&mut so, &mut b);
        b
    });
    let err = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = std::io::Read::read_to_end(&mut se, &mut b);
        b
    });
    let mut hung = false;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for the launcher") {
            break s;
        }
        if t.elapsed() > LAUNCH_DEADLINE {
            hung = true;
            // SAFETY: signals the process group this function made (the launcher's pid).
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            break child.wait().expect("wait for the killed launcher");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = err.join().unwrap_or_default();
    if hung {
        stderr.extend_from_slice(
            format!("\n[test: {what} hung for {LAUNCH_DEADLINE:?}; killed]\n").as_bytes(),
        );
    }
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr,
    }
}

/// How long a launcher may run before the test ends it (a hang, not a slow machine).
pub const LAUNCH_DEADLINE: Duration = Duration::from_secs(180);
