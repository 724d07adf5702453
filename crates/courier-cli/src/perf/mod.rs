//! `courier perf`: a drop-in for ucx_perftest, plus `--local` (a suite with both processes
//! started for you) and `--sweep` (OSU-style size sweeps).

pub mod clock;
pub mod engine;
pub mod hist;
pub mod local;
pub use courier_cli::perf_params as params;
pub mod report;
pub mod rma;
pub mod sweep;
pub mod threads;

use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::mpsc;
use std::time::Duration;

use courier::{Context, ContextParams, Features, ThreadMode, Worker, WorkerParams};

use crate::error::{CliError, CliResult};
use engine::Link;
use params::{MemKind, Params, TestKind};
use report::{Meter, Output, Row, Watch};

/// Options of `courier perf` (ucx_perftest's, plus a few of Courier's own).
///
/// As in ucx_perftest (getopt), an option given twice takes its last value, so that a
/// script can append to a command line; a negative number is an option's value (refused
/// by the option's own check, which says why), not an unknown option.
#[derive(clap::Args, Debug, Clone)]
#[command(
    disable_version_flag = true,
    args_override_self = true,
    allow_negative_numbers = true
)]
pub struct PerfArgs {
    /// Server to connect to; without it, wait for a client (server mode)
    pub host: Option<String>,
    /// TCP port of the server
    #[arg(short = 'p', long = "port", default_value_t = 13337)]
    pub port: u16,
    /// Test: tag_lat, tag_bw, tag_sync_lat, tag_sync_bw, ucp_am_lat, ucp_am_bw, stream_lat,
    /// stream_bw, ucp_put_lat, ucp_put_bw, ucp_get, ucp_add, ucp_fadd, ucp_swap, ucp_cswap,
    /// put_signal_lat, put_signal_bw, put_flush_signal_lat; and what --sweep runs:
    /// tag_bibw (both ways at once) and tag_win_bw (osu_bw's windows, each ended by an ack),
    /// where -n counts windows of -O messages. With --local: a comma list of the suite's
    /// tests to run; with --sweep, of OSU benchmarks (osu_latency, osu_bw, osu_bibw,
    /// osu_mbw_mr)
    #[arg(short = 't', long = "test")]
    pub test: Option<String>,
    /// Message size; a comma list is the IOV of one message (k, m suffixes)
    #[arg(short = 's', long = "size", default_value = "8")]
    pub size: String,
    /// Measured iterations (with --local: replaces every test's own count)
    #[arg(short = 'n', long = "iters", default_value = "1000000")]
    pub iters: String,
    /// Warm-up iterations; as in ucx_perftest, at most a tenth of -n (rounded up) are run
    /// (with --local: replaces every test's own count, under the same rule)
    #[arg(short = 'w', long = "warmup", default_value = "10000")]
    pub warmup: String,
    /// Outstanding operations (default 32 for tag_bw, tag_sync_bw, ucp_am_bw, ucp_put_bw,
    /// put_signal_bw; 64 for tag_bibw, tag_win_bw; 1 otherwise); 0, as in ucx_perftest, is
    /// the default
    #[arg(short = 'O', long = "outstanding")]
    pub outstanding: Option<String>,
    /// Memory types SEND[,RECV] of the message buffers: host, nic (on-NIC memory, host
    /// when there is none), cuda (two-sided tests, ucp_put_bw and ucp_get)
    #[arg(short = 'm', long = "mem", default_value = "host")]
    pub mem: String,
    /// CPUs to pin threads to (e.g. 0,2-3): the client to the first, a server started
    /// here (-l, --local) to the second, or to the next CPU when only one is given. With
    /// -T, thread k takes the k-th CPU of the list (wrapping); with -l, client and server
    /// threads alternate in it (pair k on the 2k-th and 2k+1-th)
    #[arg(short = 'c', long = "cpus")]
    pub cpus: Option<String>,
    /// Client threads running the test at once (two-sided tests). Like ucx_perftest, each
    /// thread has its own worker and endpoint (and the server a thread, worker and
    /// endpoint for each): threads sharing one worker would take one another's messages
    /// (tag matching is per worker) and turns at its lock. Implies -M multi. Rows say
    /// [thread k] (with -v, a first CSV column "thread"); the Final row aggregates as
    /// ucx_perftest's does: iterations, mean latency, total bandwidth, total message rate
    #[arg(short = 'T', long = "threads", default_value_t = 1)]
    pub threads: u32,
    /// Thread mode: single, serialized, multi
    #[arg(short = 'M', long = "thread-mode", default_value = "single")]
    pub thread_mode: String,
    /// Data layout: contig or iov (a comma list in -s implies iov)
    #[arg(short = 'D', long = "layout")]
    pub layout: Option<String>,
    /// Wait mode: poll (sleep is not supported yet)
    #[arg(short = 'E', long = "wait-mode", default_value = "poll")]
    pub wait_mode: String,
    /// Error handling (always on in Courier; accepted for compatibility)
    #[arg(short = 'e')]
    pub err_handling: bool,
    /// Print only the final numbers (with -v: only the final CSV row)
    #[arg(short = 'f')]
    pub final_only: bool,
    /// Print CSV
    #[arg(short = 'v')]
    pub csv: bool,
    /// Thousands separators
    #[arg(short = 'N')]
    pub thousands: bool,
    /// Latency percentile to report
    #[arg(short = 'R', default_value_t = 50.0)]
    pub percentile: f64,
    /// Loopback: server and client in this process
    #[arg(short = 'l')]
    pub loopback: bool,
    /// Print the final result as one JSON object (with --local: one per test, then the
    /// summary)
    #[arg(long)]
    pub json: bool,
    /// Verify message contents on the receiver
    #[arg(long)]
    pub check: bool,
    /// Run the standard suite with both processes started here, on each transport that
    /// COURIER_TLS allows (honours -t, -n, -w, -c, -M, -R, -N, --json and --check); exits 1
    /// when a test failed on a transport this machine has
    #[arg(long)]
    pub local: bool,
    /// OSU-style sweeps over message sizes 1 B .. 16 MiB: osu_latency, osu_bw, osu_bibw
    /// and (with --local) osu_mbw_mr, in OSU's output shape; -t picks some (a comma list)
    #[arg(long)]
    pub sweep: bool,
    /// Largest message size of --sweep (the sizes are the powers of 2 up to it; at most 1g)
    #[arg(long, default_value = "16m")]
    pub max_size: String,
    /// Pairs for the --sweep multi-pair message rate (with --local; 1 to 64; default: half
    /// the CPUs this process may run on, so that every process has a CPU to poll on)
    #[arg(long, default_value_t = sweep::default_pairs(), hide_default_value = true)]
    pub pairs: usize,
    /// --sweep: a tenth of the iterations (for tests)
    #[arg(long, hide = true)]
    pub quick: bool,
    /// Give up on a peer that shows no sign of life for this long (e.g. 30s, 2.5s, inf;
    /// at least 1s): a stopped or hung peer ends the run with an error naming it. On the
    /// server it also bounds the wait for a client's next test. (A peer that dies is
    /// noticed at once, or within COURIER_KEEPALIVE_TIMEOUT over the network.)
    #[arg(long = "peer-timeout", default_value = "30s")]
    pub peer_timeout: String,
    /// Server: print what it runs
    #[arg(long)]
    pub verbose: bool,
    /// Server: print "PORT <n>" on stdout once listening, and nothing else there (used by
    /// --local, which reads it; "Waiting for connection..." goes to stderr)
    #[arg(long, hide = true)]
    pub announce: bool,
    /// Server: run on these CPUs (before -c pins it; used by --local to undo the
    /// client's pinning that a child process inherits)
    #[arg(long, hide = true)]
    pub affinity: Option<String>,
    /// The ids of the options given on the command line (not defaulted), from `given_ids`.
    #[arg(skip)]
    pub given: Vec<String>,
}

