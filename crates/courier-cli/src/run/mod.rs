//! `courier run`: Courier's own launcher for jobs on one host (also answers as `oshrun`).
//!
//! `courier run -n N [-x VAR[=VAL]]... [--tag-output] [--timeout SECS] [--cpu-bind none|core]
//! PROGRAM ARGS...` starts N ranks of PROGRAM and serves their exchange (`exchange.rs`)
//! over one Unix socket pair per rank, which it owns: each rank inherits its end as
//! `COURIER_RUN_FD` (and `PMI_FD`, for PMI-1 programs). It forwards stdin to rank 0 and the
//! ranks' output line by line, forwards SIGINT, SIGTERM and SIGHUP to every rank, and when a
//! rank fails (a non-zero exit, a signal, an abort, a protocol violation) it ends the others
//! and exits as mpirun does: the failing rank's exit status, 128 + the signal, the abort's
//! code (0 too: an abort with 0, such as `shmem_global_exit(0)`, ends every rank and the
//! job succeeds), 110 for `--timeout`, 132 for a program that cannot be started.

// Nested `if let` reads more plainly here than let-chains (as in the library).
#![allow(clippy::collapsible_if)]

mod exchange;
mod launch;
mod output;
mod sys;

use clap::{Args, ValueEnum};

use crate::error::CliError;

/// CPU binding of ranks.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum CpuBind {
    /// As mpirun: core when the ranks do not outnumber the CPUs this launcher may use,
    /// none when they do.
    Auto,
    /// No binding: the kernel places ranks.
    None,
    /// Rank r on the r-th CPU this launcher may use (round robin when there are more ranks).
    Core,
}

impl CpuBind {
    /// Whether `np` ranks on `ncpus` CPUs are bound, one CPU each.
    pub fn binds(self, np: usize, ncpus: usize) -> bool {
        match self {
            CpuBind::Auto => np <= ncpus,
            CpuBind::None => false,
            CpuBind::Core => true,
        }
    }
}

/// `courier run`'s options.
#[derive(Args, Debug)]
#[command(
    about = "Start a job of N ranks on this host (mpirun's options): courier run -n N PROGRAM ARGS...",
    after_help = "Ranks find each other through courier::Job (C: courier_job_*). Multi-host jobs use mpirun or srun: Courier detects them too."
)]
pub struct RunArgs {
    /// Number of ranks to start (also -np, --np)
    #[arg(
        short = 'n',
        long = "np",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub np: Option<i64>,
    /// Export VAR to the ranks, with value VAL or this process's value
    #[arg(short = 'x', value_name = "VAR[=VAL]")]
    pub export: Vec<String>,
    /// Prefix each output line with [1,RANK]<stdout>: or <stderr>:
    #[arg(long = "tag-output")]
    pub tag_output: bool,
    /// End the job after SECS seconds (exit status 110, as mpirun)
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Bind each rank to one CPU (core), or not (none), or as mpirun does (auto: core unless
    /// the ranks outnumber the CPUs)
    #[arg(long = "cpu-bind", value_enum, default_value = "auto")]
    pub cpu_bind: CpuBind,
    /// The program and its arguments
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    pub command: Vec<String>,
}

/// Most ranks one `courier run` starts.
pub const MAX_RANKS: i64 = 4096;

/// mpirun's `-np` (one dash, two letters) as `-n`: `args[start..]` are `run`'s own
/// arguments; only those before the program are looked at.
pub fn normalize_args(args: Vec<String>, start: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(args.len());
    let mut expect_value = false;
    let mut done = false;
    for (i, a) in args.into_iter().enumerate() {
        if i < start || done {
            out.push(a);
            continue;
        }
        if expect_value {
            expect_value = false;
            out.push(a);
            continue;
        }
        match a.as_str() {
            "-np" => {
                out.push("-n".to_string());
                expect_value = true;
                continue;
            }
            "-n" | "--np" | "-x" | "--timeout" | "--cpu-bind" => expect_value = true,
            s if s == "--" || !s.starts_with('-') => done = true,
            _ => {}
        }
        out.push(a);
    }
    out
}

/// Run the job; the exit code is mpirun's.
pub fn main(a: RunArgs) -> Result<(), CliError> {
    let np = match a.np {
        None => {
            return Err(CliError::usage(
                "run: -n N is required (the number of ranks to start)",
            ));
        }
        Some(n) if n < 1 => {
            return Err(CliError::usage(format!(
                "run: -n {n}: a job needs at least one rank"
            )));
        }
        Some(n) if n > MAX_RANKS => {
            return Err(CliError::usage(format!(
                "run: -n {n}: at most {MAX_RANKS} ranks on one host"
            )));
        }
        Some(n) => n as u32,
    };
    if a.command.is_empty() {
        return Err(CliError::usage("run: no program to run"));
    }
    if let Some(t) = a.timeout {
        if !(t > 0.0 && t.is_finite()) {
            return Err(CliError::usage(format!(
                "run: --timeout {t}: give a positive number of seconds"
            )));
        }
    }
    let mut env = Vec::new();
    for x in &a.export {
        match x.split_once('=') {
            Some((k, v)) if !k.is_empty() => env.push((k.to_string(), v.to_string())),
            Some(_) => {
                return Err(CliError::usage(format!("run: -x {x:?}: no variable name")));
            }
            None => match std::env::var(x) {
                Ok(v) => env.push((x.clone(), v)),
                Err(_) => {
                    return Err(CliError::usage(format!(
                        "run: -x {x}: {x} is not set in this environment (use -x {x}=VALUE)"
                    )));
                }
            },
        }
    }
    let plan = launch::Plan {
        np,
        env,
        tag_output: a.tag_output,
        timeout: a.timeout.map(std::time::Duration::from_secs_f64),
        cpu_bind: a.cpu_bind,
        command: a.command,
    };
    let code = launch::run(plan)?;
    std::process::exit(code);
}
