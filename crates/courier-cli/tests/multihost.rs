//! Jobs across hosts: network namespaces joined by a bridge, made and removed by the test.
//! Open MPI's mpirun starts the ranks on them through its remote-start agent setting,
//! pointed at a script that runs the command inside the namespace of the host it is given.
//! Courier picks shared memory inside a host and tcp between hosts, and says so.

mod common;

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::hosts::Hosts;
use common::job::{pids, rank_args, rank_main, require, survivors};

#[test]
fn rank_entry() {
    rank_main();
}

fn texts(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn have(cmd: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn ring_and_all_to_all_across_two_hosts_under_mpirun() {
    if !require(
        have("mpirun.openmpi"),
        "multihost_mpirun",
        "mpirun.openmpi is not installed",
    ) {
        return;
    }
    let hosts = match Hosts::new("m", 2) {
        Ok(h) => h,
        Err(e) => {
            require(
                false,
                "multihost_mpirun",
                &format!("cannot make namespace hosts: {e}"),
            );
            return;
        }
    };
    let agent = hosts.agent().expect("agent script");
    for n in [2usize, 4, 8] {
        let per = n / 2;
        let host_list = format!("{}:{per},{}:{per}", hosts.names[0], hosts.names[1]);
        let mut c = hosts.command(0, "mpirun.openmpi");
        c.args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-n",
            &n.to_string(),
        ])
        .args(["--host", &host_list, "--map-by", "slot"])
        .args(["--mca", "plm_rsh_agent", agent.to_str().unwrap()])
        .args(["-x", "COURIER_TEST_JOB_ROLE", "-x", "COURIER_LOG_LEVEL"])
        .args(rank_args())
        .env("COURIER_TEST_JOB_ROLE", "ring")
        .env("COURIER_LOG_LEVEL", "info")
        .stdin(Stdio::null());
        let t = Instant::now();
        let o = c.output().expect("mpirun");
        let (out, err) = texts(&o);
        assert!(
            o.status.success(),
            "mpirun -n {n} across hosts: {:?}\n{out}\n{err}",
            o.status
        );
        for r in 0..n {
            let (host, local) = (r / per, r % per);
            let want = format!("RANK {r}/{n} OK local {local}/{per} host {host} via pmix");
            assert!(out.contains(&want), "-n {n}: no '{want}':\n{out}\n{err}");
        }
        assert!(
            err.contains("inter-node cfg#") && err.contains("tag(tcp/"),
            "-n {n}: no tcp selection line between hosts:\n{err}"
        );
        if per > 1 {
            assert!(
                err.contains("intra-node cfg#") && err.contains("tag(shm/"),
                "-n {n}: no shm selection line within a host:\n{err}"
            );
        }
        let left = survivors(&pids(&out), Duration::from_secs(5));
        assert!(left.is_empty(), "-n {n}: left behind {left:?}");
        eprintln!(
            "mpirun -n {n} across two namespace hosts: {:?}",
            t.elapsed()
        );
    }
}