impl PerfArgs {
    /// Whether the option with clap id `id` (the field's name) was on the command line.
    pub fn given(&self, id: &str) -> bool {
        self.given.iter().any(|g| g == id)
    }
}

/// The ids of the options of `m` given on the command line rather than by default.
pub fn given_ids(m: &clap::ArgMatches) -> Vec<String> {
    m.ids()
        .filter(|id| m.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine))
        .map(|id| id.as_str().to_string())
        .collect()
}

/// Validated options common to every mode.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Output mode.
    pub out: Output,
    /// Thousands separators.
    pub thousands: bool,
    /// Percentile.
    pub percentile: f64,
    /// CPUs of `-c`: the client's first, then the server's (`-l`, `--local`).
    pub cpus: Vec<usize>,
    /// The CPUs this process could run on when it started (before any pinning); empty
    /// when unknown.
    pub start_cpus: Vec<usize>,
    /// Thread mode of every worker.
    pub mode: ThreadMode,
    /// How long a peer may show no sign of life (`--peer-timeout`).
    pub peer_timeout: Duration,
    /// Client threads (`-T`).
    pub threads: usize,
    /// This process starts the server too (`-l`, `--local`): its threads share `cpus`
    /// with the client's.
    pub local_server: bool,
}

impl Settings {
    fn from_args(a: &PerfArgs) -> CliResult<Settings> {
        params::parse_mem(&a.mem)?;
        let threads = a.threads as usize;
        let mut mode = params::parse_thread_mode(&a.thread_mode)?;
        if threads == 0 || threads > engine::MAX_THREADS {
            return Err(CliError::usage(format!(
                "-T {threads}: expected 1 to {} threads",
                engine::MAX_THREADS
            )));
        }
        if threads > 1 {
            let refuse = |why: &str| Err(CliError::usage(format!("-T {threads}: {why}")));
            if a.local || a.sweep {
                return refuse(
                    "--local and --sweep run one thread per test (--sweep --pairs runs several pairs)",
                );
            }
            if a.host.is_none() && !a.loopback {
                return refuse(
                    "an option of the client; the server answers as many threads as it runs",
                );
            }
            if a.given("thread_mode") && mode == ThreadMode::Single {
                return refuse("several threads need -M multi (or serialized), as in ucx_perftest");
            }
            if !a.given("thread_mode") {
                eprintln!(
                    "courier perf: note: -T {threads} implies -M multi (each thread has its own \
                     worker, in multi-thread mode as ucx_perftest asks)"
                );
            }
            mode = ThreadMode::Multi;
        }
        if a.wait_mode != "poll" {
            return Err(CliError::usage(format!(
                "-E {}: only the poll wait mode is supported yet",
                a.wait_mode
            )));
        }
        if let Some(d) = &a.layout {
            for l in d.split(',') {
                if l != "contig" && l != "iov" {
                    return Err(CliError::usage(format!("-D {d}: expected contig or iov")));
                }
            }
        }
        if !(0.0..=100.0).contains(&a.percentile) {
            return Err(CliError::usage(format!(
                "-R {}: expected a percentile from 0 to 100",
                a.percentile
            )));
        }
        if a.pairs == 0 {
            return Err(CliError::usage(
                "--pairs 0: the multi-pair test of --sweep needs at least 1 pair",
            ));
        }
        if a.pairs > sweep::MAX_PAIRS {
            return Err(CliError::usage(format!(
                "--pairs {}: at most {} pairs (each is a server process and a client thread)",
                a.pairs,
                sweep::MAX_PAIRS
            )));
        }
        if a.json && (a.csv || a.final_only) {
            let other = if a.csv { "-v" } else { "-f" };
            return Err(CliError::usage(format!(
                "--json cannot be used with {other}: --json prints the final result as one JSON \
                 object, {other} prints {}",
                if a.csv {
                    "CSV"
                } else {
                    "the final numbers as a table row"
                }
            )));
        }
        let out = match (a.json, a.csv, a.final_only) {
            (true, _, _) => Output::Json,
            (_, true, true) => Output::CsvFinal,
            (_, true, _) => Output::Csv,
            (_, _, true) => Output::FinalOnly,
            _ => Output::Table,
        };
        let cpus = a
            .cpus
            .as_deref()
            .map(params::parse_cpus)
            .transpose()?
            .unwrap_or_default();
        let start_cpus = params::affinity().unwrap_or_default();
        Ok(Settings {
            out,
            thousands: a.thousands,
            percentile: a.percentile,
            cpus,
            start_cpus,
            mode,
            threads,
            peer_timeout: parse_peer_timeout(&a.peer_timeout)?,
            local_server: a.loopback || a.local,
        })
    }

