//! Courier jobs under other launchers on this host: Open MPI's mpirun (PMIx, through
//! libpmix.so.2 loaded at run time) and MPICH's hydra mpiexec (PMI-1). Ring and all-to-all
//! with contents checked for N = 1, 2, 4, 8; abort; a rank that dies before the exchange; a
//! missing PMIx library. `scripts/launchers.sh` installs them (make test does).

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::job::{output_within, pids, rank_args, rank_main, require, survivors};

#[test]
fn rank_entry() {
    rank_main();
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `launcher ARGS... <this binary as a rank>` with `role`.
fn launch(launcher: &[&str], role: &str, env: &[(&str, &str)]) -> (Output, Duration) {
    let mut c = Command::new(launcher[0]);
    c.args(&launcher[1..]).args(rank_args());
    c.env("COURIER_TEST_JOB_ROLE", role)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let t = Instant::now();
    let o = output_within(&mut c, launcher[0]);
    (o, t.elapsed())
}

fn texts(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn mpirun(n: usize) -> Vec<String> {
    [
        "mpirun.openmpi",
        "--oversubscribe",
        "--allow-run-as-root",
        "-n",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([n.to_string()])
    .collect()
}

fn hydra(n: usize) -> Vec<String> {
    vec!["mpiexec.hydra".into(), "-n".into(), n.to_string()]
}

fn rings(test: &str, cmd: &str, make: fn(usize) -> Vec<String>, via: &str) {
    if !require(
        have(cmd),
        test,
        &format!("{cmd} is not installed (scripts/launchers.sh)"),
    ) {
        return;
    }
    for n in [1, 2, 4, 8] {
        let args = make(n);
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let (o, t) = launch(&a, "ring", &[]);
        let (out, err) = texts(&o);
        assert!(
            o.status.success(),
            "{cmd} -n {n}: {:?}\n{out}\n{err}",
            o.status
        );
        for r in 0..n {
            let want = format!("RANK {r}/{n} OK local {r}/{n} host 0 via {via}");
            assert!(
                out.contains(&want),
                "{cmd} -n {n}: no '{want}':\n{out}\n{err}"
            );
        }
        eprintln!("{cmd} -n {n}: ring and all-to-all in {t:?}");
    }
}

#[test]
fn ring_and_all_to_all_under_mpirun_pmix() {
    rings("ring_under_mpirun", "mpirun.openmpi", mpirun, "pmix");
}

#[test]
fn ring_and_all_to_all_under_hydra_pmi1() {
    rings("ring_under_hydra", "mpiexec.hydra", hydra, "pmi1");
}

/// `last_words`: the launcher forwards what the victim wrote just before its abort. Hydra
/// does not always: its proxies end the ranks and close their pipes without draining them,
/// so the victim's line (written before the PMI abort) is sometimes lost there.
fn abort_ends_every_rank(test: &str, cmd: &str, make: fn(usize) -> Vec<String>, last_words: bool) {
    if !require(have(cmd), test, &format!("{cmd} is not installed")) {
        return;
    }
    let args = make(4);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let (o, t) = launch(&a, "abort", &[]);
    let (out, err) = texts(&o);
    assert_eq!(o.status.code(), Some(7), "{cmd}: {out}\n{err}");
    assert!(
        !last_words || err.contains("rank 1 of 4 aborts the job with code 7"),
        "{err}"
    );
    assert!(!out.contains("SURVIVED"), "{out}");
    assert!(t < Duration::from_secs(60), "{cmd}: abort took {t:?}");
    let p = pids(&out);
    assert_eq!(p.len(), 4, "{out}");
    let left = survivors(&p, Duration::from_secs(5));
    assert!(left.is_empty(), "{cmd}: left behind {left:?}");
}

#[test]
fn abort_under_mpirun_ends_every_rank() {
    abort_ends_every_rank("abort_under_mpirun", "mpirun.openmpi", mpirun, true);
}

#[test]
fn abort_under_hydra_ends_every_rank() {
    abort_ends_every_rank("abort_under_hydra", "mpiexec.hydra", hydra, false);
}

/// mpirun ends the job when a rank exits non-zero; hydra waits for the others, whose
/// start-up fence then times out (COURIER_JOB_TIMEOUT) with an error that says so.
fn early_death(test: &str, cmd: &str, make: fn(usize) -> Vec<String>) {
    if !require(have(cmd), test, &format!("{cmd} is not installed")) {
        return;
    }
    let args = make(3);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let (o, t) = launch(&a, "die-before-init", &[("COURIER_JOB_TIMEOUT", "5s")]);
    let (out, err) = texts(&o);
    assert!(!o.status.success(), "{cmd}: {out}\n{err}");
    if cmd.contains("hydra") {
        assert!(
            out.contains("INIT FAILED")
                && out.contains("first fence")
                && out.contains("COURIER_JOB_TIMEOUT"),
            "{out}\n{err}"
        );
    }
    assert!(t < Duration::from_secs(60), "{cmd}: took {t:?}");
    let left = survivors(&pids(&out), Duration::from_secs(5));
    assert!(left.is_empty(), "{cmd}: left behind {left:?}");
}

#[test]
fn a_rank_dying_before_the_exchange_under_mpirun_ends_the_job() {
    early_death("early_death_under_mpirun", "mpirun.openmpi", mpirun);
}

#[test]
fn a_rank_dying_before_the_exchange_under_hydra_ends_the_job() {
    early_death("early_death_under_hydra", "mpiexec.hydra", hydra);
}

/// A fence one rank never joins: each waiting rank's fence times out, naming the missing
/// rank where the launcher's protocol lets it be found (`names`: PMIx does, by asking each
/// rank for the marker it commits as it enters a fence; PMI-1 cannot; courier run's own
/// test checks its launcher's naming), and the job ends.
fn fence_timeout(test: &str, cmd: &str, make: fn(usize) -> Vec<String>, names: Option<&str>) {
    if !require(have(cmd), test, &format!("{cmd} is not installed")) {
        return;
    }
    let args = make(3);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let (o, t) = launch(&a, "fence-missing", &[("COURIER_TEST_JOB_VICTIM", "2")]);
    let (out, err) = texts(&o);
    assert!(!o.status.success(), "{cmd}: {out}\n{err}");
    assert!(
        out.contains("FENCE FAILED") && out.contains("within 2s"),
        "{cmd}: {out}\n{err}"
    );
    if let Some(words) = names {
        let failed: Vec<&str> = out.lines().filter(|l| l.contains("FENCE FAILED")).collect();
        assert!(!failed.is_empty(), "{cmd}: {out}");
        for l in failed {
            assert!(l.contains(words), "{cmd}: wanted {words:?} in {l}");
        }
    }
    assert!(t < Duration::from_secs(90), "{cmd}: took {t:?}");
    let left = survivors(&pids(&out), Duration::from_secs(5));
    assert!(left.is_empty(), "{cmd}: left behind {left:?}");
}

#[test]
fn a_fence_one_rank_never_joins_times_out_under_mpirun() {
    fence_timeout(
        "fence_timeout_under_mpirun",
        "mpirun.openmpi",
        mpirun,
        Some("1 of 3 ranks did not join it: 2"),
    );
}

#[test]
fn a_fence_one_rank_never_joins_times_out_under_hydra() {
    fence_timeout("fence_timeout_under_hydra", "mpiexec.hydra", hydra, None);
}

/// Without the PMIx library, a process mpirun started says which library is missing.
#[test]
fn a_missing_pmix_library_is_named() {
    if !require(
        have("mpirun.openmpi"),
        "missing_pmix",
        "mpirun.openmpi is not installed",
    ) {
        return;
    }
    let args = mpirun(1);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let (o, _) = launch(
        &a,
        "info",
        &[("COURIER_PMIX_LIB", "/nonexistent/libpmix.so.2")],
    );
    let (out, err) = texts(&o);
    assert!(!o.status.success(), "{out}\n{err}");
    assert!(
        out.contains("INIT FAILED")
            && out.contains("/nonexistent/libpmix.so.2")
            && out.contains("libpmix2"),
        "{out}\n{err}"
    );
}

/// A job under mpirun is authenticated with no configuration too (rank 0's key, shared
/// through PMIx): a process outside it, on this host, without the key, is refused.
#[test]
fn a_process_outside_the_job_is_refused_under_mpirun() {
    let test = "outsider_under_mpirun";
    if !require(
        have("mpirun.openmpi"),
        test,
        "mpirun.openmpi is not installed",
    ) {
        return;
    }
    let args = mpirun(1);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let (o, _) = launch(&a, "refuse-outsider", &[]);
    let (out, err) = texts(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("OUTSIDER REFUSED"), "{out}\n{err}");
    assert!(err.contains("did not authenticate"), "{err}");
}
