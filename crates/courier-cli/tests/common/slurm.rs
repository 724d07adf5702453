//! A Slurm cluster for a test: munged, slurmctld and one slurmd per host, in the foreground
//! under this test (ended by pid when it is dropped), with their configuration, state and
//! sockets in a directory of their own. `scripts/launchers.sh` installs the packages.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One slurmd: its node name, address, and the network namespace it runs in (None: here).
pub struct Node {
    pub name: String,
    pub addr: String,
    pub netns: Option<String>,
}

pub struct Cluster {
    pub dir: PathBuf,
    pub conf: PathBuf,
    daemons: Vec<Child>,
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `prog` in network namespace `ns` (None: here) with host name `host` and a /tmp of its
/// own (as a real host has: Slurm's PMIx plugin keeps per-step directories there, which two
/// nodes on one file system would share). nsenter, not `ip netns exec`, which mounts a
/// sysfs of its own and so hides the cgroup tree slurmd needs.
fn in_ns(ns: &Option<String>, host: &str, prog: &str) -> Command {
    match ns {
        Some(n) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/var/run/netns/{n}"))
                .args(["unshare", "--uts", "--mount", "sh", "-c"])
                .arg("mount -t tmpfs tmpfs /tmp && hostname \"$1\" && shift && exec \"$@\"")
                .arg("sh")
                .arg(host)
                .arg(prog);
            c
        }
        None => Command::new(prog),
    }
}

impl Cluster {
    /// Whether the programs are installed.
    pub fn available() -> Result<(), String> {
        for p in ["munged", "slurmctld", "slurmd", "srun", "sinfo"] {
            if !have(p) {
                return Err(format!("{p} is not installed (scripts/launchers.sh)"));
            }
        }
        if !std::path::Path::new("/etc/munge/munge.key").exists() {
            return Err("/etc/munge/munge.key is missing (the munge package makes it)".into());
        }
        Ok(())
    }