    /// Where the client's threads run (a lone server process's too): thread k on the k-th
    /// CPU of `-c`, or the 2k-th when a server started here (`-l`) takes the others.
    pub fn client_cpus(&self) -> CpuPlan {
        CpuPlan {
            list: self.cpus.clone(),
            first: 0,
            step: if self.local_server { 2 } else { 1 },
        }
    }

    /// Where the threads of a server this process starts itself (`-l`, `--local`) run:
    /// thread k on the 2k+1-th CPU of `-c`. With one CPU given, client and server on that
    /// core would take turns at every message of a ping-pong, so the server gets the next
    /// CPU this process may use (none, left unpinned, when there is no other).
    pub fn server_cpus(&self) -> CpuPlan {
        match self.cpus[..] {
            [] => CpuPlan::default(),
            [c] => CpuPlan {
                list: next_cpu(&self.start_cpus, c).into_iter().collect(),
                first: 0,
                step: 1,
            },
            _ => CpuPlan {
                list: self.cpus.clone(),
                first: 1,
                step: 2,
            },
        }
    }

    /// Pin the calling thread, the client's first (or a lone server process), to the first
    /// CPU of `-c`.
    pub fn pin_client(&self) -> CliResult<()> {
        self.client_cpus().pin(0)
    }

    /// The CPU for a server this process starts itself: that of its first thread.
    pub fn server_cpu(&self) -> Option<usize> {
        self.server_cpus().cpu(0)
    }

