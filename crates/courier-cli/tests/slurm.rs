//! Courier jobs under Slurm's srun on this host, with a cluster of our own (munged,
//! slurmctld, slurmd; started and ended by the test): PMI-2 (`--mpi=pmi2`, the wire
//! protocol) and PMIx (`--mpi=pmix`, libpmix.so.2). Ring and all-to-all for N = 1, 2, 4, 8,
//! abort, and a rank dying before the exchange (with srun's --kill-on-bad-exit).

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::job::{output_within, pids, rank_args, rank_main, require, survivors};
use common::slurm::{Cluster, Node};

#[test]
fn rank_entry() {
    rank_main();
}

fn srun(c: &Cluster, args: &[&str], role: &str, env: &[(&str, &str)]) -> (Output, Duration) {
    let mut cmd = Command::new("srun");
    cmd.args(args).args(rank_args());
    cmd.env("SLURM_CONF", &c.conf)
        .env("COURIER_TEST_JOB_ROLE", role)
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let t = Instant::now();
    let o = output_within(&mut cmd, "srun");
    (o, t.elapsed())
}

fn texts(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn jobs_under_srun_pmi2_and_pmix() {
    let host = String::from_utf8_lossy(&Command::new("hostname").output().unwrap().stdout)
        .trim()
        .to_string();
    let nodes = [Node {
        name: host,
        addr: "127.0.0.1".into(),
        netns: None,
    }];
    let cluster = match Cluster::start("local", "127.0.0.1", None, &nodes) {
        Ok(c) => c,
        Err(e) => {
            require(false, "jobs_under_srun", &e);
            return;
        }
    };
    for (mpi, via) in [("pmi2", "pmi2"), ("pmix", "pmix")] {
        let plugin = format!("--mpi={mpi}");
        for n in [1, 2, 4, 8] {
            let ns = n.to_string();
            let (o, t) = srun(&cluster, &[&plugin, "-n", &ns, "-O"], "ring", &[]);
            let (out, err) = texts(&o);
            assert!(
                o.status.success(),
                "srun {plugin} -n {n}: {:?}\n{out}\n{err}",
                o.status
            );
            for r in 0..n {
                let want = format!("RANK {r}/{n} OK local {r}/{n} host 0 via {via}");
                assert!(
                    out.contains(&want),
                    "srun {plugin} -n {n}: no '{want}':\n{out}\n{err}"
                );
            }
            eprintln!("srun {plugin} -n {n}: ring and all-to-all in {t:?}");
        }
        // Abort from rank 1 ends every rank.
        let (o, t) = srun(&cluster, &[&plugin, "-n", "4", "-O"], "abort", &[]);
        let (out, err) = texts(&o);
        assert!(!o.status.success(), "srun {plugin} abort: {out}\n{err}");
        assert!(
            err.contains("rank 1 of 4 aborts the job with code 7"),
            "{err}"
        );
        assert!(!out.contains("SURVIVED"), "{out}");
        assert!(t < Duration::from_secs(60), "abort took {t:?}");
        let left = survivors(&pids(&out), Duration::from_secs(10));
        assert!(left.is_empty(), "srun {plugin} abort left {left:?}");
        // A rank that dies before the exchange: srun -K ends the others.
        let (o, t) = srun(
            &cluster,
            &[&plugin, "-n", "3", "-O", "--kill-on-bad-exit=1"],
            "die-before-init",
            &[("COURIER_JOB_TIMEOUT", "30s")],
        );
        let (out, err) = texts(&o);
        assert!(
            !o.status.success(),
            "srun {plugin} early death: {out}\n{err}"
        );
        assert!(t < Duration::from_secs(60), "early death took {t:?}");
        let left = survivors(&pids(&out), Duration::from_secs(10));
        assert!(left.is_empty(), "srun {plugin} early death left {left:?}");
    }
    drop(cluster);
}

/// One slurmctld and one slurmd per namespace host (munge's socket is a path, reached from
/// every namespace); srun runs on the first host. Shared memory inside a host, tcp between.
#[test]
fn jobs_under_srun_across_two_namespace_hosts() {
    let hosts = match common::hosts::Hosts::new("s", 2) {
        Ok(h) => h,
        Err(e) => {
            require(
                false,
                "srun_multihost",
                &format!("cannot make namespace hosts: {e}"),
            );
            return;
        }
    };
    let nodes: Vec<Node> = (0..2)
        .map(|i| Node {
            name: hosts.names[i].clone(),
            addr: hosts.addrs[i].clone(),
            netns: Some(hosts.netns[i].clone()),
        })
        .collect();
    let cluster = match Cluster::start(
        "multi",
        &hosts.addrs[0],
        Some(hosts.netns[0].clone()),
        &nodes,
    ) {
        Ok(c) => c,
        Err(e) => {
            require(false, "srun_multihost", &e);
            return;
        }
    };
    for (mpi, via) in [("pmi2", "pmi2"), ("pmix", "pmix")] {
        for n in [2usize, 4] {
            let per = n / 2;
            let mut cmd = hosts.command(0, "srun");
            cmd.args([
                &format!("--mpi={mpi}"),
                "-N",
                "2",
                "-n",
                &n.to_string(),
                "-O",
            ])
            .args(["--distribution=block"])
            .args(rank_args())
            .env("SLURM_CONF", &cluster.conf)
            .env("COURIER_TEST_JOB_ROLE", "ring")
            .env("COURIER_LOG_LEVEL", "info")
            .stdin(Stdio::null());
            let o = output_within(&mut cmd, "srun");
            let (out, err) = texts(&o);
            assert!(
                o.status.success(),
                "srun --mpi={mpi} -N 2 -n {n}: {:?}\n{out}\n{err}",
                o.status
            );
            for r in 0..n {
                let want = format!(
                    "RANK {r}/{n} OK local {}/{per} host {} via {via}",
                    r % per,
                    r / per
                );
                assert!(
                    out.contains(&want),
                    "--mpi={mpi} -n {n}: no '{want}':\n{out}\n{err}"
                );
            }
            assert!(
                err.contains("inter-node cfg#") && err.contains("tag(tcp/"),
                "{err}"
            );
            if per > 1 {
                assert!(
                    err.contains("intra-node cfg#") && err.contains("tag(shm/"),
                    "{err}"
                );
            }
        }
    }
    drop(cluster);
}
