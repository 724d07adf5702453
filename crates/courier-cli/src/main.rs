//! `courier`: the command-line tool of the Courier communication library.
//!
//! - `courier perf`: a drop-in for ucx_perftest (`--local` runs a suite with both processes
//!   started for you, `--sweep` runs OSU-style size sweeps).
//! - `courier info`: a drop-in for ucx_info.
//! - `courier run`: a launcher for jobs on one host (mpirun's options; also as `oshrun`).

use courier_cli::error;
mod info;
mod perf;
mod run;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "courier",
    version,
    about = "Courier's command-line tool: benchmarks (perf), introspection (info) and a launcher (run)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Benchmarks (ucx_perftest): server `courier perf`, client `courier perf HOST -t TEST`
    Perf(Box<perf::PerfArgs>),
    /// Transports, devices, configuration and protocol thresholds (ucx_info)
    Info(info::InfoArgs),
    /// Start a job of N ranks on this host (mpirun's options): courier run -n N PROGRAM ARGS...
    Run(run::RunArgs),
}

fn main() {
    // Behave like other command-line tools when the reader goes away (`| head`): end quietly.
    // SAFETY: setting a signal disposition to its default at startup, before any thread.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let mut args: Vec<String> = std::env::args().collect();
    // Installed (or linked) as oshrun, the command is `courier run`.
    let invoked = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if invoked == "oshrun" {
        args.insert(1, "run".to_string());
    }
    if args.get(1).map(String::as_str) == Some("run") {
        args = run::normalize_args(args, 2);
    }
    let m = Cli::command().get_matches_from(args);
    let cli = Cli::from_arg_matches(&m).unwrap_or_else(|e| e.exit());
    let r = match cli.cmd {
        Cmd::Perf(mut a) => {
            if let Some(("perf", sub)) = m.subcommand() {
                a.given = perf::given_ids(sub);
            }
            perf::main(*a)
        }
        Cmd::Info(a) => info::main(a),
        Cmd::Run(a) => run::main(a),
    };
    if let Err(e) = r {
        eprintln!("courier: error: {}", e.msg);
        std::process::exit(e.code);
    }
}
