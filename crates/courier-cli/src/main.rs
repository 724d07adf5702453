//! `courier`: the command-line tool of the Courier communication library.
//!
//! - `courier perf`: a drop-in for ucx_perftest (`--local` runs a suite with both processes
//!   started for you, `--sweep` runs OSU-style size sweeps).
//! - `courier info`: a drop-in for ucx_info.

mod error;
mod info;
mod perf;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "courier",
    version,
    about = "Courier's command-line tool: benchmarks (perf) and introspection (info)"
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
}

fn main() {
    // Behave like other command-line tools when the reader goes away (`| head`): end quietly.
    // SAFETY: setting a signal disposition to its default at startup, before any thread.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let m = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&m).unwrap_or_else(|e| e.exit());
    let r = match cli.cmd {
        Cmd::Perf(mut a) => {
            if let Some(("perf", sub)) = m.subcommand() {
                a.given = perf::given_ids(sub);
            }
            perf::main(*a)
        }
        Cmd::Info(a) => info::main(a),
    };
    if let Err(e) = r {
        eprintln!("courier: error: {}", e.msg);
        std::process::exit(e.code);
    }
}