    /// Start a cluster whose controller listens on `ctl_addr` (in `ctl_ns`) with `nodes`.
    pub fn start(
        tag: &str,
        ctl_addr: &str,
        ctl_ns: Option<String>,
        nodes: &[Node],
    ) -> Result<Cluster, String> {
        Cluster::available()?;
        // Namespace hosts have a /tmp of their own: their cluster lives elsewhere.
        let base_dir = if nodes.iter().any(|n| n.netns.is_some()) {
            let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
            if target.starts_with("/tmp") {
                return Err(format!(
                    "this checkout's build lies under /tmp ({}), which each namespace host covers with a /tmp of its own, hiding the programs and the cluster's files from it: clone outside /tmp to run this test",
                    target.display()
                ));
            }
            target
        } else {
            std::env::temp_dir()
        };
        let dir = base_dir.join(format!("courier-slurm-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["state", "spool", "log", "tmp"] {
            std::fs::create_dir_all(dir.join(d)).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        // Ports of our own, apart from other test runs on this machine, and below the
        // kernel's ephemeral range: a port in it can be taken at any moment as the local
        // end of another test's connection ("Address already in use" for slurmctld).
        let salt = tag
            .bytes()
            .fold(0u32, |a, b| a.wrapping_mul(31).wrapping_add(b as u32))
            % 4;
        let slots = (ephemeral_start().saturating_sub(20000) / 8).max(1);
        let base = 20000 + (std::process::id() % slots) * 8 + salt * 2;
        let d = dir.display();
        let hostname = String::from_utf8_lossy(
            &Command::new("hostname")
                .output()
                .map_err(|e| e.to_string())?
                .stdout,
        )
        .trim()
        .to_string();
        let ctl_host = if ctl_ns.is_some() {
            "ctl".to_string()
        } else {
            hostname
        };
        let mut conf = format!(
            "ClusterName=courier{tag}\nSlurmctldHost={ctl_host}({ctl_addr})\nSlurmctldPort={base}\nSlurmdPort={}\n\
             SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nAuthInfo=socket={d}/munge.sock\nCredType=cred/munge\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool/%n\nSlurmctldPidFile={d}/slurmctld.pid\n\
             SlurmdPidFile={d}/slurmd-%n.pid\nSlurmctldLogFile={d}/log/slurmctld.log\nSlurmdLogFile={d}/log/slurmd-%n.log\n\
             ProctrackType=proctrack/pgid\nTaskPlugin=task/none\nSelectType=select/linear\nSchedulerType=sched/builtin\n\
             MpiDefault=none\nReturnToService=2\nSlurmdParameters=config_overrides\n\
             AccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none\nJobCompType=jobcomp/none\n\
             SlurmdTimeout=30\nInactiveLimit=0\nKillWait=2\nTmpFS={}\nFirstJobId={}\n",
            base + 1,
            // Each namespace host mounts a /tmp of its own; here, one in our directory.
            if nodes.iter().any(|n| n.netns.is_some()) {
                "/tmp".to_string()
            } else {
                format!("{d}/tmp")
            },
            // Job ids of this run only: Slurm's PMIx plugin names per-step directories by them.
            1000 + std::process::id() % 100_000 * 10
        );
        let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        for n in nodes {
            conf.push_str(&format!(
                "NodeName={} NodeAddr={} NodeHostname={} CPUs=16 State=UNKNOWN\n",
                n.name, n.addr, n.name
            ));
        }
        conf.push_str(&format!(
            "PartitionName=test Nodes={} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n",
            names.join(",")
        ));
        let conf_path = dir.join("slurm.conf");
        std::fs::write(&conf_path, conf).map_err(|e| e.to_string())?;
        let mut c = Cluster {
            dir: dir.clone(),
            conf: conf_path.clone(),
            daemons: Vec::new(),
        };
        let quiet = || (Stdio::null(), Stdio::null());
        let (o, e) = quiet();
        c.daemons.push(
            Command::new("munged")
                .args(["-F", "--force", "-S"])
                .arg(dir.join("munge.sock"))
                .arg(format!("--pid-file={d}/munged.pid"))
                .arg(format!("--log-file={d}/log/munged.log"))
                .arg(format!("--seed-file={d}/munge.seed"))
                .arg("--key-file=/etc/munge/munge.key")
                .stdout(o)
                .stderr(e)
                .spawn()
                .map_err(|e| format!("munged: {e}"))?,
        );
        let t = Instant::now();
        while !dir.join("munge.sock").exists() {
            if t.elapsed() > Duration::from_secs(20) {
                return Err(format!("munged did not start: {}", c.log("munged.log")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let (o, e) = quiet();
        c.daemons.push(
            in_ns(&ctl_ns, &ctl_host, "slurmctld")
                .current_dir(&dir)
                .args(["-D", "-i", "-f"])
                .arg(&conf_path)
                .env("SLURM_CONF", &conf_path)
                .stdout(o)
                .stderr(e)
                .spawn()
                .map_err(|e| format!("slurmctld: {e}"))?,
        );
        for n in nodes {
            let _ = std::fs::create_dir_all(dir.join("spool").join(&n.name));
            let (o, e) = quiet();
            c.daemons.push(
                in_ns(&n.netns, &n.name, "slurmd")
                    // A daemon's core file, if any, lands in the cluster's directory.
                    .current_dir(&dir)
                    .args(["-D", "-N", &n.name, "-f"])
                    .arg(&conf_path)
                    .env("SLURM_CONF", &conf_path)
                    .stdout(o)
                    .stderr(e)
                    .spawn()
                    .map_err(|e| format!("slurmd {}: {e}", n.name))?,
            );
        }
        // Ready when every node is idle.
        let t = Instant::now();
        loop {
            let o = in_ns(&ctl_ns, &ctl_host, "sinfo")
                .args(["-h", "-N", "-o", "%N %t"])
                .env("SLURM_CONF", &conf_path)
                .output();
            if let Ok(o) = o {
                let s = String::from_utf8_lossy(&o.stdout).to_string();
                let idle = s.lines().filter(|l| l.ends_with(" idle")).count();
                if idle == nodes.len() {
                    break;
                }
            }
            if t.elapsed() > Duration::from_secs(60) {
                return Err(format!(
                    "the cluster did not come up in 60 s:\n{}\n{}",
                    c.log("slurmctld.log"),
                    c.log(&format!("slurmd-{}.log", nodes[0].name))
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(c)
    }

    /// The last lines of one of the cluster's logs.
    pub fn log(&self, name: &str) -> String {
        let s = std::fs::read_to_string(self.dir.join("log").join(name)).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // slurmd first (it ends its steps), then the controller, then munged.
        for c in self.daemons.iter_mut().rev() {
            // SAFETY: kill has no memory arguments; the pid is our child's.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let t = Instant::now();
            loop {
                match c.try_wait() {
                    Ok(Some(_)) => break,
                    _ if t.elapsed() > Duration::from_secs(10) => {
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                    _ => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
        if std::env::var_os("COURIER_TEST_KEEP_SLURM").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The first port of the kernel's ephemeral range (`ip_local_port_range`; 32768 if it
/// cannot be read).
fn ephemeral_start() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}
