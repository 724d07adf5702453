//! Test "hosts": network namespaces joined by a bridge (in a switch namespace of its own),
//! each with its own address and, through `/etc/netns/NS/hosts`, names for the others.
//! Made and removed by the test. `agent()` writes a remote-start agent for mpirun
//! (`plm_rsh_agent`): `agent HOST COMMAND` runs COMMAND inside HOST's namespace, with
//! HOST as its host name (a UTS namespace of its own).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

pub struct Hosts {
    pub names: Vec<String>,
    pub netns: Vec<String>,
    pub addrs: Vec<String>,
    switch: String,
    pub dir: PathBuf,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Hosts {
    /// `n` hosts named `{tag}h0`, `{tag}h1`, ...
    pub fn new(tag: &str, n: usize) -> Result<Hosts, String> {
        let id = std::process::id() % 200 + 20;
        let switch = format!("cj{tag}s{id}");
        let mut h = Hosts {
            names: Vec::new(),
            netns: Vec::new(),
            addrs: Vec::new(),
            switch: switch.clone(),
            dir: std::env::temp_dir().join(format!("courier-hosts-{tag}-{}", std::process::id())),
        };
        ip(&["netns", "add", &switch])?;
        let br = format!("cjb{id}");
        ip(&["-n", &switch, "link", "add", &br, "type", "bridge"])?;
        ip(&["-n", &switch, "link", "set", &br, "up"])?;
        for i in 0..n {
            let name = format!("{tag}h{i}");
            let ns = format!("cj{tag}h{i}x{id}");
            ip(&["netns", "add", &ns])?;
            h.names.push(name);
            h.netns.push(ns.clone());
            let (hv, sv) = (format!("cj{id}{tag}h{i}"), format!("cj{id}{tag}p{i}"));
            ip(&["link", "add", &hv, "type", "veth", "peer", "name", &sv])?;
            ip(&["link", "set", &hv, "netns", &ns])?;
            ip(&["link", "set", &sv, "netns", &switch])?;
            ip(&["-n", &switch, "link", "set", &sv, "master", &br])?;
            ip(&["-n", &switch, "link", "set", &sv, "up"])?;
            let addr = format!("10.252.{id}.{}", i + 1);
            ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", &hv])?;
            ip(&["-n", &ns, "link", "set", &hv, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            h.addrs.push(addr);
        }
        let mut hosts = String::from("127.0.0.1 localhost\n");
        for (a, n) in h.addrs.iter().zip(&h.names) {
            hosts.push_str(&format!("{a} {n}\n"));
        }
        for ns in &h.netns {
            let d = format!("/etc/netns/{ns}");
            std::fs::create_dir_all(&d).map_err(|e| format!("{d}: {e}"))?;
            std::fs::write(format!("{d}/hosts"), &hosts).map_err(|e| format!("{d}: {e}"))?;
        }
        std::fs::create_dir_all(&h.dir).map_err(|e| e.to_string())?;
        Ok(h)
    }

    /// A remote-start agent for mpirun: `agent [OPTIONS] HOST COMMAND...`.
    pub fn agent(&self) -> Result<PathBuf, String> {
        let mut cases = String::new();
        for (n, ns) in self.names.iter().zip(&self.netns) {
            cases.push_str(&format!("  {n}) ns={ns} ;;\n"));
        }
        let script = format!(
            "#!/bin/sh\n# mpirun's remote-start agent for the test's namespace hosts.\n\
             while [ $# -gt 0 ]; do case \"$1\" in -*) shift ;; *) break ;; esac; done\n\
             host=\"$1\"; shift\ncase \"$host\" in\n{cases}  *) echo \"agent: unknown host $host\" >&2; exit 255 ;;\nesac\n\
             exec ip netns exec \"$ns\" unshare --uts sh -c 'hostname \"$0\" && exec sh -c \"$1\"' \"$host\" \"$*\"\n"
        );
        let p = self.dir.join("nsrsh");
        std::fs::write(&p, script).map_err(|e| e.to_string())?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
        Ok(p)
    }

    /// `prog ARGS` run inside host `i` (its namespace, its host name).
    pub fn command(&self, i: usize, prog: &str) -> Command {
        let mut c = Command::new("ip");
        c.args([
            "netns",
            "exec",
            &self.netns[i],
            "unshare",
            "--uts",
            "sh",
            "-c",
        ])
        .arg("hostname \"$1\" && shift && exec \"$@\"")
        .arg("sh")
        .arg(&self.names[i])
        .arg(prog);
        c
    }
}

impl Drop for Hosts {
    /// A failed test leaves its ranks and daemons running: end every process still inside
    /// the test's namespaces (`ip netns pids`), then remove the namespaces.
    fn drop(&mut self) {
        for ns in &self.netns {
            let pids = std::process::Command::new("ip")
                .args(["netns", "pids", ns])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            for pid in pids
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
            {
                // SAFETY: kill has no memory arguments; the pid is a process in this
                // test's own namespace.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            let _ = ip(&["netns", "del", ns]);
            let _ = std::fs::remove_dir_all(format!("/etc/netns/{ns}"));
        }
        let _ = ip(&["netns", "del", &self.switch]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
