//! What the CLI tests share: the `courier` binary, run as users run it, and the numbers of
//! its output rows. Each test file uses part of it.
#![allow(dead_code)]

pub mod job;

use std::process::{Command, Output, Stdio};

/// The environment of a run over tcp only.
pub const TCP: &[(&str, &str)] = &[("COURIER_TLS", "tcp")];

/// Run `courier ARGS` with `env` added, standard input closed; its output.
pub fn courier(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_courier"));
    c.args(args).stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run courier")
}

/// `courier ARGS` with `env` added, standard input closed and both outputs piped, to be
/// spawned (a server, or a client whose output is read while it runs).
pub fn piped(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_courier"));
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Standard output and standard error as text.
pub fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The JSON object a successful run printed (`--json`); `what` names the run in failures.
pub fn json_of(o: &Output, what: &str) -> serde_json::Value {
    let (out, err) = text(o);
    assert!(o.status.success(), "{what}: {out}{err}");
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{what}: {e}: {out}"))
}

/// The numbers of a table row, whose numbers may have thousands separators (`-N`).
pub fn numbers(line: &str) -> Vec<f64> {
    line.split_whitespace()
        .filter_map(|w| w.replace(',', "").parse::<f64>().ok())
        .collect()
}

/// The numbers of a row whose fields are split by white space or commas (CSV, `-v`).
pub fn fields(line: &str) -> Vec<f64> {
    line.split(|c: char| c.is_whitespace() || c == ',')
        .filter_map(|w| w.parse::<f64>().ok())
        .collect()
}

/// The CPUs this test may run on (`Cpus_allowed_list` of /proc/self/status).
pub fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list")
        .trim();
    let mut v = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => v.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap()),
            None => v.push(part.parse().unwrap()),
        }
    }
    v
}
