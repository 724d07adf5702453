//! `courier run`: jobs of N ranks on one host, their exchange (Courier's protocol and PMI-1),
//! output and input forwarding, signals, and every failure: each a clear message, mpirun's
//! exit status, no hang, and no process left behind (checked in the process table).

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::job::{pids, rank_args, rank_main, survivors};

#[test]
fn rank_entry() {
    rank_main();
}

/// `courier run ARGS... <this binary as a rank>` with `role`; output and wall time.
fn run_ranks(args: &[&str], role: &str, env: &[(&str, &str)]) -> (Output, Duration) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_courier"));
    c.arg("run").args(args).args(rank_args());
    c.env("COURIER_TEST_JOB_ROLE", role).stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let t = Instant::now();
    let o = c.output().expect("run courier run");
    (o, t.elapsed())
}

fn run_cmd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_courier"))
        .arg("run")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run courier run")
}

fn texts(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn assert_no_orphans(out: &str, what: &str) {
    let p = pids(out);
    assert!(!p.is_empty(), "{what}: no rank printed its pid:\n{out}");
    let left = survivors(&p, Duration::from_secs(5));
    assert!(left.is_empty(), "{what}: processes left behind: {left:?}");
}

fn check_ring(n: usize, launcher: &str, env: &[(&str, &str)]) {
    let (o, t) = run_ranks(&["-n", &n.to_string()], "ring", env);
    let (out, err) = texts(&o);
    assert!(
        o.status.success(),
        "n={n} {launcher}: {:?}\n{out}\n{err}",
        o.status
    );
    for r in 0..n {
        let want = format!("RANK {r}/{n} OK local {r}/{n} host 0 via {launcher}");
        assert!(out.contains(&want), "n={n}: no '{want}':\n{out}\n{err}");
    }
    eprintln!("courier run -n {n} ({launcher}): ring and all-to-all in {t:?}");
}

#[test]
fn ring_and_all_to_all_under_courier_run() {
    for n in [1, 2, 4, 8] {
        check_ring(n, "courier run", &[]);
    }
}

/// A job under courier run is authenticated with no configuration: a process outside it
/// (no key) that connects to a rank is refused, and the rank's log says why.
#[test]
fn a_process_outside_the_job_is_refused() {
    let (o, _) = run_ranks(&["-n", "1"], "refuse-outsider", &[]);
    let (out, err) = texts(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("OUTSIDER REFUSED"), "{out}\n{err}");
    assert!(
        err.contains("dropped connection from") && err.contains("did not authenticate"),
        "{err}"
    );
}

/// The same program speaking PMI-1 to courier run (as MPICH programs do).
#[test]
fn ring_and_all_to_all_over_pmi1() {
    for n in [1, 2, 4, 8] {
        check_ring(n, "pmi1", &[("COURIER_JOB_LAUNCHER", "pmi1")]);
    }
}

#[test]
fn without_a_launcher_a_program_is_a_job_of_one() {
    let o = Command::new(&rank_args()[0])
        .args(&rank_args()[1..])
        .env("COURIER_TEST_JOB_ROLE", "info")
        .env("COURIER_LOG_LEVEL", "info")
        .env_remove("PMI_FD")
        .env_remove("PMIX_NAMESPACE")
        .output()
        .expect("run rank");
    let (out, err) = texts(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(
        out.contains("INFO rank 0 size 1 local 0/1 host 0 via single"),
        "{out}"
    );
    assert!(
        err.contains("job of one (rank 0 of 1)"),
        "no log line:\n{err}"
    );
}

#[test]
fn a_rank_that_exits_nonzero_before_the_exchange_ends_the_job() {
    let (o, t) = run_ranks(&["-n", "4"], "die-before-init", &[]);
    let (out, err) = texts(&o);
    assert_eq!(o.status.code(), Some(5), "{out}\n{err}");
    assert!(
        err.contains("Rank:         1") && err.contains("Exit code:    5"),
        "{err}"
    );
    assert!(err.contains("PID:"), "{err}");
    assert!(t < Duration::from_secs(60), "took {t:?}");
    assert_no_orphans(&out, "exit before the exchange");
}

#[test]
fn a_rank_killed_by_a_signal_ends_the_job_with_128_plus_the_signal() {
    let (o, _) = run_ranks(&["-n", "3"], "kill-before-init", &[]);
    let (out, err) = texts(&o);
    assert_eq!(o.status.code(), Some(137), "{out}\n{err}");
    assert!(
        err.contains("process rank 1 with PID") && err.contains("exited on signal 9"),
        "{err}"
    );
    assert_no_orphans(&out, "killed rank");
}

#[test]
fn a_fence_that_one_rank_never_joins_times_out_naming_it() {
    let (o, t) = run_ranks(
        &["-n", "3"],
        "fence-missing",
        &[("COURIER_TEST_JOB_VICTIM", "2")],
    );
    let (out, err) = texts(&o);
    assert_eq!(o.status.code(), Some(4), "{out}\n{err}");
    // Ranks 0 and 1 each time out 2 s after they joined. The first to exit
    // with 4 ends the job, as under mpirun, so the other may be killed
    // before its own deadline when it joined later: one or two lines.
    let failed: Vec<&str> = out.lines().filter(|l| l.contains("FENCE FAILED")).collect();
    assert!((1..=2).contains(&failed.len()), "{out}");
    for l in failed {
        assert!(l.contains("did not join it: 2 (pid"), "{l}");
        assert!(l.contains("1 of 3 ranks"), "{l}");
    }
    assert!(t < Duration::from_secs(60), "took {t:?}");
    assert_no_orphans(&out, "fence never joined");
}

#[test]
fn a_rank_that_leaves_before_a_fence_fails_it_at_once() {
    let (o, t) = run_ranks(
        &["-n", "3"],
        "exit-early",
        &[("COURIER_TEST_JOB_VICTIM", "0")],
    );
    let (out, err) = texts(&o);
    assert_eq!(o.status.code(), Some(4), "{out}\n{err}");
    assert!(
        out.contains("FENCE FAILED") && out.contains("rank 0 (pid") && out.contains("left the job"),
        "{out}"
    );
    assert!(t < Duration::from_secs(30), "the fence waited {t:?}");
    assert_no_orphans(&out, "early exit");
}

#[test]
fn abort_from_one_rank_ends_every_rank() {
    let (o, t) = run_ranks(&["-n", "4"], "abort", &[]);
    let (out, err) = texts(&o);
    assert_eq!(o.status.code(), Some(7), "{out}\n{err}");
    assert!(err.contains("Job::abort was invoked on rank 1"), "{err}");
    assert!(err.contains("the test's abort"), "{err}");
    assert!(!out.contains("SURVIVED"), "{out}");
    assert!(t < Duration::from_secs(60), "took {t:?}");
    assert_no_orphans(&out, "abort");
}

/// An abort with code 0 (what `shmem_global_exit(0)` makes) still ends every rank, and
/// the job's status is 0, as mpirun's and Hydra's are.
#[test]
fn abort_with_code_0_ends_every_rank_and_the_job_succeeds() {
    let (o, t) = run_ranks(&["-n", "3"], "abort", &[("COURIER_TEST_ABORT_CODE", "0")]);
    let (out, err) = texts(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    assert!(
        err.contains("Job::abort was invoked on rank 1") && err.contains("errorcode 0"),
        "{err}"
    );
    assert!(!out.contains("SURVIVED"), "{out}");
    assert!(t < Duration::from_secs(60), "took {t:?}");
    assert_no_orphans(&out, "abort with 0");
}

#[test]
fn bad_command_lines_are_clear_errors() {
    let o = run_cmd(&["-n", "0", "true"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        texts(&o).1.contains("-n 0: a job needs at least one rank"),
        "{:?}",
        texts(&o)
    );
    let o = run_cmd(&["-n", "2"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(texts(&o).1.contains("no program to run"));
    let o = run_cmd(&["-n", "2", "/nonexistent/courier-test-program"]);
    let (_, err) = texts(&o);
    assert_eq!(o.status.code(), Some(132), "{err}");
    assert!(
        err.contains("Executable: /nonexistent/courier-test-program"),
        "{err}"
    );
    let dir = std::env::temp_dir().join(format!("courier-run-noexec-{}", std::process::id()));
    std::fs::write(&dir, "#!/bin/sh\n").unwrap();
    let o = run_cmd(&["-n", "1", dir.to_str().unwrap()]);
    let _ = std::fs::remove_file(&dir);
    let (_, err) = texts(&o);
    assert_eq!(o.status.code(), Some(132), "{err}");
    assert!(err.contains("not executable"), "{err}");
    let o = run_cmd(&["-n", "1", "-x", "COURIER_TEST_SURELY_UNSET_VAR", "true"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(texts(&o).1.contains("is not set"), "{:?}", texts(&o));
}

#[test]
fn a_launcher_protocol_violation_ends_the_job() {
    let t = Instant::now();
    let o = run_cmd(&[
        "-n",
        "2",
        "sh",
        "-c",
        "echo PID $$; if [ $COURIER_RUN_RANK = 1 ]; then printf 'GARBAGE!' >&$COURIER_RUN_FD; fi; exec sleep 60",
    ]);
    let (out, err) = texts(&o);
    assert_eq!(o.status.code(), Some(1), "{out}\n{err}");
    assert!(
        err.contains("rank 1 with PID") && err.contains("broke the launcher protocol"),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(30));
    assert_no_orphans(&out, "protocol violation");
}

#[test]
fn timeout_ends_the_job_with_110() {
    let t = Instant::now();
    let o = run_cmd(&[
        "-n",
        "2",
        "--timeout",
        "1",
        "sh",
        "-c",
        "echo PID $$; exec sleep 60",
    ]);
    let (out, err) = texts(&o);
    assert_eq!(o.status.code(), Some(110), "{err}");
    assert!(err.contains("Timeout: 1 seconds"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(20));
    assert_no_orphans(&out, "timeout");
}

/// SIGTERM and SIGINT to courier run reach every rank; it exits with 128 + the signal.
#[test]
fn signals_are_forwarded_to_every_rank() {
    for (sig, code) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
        let mut c = Command::new(env!("CARGO_BIN_EXE_courier"))
            .args(["run", "-n", "3", "sh", "-c", "echo PID $$; exec sleep 60"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let mut r = BufReader::new(c.stdout.take().unwrap());
        let mut seen = String::new();
        while pids(&seen).len() < 3 {
            let mut l = String::new();
            assert!(
                r.read_line(&mut l).unwrap() > 0,
                "ranks did not start:\n{seen}"
            );
            seen.push_str(&l);
        }
        // SAFETY: kill has no memory arguments; the pid is our child's.
        unsafe { libc::kill(c.id() as i32, sig) };
        let t = Instant::now();
        let st = c.wait().unwrap();
        let mut err = String::new();
        c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert_eq!(st.code(), Some(code), "signal {sig}: {err}");
        assert!(t.elapsed() < Duration::from_secs(10));
        assert_no_orphans(&seen, "forwarded signal");
    }
}

#[test]
fn stdin_goes_to_rank_0_and_output_is_tagged_line_by_line() {
    let mut c = Command::new(env!("CARGO_BIN_EXE_courier"))
        .args([
            "run",
            "-n",
            "3",
            "--tag-output",
            "-x",
            "GREETING=hi there",
            "sh",
            "-c",
            "read x; echo \"$COURIER_RUN_RANK:$x:$GREETING\"; echo \"err $COURIER_RUN_RANK\" >&2",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    use std::io::Write;
    c.stdin.take().unwrap().write_all(b"from stdin\n").unwrap();
    let o = c.wait_with_output().unwrap();
    let (out, err) = texts(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(
        out.contains("[1,0]<stdout>:0:from stdin:hi there\n"),
        "{out}"
    );
    assert!(out.contains("[1,1]<stdout>:1::hi there\n"), "{out}");
    assert!(out.contains("[1,2]<stdout>:2::hi there\n"), "{out}");
    for r in 0..3 {
        assert!(err.contains(&format!("[1,{r}]<stderr>:err {r}\n")), "{err}");
    }
}

/// Long lines from many ranks at once arrive whole: never two ranks within one line.
#[test]
fn lines_from_many_ranks_never_mix() {
    let o = run_cmd(&[
        "-n",
        "6",
        "sh",
        "-c",
        "l=$(printf \"%0800d\" 0 | tr 0 $COURIER_RUN_RANK); for i in $(seq 50); do echo $l$l$l$l; done",
    ]);
    let (out, err) = texts(&o);
    assert!(o.status.success(), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 300, "{err}");
    for l in lines {
        assert_eq!(l.len(), 3200);
        let c = l.as_bytes()[0];
        assert!(l.bytes().all(|b| b == c), "a mixed line: {}...", &l[..80]);
    }
}

#[test]
fn cpu_bind_core_binds_each_rank_to_one_cpu() {
    let o = run_cmd(&[
        "-n",
        "2",
        "--cpu-bind",
        "core",
        "sh",
        "-c",
        "grep Cpus_allowed_list /proc/self/status",
    ]);
    let (out, err) = texts(&o);
    assert!(o.status.success(), "{err}");
    let lists: Vec<&str> = out
        .lines()
        .map(|l| l.split(':').nth(1).unwrap_or("").trim())
        .collect();
    assert_eq!(lists.len(), 2, "{out}");
    for l in &lists {
        assert!(l.parse::<u32>().is_ok(), "not one CPU: {l}");
    }
}

/// The CPUs in a `Cpus_allowed_list` value (`0-3,6`).
fn cpu_list(l: &str) -> Vec<u32> {
    let mut cpus = Vec::new();
    for part in l.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u32, u32) = (a.parse().unwrap(), b.parse().unwrap());
        cpus.extend(a..=b);
    }
    cpus
}

/// The default binding is mpirun's: a CPU of its own for each rank while the ranks do not
/// outnumber the launcher's CPUs, none when they do.
#[test]
fn cpu_bind_auto_binds_unless_the_ranks_outnumber_the_cpus() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let mine = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(cpu_list)
        .unwrap();
    let lists = |np: usize| -> Vec<Vec<u32>> {
        let o = run_cmd(&[
            "-n",
            &np.to_string(),
            "sh",
            "-c",
            "grep Cpus_allowed_list /proc/self/status",
        ]);
        let (out, err) = texts(&o);
        assert!(o.status.success(), "{err}");
        let v: Vec<Vec<u32>> = out
            .lines()
            .map(|l| cpu_list(l.split(':').nth(1).unwrap_or("")))
            .collect();
        assert_eq!(v.len(), np, "{out}");
        v
    };
    let mut bound: Vec<u32> = lists(mine.len())
        .into_iter()
        .map(|l| {
            assert_eq!(l.len(), 1, "a rank not bound to one CPU: {l:?}");
            l[0]
        })
        .collect();
    bound.sort_unstable();
    assert_eq!(
        bound, mine,
        "each rank on a CPU of its own, all of the launcher's"
    );
    for l in lists(mine.len() + 1) {
        assert_eq!(l, mine, "more ranks than CPUs: no binding");
    }
}

/// mpirun's `-np` spelling works, and `oshrun` is the same command.
#[test]
fn np_and_oshrun_spellings() {
    let o = run_cmd(&[
        "-np",
        "2",
        "sh",
        "-c",
        "echo r$COURIER_RUN_RANK of $COURIER_RUN_SIZE",
    ]);
    let (out, _) = texts(&o);
    assert!(out.contains("r0 of 2") && out.contains("r1 of 2"), "{out}");
    let dir = std::env::temp_dir().join(format!("courier-oshrun-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("oshrun");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_courier"), &link).unwrap();
    let o = Command::new(&link)
        .args(["-n", "2", "sh", "-c", "echo pe$COURIER_RUN_RANK"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let (out, err) = texts(&o);
    assert!(out.contains("pe0") && out.contains("pe1"), "{out}\n{err}");
}