    /// Pin the calling thread, a server this process started, per `server_cpu`; without
    /// one it may run anywhere this process could when it started.
    pub fn pin_server(&self) -> CliResult<()> {
        match self.server_cpu() {
            Some(c) => params::pin_to(c),
            None if !self.cpus.is_empty() && !self.start_cpus.is_empty() => {
                params::set_affinity(&self.start_cpus)
            }
            None => Ok(()),
        }
    }

    /// With one CPU in `-c` and a server started here, say where each side runs.
    pub fn note_one_cpu(&self) {
        if let [c] = self.cpus[..] {
            match self.server_cpu() {
                Some(sc) => eprintln!(
                    "courier perf: note: -c {c} names one CPU: the client is pinned to it and \
                     the server to CPU {sc}, the next one available (-c {c},{sc} says so)"
                ),
                None => eprintln!(
                    "courier perf: note: -c {c} names one CPU and no other is available: the \
                     client is pinned to it and the server is left unpinned"
                ),
            }
        }
    }
}

/// `--peer-timeout`: a duration of at least `engine::MIN_STALL` (`inf`: no limit).
fn parse_peer_timeout(v: &str) -> CliResult<Duration> {
    let d = params::parse_duration(v).ok_or_else(|| {
        CliError::usage(format!(
            "--peer-timeout {v}: expected a duration such as 30s, 2.5s, 1500ms or inf"
        ))
    })?;
    if d < engine::MIN_STALL {
        return Err(CliError::usage(format!(
            "--peer-timeout {v}: at least {:?} (a client running a one-sided test proves it \
             is alive every {:?})",
            engine::MIN_STALL,
            engine::BEAT
        )));
    }
    Ok(d)
}

/// The CPUs a side's threads are pinned to: thread k on `list[(first + k * step) % len]`,
/// unpinned when the list is empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuPlan {
    list: Vec<usize>,
    first: usize,
    step: usize,
}

impl CpuPlan {
    /// The CPU of thread `k`, if it is pinned.
    pub fn cpu(&self, k: usize) -> Option<usize> {
        let n = self.list.len();
        (n > 0).then(|| self.list[(self.first + k * self.step) % n])
    }

    /// Pin the calling thread, thread `k` of its side (left as it is when unpinned).
    pub fn pin(&self, k: usize) -> CliResult<()> {
        match self.cpu(k) {
            Some(c) => params::pin_to(c),
            None => Ok(()),
        }
    }
}

/// The CPU after `cpu` in `allowed` (wrapping around), other than `cpu` itself.
fn next_cpu(allowed: &[usize], cpu: usize) -> Option<usize> {
    allowed
        .iter()
        .copied()
        .filter(|&c| c > cpu)
        .chain(allowed.iter().copied().filter(|&c| c < cpu))
        .next()
}

fn params_from_args(a: &PerfArgs) -> CliResult<Params> {
    let name = a.test.as_deref().ok_or_else(|| {
        CliError::usage("a client needs a test: -t tag_lat (see courier perf --help)")
    })?;
    let test = TestKind::parse(name)?;
    let sizes = params::parse_sizes(&a.size)?;
    let stream = matches!(test, TestKind::StreamLat | TestKind::StreamBw);
    if sizes.len() > 1 && stream {
        return Err(CliError::usage(
            "stream tests take one message size (streams have no IOV send)",
        ));
    }
    if stream && sizes == [0] {
        return Err(CliError::usage(format!(
            "-s {}: stream tests need at least 1 byte (a stream has no empty messages: the \
             receiver would wait for bytes that never come)",
            a.size
        )));
    }
    if sizes.len() > 1
        && let Some(d) = &a.layout
        && d.split(',').next() == Some("contig")
    {
        return Err(CliError::usage(format!(
            "-D {d} with -s {}: a comma list in -s is an IOV message, which is not contiguous \
             (give -D iov, or one size for a contiguous message)",
            a.size
        )));
    }
    // As in ucx_perftest, `-O 0` (its default value) is the test's default window.
    let window = match a
        .outstanding
        .as_deref()
        .map(|o| params::parse_count("-O", o))
    {
        Some(Err(e)) => return Err(e),
        Some(Ok(0)) | None => test.default_window(),
        Some(Ok(n)) => usize::try_from(n)
            .map_err(|_| CliError::usage(format!("-O {n}: more than this machine can address")))?,
    };
    let iters = params::parse_count("-n", &a.iters)?;
    if iters == 0 {
        return Err(CliError::usage(
            "-n 0: at least 1 iteration (with none there is nothing to measure)",
        ));
    }
    let p = Params {
        test,
        sizes,
        iters,
        warmup: params::warmup_run(params::parse_count("-w", &a.warmup)?, iters),
        window,
        check: a.check,
        mem: params::parse_mem(&a.mem)?,
    };
    p.check_totals().map_err(CliError::usage)?;
    check_mem(&p)?;
    if p.test.is_rma() {
        rma::validate(&p)?;
        if a.threads > 1 {
            return Err(CliError::usage(format!(
                "-T {}: {} is one-sided; several threads run the two-sided tests",
                a.threads,
                p.test.name()
            )));
        }
    }
    Ok(p)
}

/// Memory types: CUDA must be available (the library says why not). Device memory holds
/// the message buffers of the two-sided tests and the target areas of `ucp_put_bw` and
/// `ucp_get`; the other one-sided tests have the CPU poll or update the peer's memory (or
/// run atomics), which needs host memory, and `-check` reads buffers with the CPU.
fn check_mem(p: &Params) -> CliResult<()> {
    if !p.mem.contains(&MemKind::Cuda) {
        return Ok(());
    }
    let ctx = Context::new(ContextParams::default())?;
    rma::map_memory(&ctx, MemKind::Cuda, 8)?;
    if p.check {
        return Err(CliError::usage(
            "-m cuda: -check reads the buffers with the CPU, which cannot touch device memory",
        ));
    }
    if p.test.is_rma() && !matches!(p.test, TestKind::PutBw | TestKind::Get) {
        return Err(CliError::usage(format!(
            "-m cuda: {} needs host memory (the CPU polls, signals or runs atomics on it); \
             device memory works with ucp_put_bw, ucp_get and the two-sided tests",
            p.test.name()
        )));
    }
    Ok(())
}

/// A worker on a fresh context (with remote memory access and atomics); `tls` overrides
/// COURIER_TLS.
pub fn make_worker(mode: ThreadMode, tls: Option<&str>) -> CliResult<Worker> {
    // Like ucx_perftest, the perf loops poll and never sleep: without the wakeup feature,
    // shared-memory peers skip the wakeup protocol's fence on every message.
    let mut cp = ContextParams::default().features(Features {
        rma: true,
        atomics: true,
        wakeup: false,
        ..Default::default()
    });
    if let Some(t) = tls {
        cp = cp.config("COURIER_TLS", t);
    }
    let ctx = Context::new(cp)?;
    Ok(Worker::new(&ctx, WorkerParams { thread_mode: mode })?)
}

fn resolve(host: &str, port: u16) -> CliResult<SocketAddr> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| CliError::run(format!("cannot resolve {host}: {e}")))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| CliError::run(format!("cannot resolve {host}: no address")))
}

/// Run one test on a connected link and print it per `s`.
pub fn run_test(link: &Link, p: &Params, s: &Settings, watch: Option<Watch<'_>>) -> CliResult<Row> {
    let side = engine::client_start(link, p)?;
    let mem = match &side {
        Some(sd) => sd.labels(p),
        None => p.mem.map(|k| k.name().to_string()),
    };
    let head = report::header(p, s.percentile, s.out, &mem);
    if !head.is_empty() {
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(head.as_bytes());
        let _ = o.flush();
    }
    let mut meter = Meter::new(p, s.percentile, s.out, s.thousands, watch);
    let row = engine::run_client(link, p, &mut meter, side)?;
    if s.out == Output::Json {
        let mut v = report::json(p, s.percentile, &row, link.ep.transport());
        engine::add_sides(&mut v, &engine::sides(link)?);
        println!("{v}");
    }
    Ok(row)
}

/// Start a server thread in this process (for `-l`): returns its port and a way to collect
/// its result.
pub fn spawn_server_thread(
    s: &Settings,
    verbose: bool,
) -> CliResult<(u16, mpsc::Receiver<CliResult<()>>)> {
    let (ptx, prx) = mpsc::channel::<CliResult<u16>>();
    let (dtx, drx) = mpsc::channel();
    let s2 = s.clone();
    std::thread::Builder::new()
        .name("perf-server".into())
        .spawn(move || {
            let r = (|| -> CliResult<()> {
                s2.pin_server()?;
                // The server's own worker, in the client's thread mode (multi under -T).
                let worker = make_worker(s2.mode, None)?;
                let ptx2 = ptx.clone();
                let link = engine::accept(
                    &worker,
                    SocketAddr::from(([127, 0, 0, 1], 0)),
                    s2.peer_timeout,
                    None,
                    move |port| {
                        let _ = ptx2.send(Ok(port));
                    },
                )?;
                engine::serve(
                    link,
                    &engine::ServeOpts {
                        ip: [127, 0, 0, 1].into(),
                        mode: s2.mode,
                        stall: s2.peer_timeout,
                        verbose,
                        helper: false,
                        cpus: s2.server_cpus(),
                        thread: 0,
                        // The client in this process prints the box.
                        boxes: false,
                    },
                )
            })();
            if let Err(e) = &r {
                let _ = ptx.send(Err(CliError {
                    code: e.code,
                    msg: e.msg.clone(),
                }));
            }
            let _ = dtx.send(r);
        })
        .map_err(|e| CliError::run(format!("cannot start the server thread: {e}")))?;
    let port = prx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| CliError::run("the loopback server did not start in 10 s"))??;
    Ok((port, drx))
}

/// Entry point of `courier perf`.
pub fn main(a: PerfArgs) -> CliResult<()> {
    let s = Settings::from_args(&a)?;
    if a.affinity.is_some() && (a.host.is_some() || a.loopback || a.local || a.sweep) {
        return Err(CliError::usage("--affinity is an option of the server"));
    }
    if a.local && a.sweep {
        return sweep::run(&a, &s, None);
    }
    if a.local {
        return local::run(&a, &s);
    }
    if a.sweep {
        let host = a
            .host
            .as_deref()
            .ok_or_else(|| CliError::usage("--sweep needs a server (HOST) or --local"))?;
        return sweep::run(&a, &s, Some(resolve(host, a.port)?));
    }
    if a.loopback {
        if let Some(h) = &a.host {
            return Err(CliError::usage(format!(
                "-l runs the server in this process: it cannot be used with a server to \
                 connect to ({h})"
            )));
        }
        let p = params_from_args(&a)?;
        s.note_one_cpu();
        let (port, done) = spawn_server_thread(&s, a.verbose)?;
        s.pin_client()?;
        let shown = format!("127.0.0.1:{port}");
        if s.threads > 1 {
            threads::run_client(&p, &s, SocketAddr::from(([127, 0, 0, 1], port)), &shown)?;
            return match done.recv_timeout(Duration::from_secs(10)) {
                Ok(r) => r,
                Err(_) => Err(CliError::run("the loopback server did not finish")),
            };
        }
        let worker = make_worker(s.mode, None)?;
        let link = engine::connect(
            &worker,
            SocketAddr::from(([127, 0, 0, 1], port)),
            &shown,
            s.peer_timeout,
        )?;
        run_test(&link, &p, &s, None)?;
        engine::client_finish(link);
        return match done.recv_timeout(Duration::from_secs(10)) {
            Ok(r) => r,
            Err(_) => Err(CliError::run("the loopback server did not finish")),
        };
    }
    match a.host.as_deref() {
        Some(host) => {
            let p = params_from_args(&a)?;
            s.pin_client()?;
            let addr = resolve(host, a.port)?;
            if s.threads > 1 {
                return threads::run_client(&p, &s, addr, &format!("{host}:{}", a.port));
            }
            let worker = make_worker(s.mode, None)?;
            let link =
                engine::connect(&worker, addr, &format!("{host}:{}", a.port), s.peer_timeout)?;
            run_test(&link, &p, &s, None)?;
            engine::client_finish(link);
            Ok(())
        }
        None => {
            // The client's parameters drive each test, but a test the server does not know
            // is a mistake to say at once, as ucx_perftest's server says it.
            if let Some(t) = &a.test {
                TestKind::parse(t)?;
            }
            if let Some(cpus) = &a.affinity {
                params::set_affinity(&params::parse_cpus(cpus)?)?;
            }
            s.pin_client()?;
            let worker = make_worker(s.mode, None)?;
            // As ucx_perftest's server, on stdout: "Waiting for connection...", then
            // "Accepted connection from ADDR" and, before each test, the box that
            // describes it. With --announce stdout is read by a program (--local): it
            // carries the port alone, and the banner goes to stderr.
            let announce = a.announce;
            let link = engine::accept(
                &worker,
                SocketAddr::from(([0, 0, 0, 0], a.port)),
                s.peer_timeout,
                None,
                move |port| {
                    let mut out = std::io::stdout().lock();
                    if announce {
                        eprintln!("Waiting for connection...");
                        let _ = writeln!(out, "PORT {port}");
                    } else {
                        let _ = writeln!(out, "Waiting for connection...");
                    }
                    let _ = out.flush();
                },
            )?;
            if !announce {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "Accepted connection from {}", link.peer);
                let _ = out.flush();
            }
            engine::serve(
                link,
                &engine::ServeOpts {
                    ip: [0, 0, 0, 0].into(),
                    mode: s.mode,
                    stall: s.peer_timeout,
                    verbose: a.verbose,
                    helper: false,
                    cpus: s.client_cpus(),
                    thread: 0,
                    boxes: !announce,
                },
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(cpus: &[usize], start: &[usize]) -> Settings {
        Settings {
            out: Output::Silent,
            thousands: false,
            percentile: 50.0,
            cpus: cpus.to_vec(),
            start_cpus: start.to_vec(),
            mode: ThreadMode::Single,
            peer_timeout: Duration::from_secs(30),
            threads: 1,
            local_server: true,
        }
    }

    #[test]
    fn one_cpu_puts_the_server_on_another() {
        assert_eq!(settings(&[], &[0, 1]).server_cpu(), None);
        assert_eq!(settings(&[0, 1], &[0, 1]).server_cpu(), Some(1));
        assert_eq!(settings(&[1, 1], &[0, 1]).server_cpu(), Some(1));
        assert_eq!(settings(&[0], &[0, 1]).server_cpu(), Some(1));
        assert_eq!(settings(&[1], &[0, 1]).server_cpu(), Some(0));
        assert_eq!(settings(&[2], &[0, 2, 5]).server_cpu(), Some(5));
        assert_eq!(settings(&[5], &[0, 2, 5]).server_cpu(), Some(0));
        assert_eq!(settings(&[0], &[0]).server_cpu(), None);
        assert_eq!(settings(&[0], &[]).server_cpu(), None);
    }

    /// `-T` with `-c`: thread k of each side on its own CPU of the list, wrapping; with a
    /// server started here, pair k on the 2k-th and 2k+1-th.
    #[test]
    fn threads_take_the_cpus_of_the_list_in_turn() {
        let cpus = |plan: CpuPlan| (0..5).map(|k| plan.cpu(k)).collect::<Vec<_>>();
        let local = settings(&[0, 1, 2, 3], &[0, 1, 2, 3]);
        let c = |v: &[usize]| v.iter().map(|&x| Some(x)).collect::<Vec<_>>();
        assert_eq!(cpus(local.client_cpus()), c(&[0, 2, 0, 2, 0]));
        assert_eq!(cpus(local.server_cpus()), c(&[1, 3, 1, 3, 1]));
        let lone = Settings {
            local_server: false,
            ..local.clone()
        };
        assert_eq!(cpus(lone.client_cpus()), c(&[0, 1, 2, 3, 0]));
        // Three CPUs and a local server: the pairs wrap around the list.
        let three = settings(&[4, 5, 6], &[4, 5, 6]);
        assert_eq!(cpus(three.client_cpus()), c(&[4, 6, 5, 4, 6]));
        assert_eq!(cpus(three.server_cpus()), c(&[5, 4, 6, 5, 4]));
        // One CPU: every client thread there, every server thread on the next one.
        let one = settings(&[1], &[0, 1]);
        assert_eq!(cpus(one.client_cpus()), c(&[1; 5]));
        assert_eq!(cpus(one.server_cpus()), c(&[0; 5]));
        // No -c: nobody is pinned.
        assert_eq!(cpus(settings(&[], &[0, 1]).client_cpus()), vec![None; 5]);
        assert_eq!(cpus(settings(&[], &[0, 1]).server_cpus()), vec![None; 5]);
    }
}
