//! The `COURIER_*` configuration table.
//!
//! Every variable has a name, a default, a one-line help and a parser. Values come from the
//! environment and may be overridden in code (`Config::set`). A value that does not parse is
//! an error that names the variable and the accepted values; nothing is silently ignored.

use std::collections::BTreeMap;
use std::time::Duration;

use super::status::{Error, Result, Status};

/// One configuration variable.
#[derive(Clone, Copy, Debug)]
pub struct Var {
    /// Full name, e.g. `COURIER_TLS`.
    pub name: &'static str,
    /// Default value as written in the environment.
    pub default: &'static str,
    /// One-line help.
    pub help: &'static str,
    /// What values are accepted, for error messages.
    pub accepts: &'static str,
}

/// The table. `courier info -c` prints it; the C ABI lists it.
pub const VARS: &[Var] = &[
    Var {
        name: "COURIER_TLS",
        default: "all",
        help: "Transports to use: 'all', a comma list of self,shm,tcp (aliases of shm: sm, posix, cma), or '^' followed by a list to exclude",
        accepts: "all | self,shm,tcp | ^list (names in any case; aliases of shm: sm, posix, cma)",
    },
    Var {
        name: "COURIER_NET_DEVICES",
        default: "all",
        help: "Network interfaces a worker listens on and puts in its address for tcp: 'all' or a comma list of interface names (e.g. lo,eth0); a connection to a listener's socket address goes the way the kernel routes it",
        accepts: "all | comma list of interface names",
    },
    Var {
        name: "COURIER_AUTH",
        default: "auto",
        help: "Who may connect: 'auto' (with a key every peer must prove it holds it; without one only this host's peers are accepted), 'required' (a key is needed and every peer proves it), 'off' (any peer that reaches the worker; trusted networks only)",
        accepts: "auto | required | off",
    },
    Var {
        name: "COURIER_AUTH_KEY_FILE",
        default: "",
        help: "File holding the shared authentication key (at least 16 bytes; the user's own, mode 0600, as ssh wants its keys); unset: the job's key under `courier run`, else none",
        accepts: "a path, or empty",
    },
    Var {
        name: "COURIER_LOG_LEVEL",
        default: "warn",
        help: "Logging level: error, warn, info, debug, trace (any case; fatal = error, warning = warn)",
        accepts: "error | warn | info | debug | trace",
    },
    Var {
        name: "COURIER_RNDV_THRESH",
        default: "auto",
        help: "Message size from which tag and active messages use rendezvous ('auto' picks per transport)",
        accepts: "auto | a size such as 8192, 16k, 1m",
    },
    Var {
        name: "COURIER_CMA_SPLIT",
        default: "256k",
        help: "Rendezvous size from which both sides of a shared-memory link copy half of a message each with CMA, in parallel ('off' disables)",
        accepts: "off | a size such as 256k, 1m",
    },
    Var {
        name: "COURIER_RNDV_PIECE",
        default: "1m",
        help: "Most bytes of single-copy rendezvous reads and writes made in one call into the library (small copies share it, a longer one goes a piece per call); pieces shrink to take about 30 us when memory is slow ('off': whole copies)",
        accepts: "off | a size such as 512k, 1m",
    },
    Var {
        name: "COURIER_SHM_SEGMENT_COPY",
        default: "yes",
        help: "Rendezvous on shared memory copies buffers allocated by mem_map with plain loads and stores through their shared segment, instead of CMA",
        accepts: "yes | no (any case; also on/off, y/n, 1/0)",
    },
    Var {
        name: "COURIER_KEEPALIVE_INTERVAL",
        default: "1s",
        help: "How often a link checks that its peer is alive: TCP keepalive probes on an idle tcp connection (whole seconds: rounded up, at least 1s), and, on every transport, a keepalive frame to a peer this side waits on that has said nothing for this long",
        accepts: "a duration above 0: a number with us, ms, s or m (minutes), e.g. 1s, 2.5s",
    },
    Var {
        name: "COURIER_KEEPALIVE_TIMEOUT",
        default: "2s",
        help: "Silence after which a peer is declared failed: a tcp peer whose host stops answering (TCP_USER_TIMEOUT, keepalive probes), and on every transport a peer this side waits on (a request, a flush) that does not answer keepalive frames because it is stopped or no longer progresses ('inf': never); a flush waits on a peer twice this, 5 s to 60 s",
        accepts: "a duration no shorter than COURIER_KEEPALIVE_INTERVAL (a number with us, ms, s or m for minutes, e.g. 2s, 1500ms), or inf",
    },
    Var {
        name: "COURIER_SIGNAL_NAP",
        default: "1ms",
        help: "Longest sleep of a sleeping signal wait before it looks at the word again, for writes that wake no one (another thread, a peer's atomic; a put-with-signal wakes the waiting worker itself)",
        accepts: "a duration (a number with us, ms, s or m for minutes, e.g. 1ms, 200us); inf: only a wakeup ends the sleep",
    },
    Var {
        name: "COURIER_SHM_FIFO_SIZE",
        default: "1024",
        help: "Cells in each shared-memory FIFO (a power of two; 256 bytes each)",
        accepts: "a power of two from 16 to 65536",
    },
    Var {
        name: "COURIER_SHM_CMA",
        default: "auto",
        help: "Single-copy transfers with process_vm_readv: auto (probe), yes (required), no (bounce buffers)",
        accepts: "auto | yes | no (any case; also on/off, y/n, 1/0)",
    },
    Var {
        name: "COURIER_TCP_SNDBUF",
        default: "4m",
        help: "TCP send buffer size (0 keeps the system default; the kernel caps it at net.core.wmem_max)",
        accepts: "a size up to 2147483647 bytes (setsockopt takes an int), such as 4m",
    },
    Var {
        name: "COURIER_TCP_RCVBUF",
        default: "4m",
        help: "TCP receive buffer size (0 keeps the system default; the kernel caps it at net.core.rmem_max)",
        accepts: "a size up to 2147483647 bytes (setsockopt takes an int), such as 4m",
    },
    Var {
        name: "COURIER_CUDA_LIB",
        default: "libcuda.so.1",
        help: "The CUDA driver library, loaded at run time when CUDA memory is used (or when the application has loaded it)",
        accepts: "a library name or path (no control characters)",
    },
    Var {
        name: "COURIER_CUDA_IPC_THRESH",
        default: "16k",
        help: "Tag messages from CUDA device memory of at least this size go to a same-host peer as an offer of the device memory itself, read by the peer through the allocation's IPC handle (device to device into device memory); smaller ones as a host copy, sent eagerly",
        accepts: "a size such as 0, 4k, 64k",
    },
    Var {
        name: "COURIER_CUDA_STAGING",
        default: "256m",
        help: "Most page-locked host memory a process keeps for copies of CUDA device memory (host copies of messages, bounce buffers); beyond it, host copies are ordinary memory and receives from host memory go through two bounce buffers (the last context created sets it for the process)",
        accepts: "a size such as 64m, 1g (0: ordinary memory only)",
    },
    Var {
        name: "COURIER_TCP_CONNECT_TIMEOUT",
        default: "5s",
        help: "How long a TCP connection attempt may take",
        accepts: "a duration above 0 (a number with us, ms, s or m for minutes, e.g. 5s), or inf",
    },
    Var {
        name: "COURIER_TCP_CONGESTION",
        default: "auto",
        help: "TCP congestion control: auto (reno for connections within this host, where no network is shared; the system's otherwise), system, or an algorithm for every connection",
        accepts: "auto | system | an algorithm name (reno, cubic, bbr, ...)",
    },
    Var {
        name: "COURIER_JOB_LAUNCHER",
        default: "auto",
        help: "Which launcher Job::init talks to: auto (courier run, then PMIx, PMI-2, PMI-1, else a job of one), run, pmix, pmi2, pmi1 or single",
        accepts: "auto | run | pmix | pmi2 | pmi1 | single",
    },
    Var {
        name: "COURIER_JOB_TIMEOUT",
        default: "120s",
        help: "How long Job::init waits for every rank at its start-up fence (under launchers that cannot say when a rank died before it, such as hydra), and JobWorld's default for fences and address lookups",
        accepts: "a duration above 0 (a number with us, ms, s or m for minutes, e.g. 120s)",
    },
    Var {
        name: "COURIER_PMIX_LIB",
        default: "libpmix.so.2",
        help: "The PMIx client library loaded at run time when mpirun or srun --mpi=pmix started the process",
        accepts: "a library name or path",
    },
    Var {
        name: "COURIER_RUN_FD",
        default: "none",
        help: "Set by courier run in each rank: the descriptor of the rank's socket to the launcher (not set by users)",
        accepts: "a descriptor number",
    },
    Var {
        name: "COURIER_RUN_RANK",
        default: "none",
        help: "Set by courier run in each rank: its rank, for scripts (programs use Job::rank)",
        accepts: "a number",
    },
    Var {
        name: "COURIER_RUN_SIZE",
        default: "none",
        help: "Set by courier run in each rank: the number of ranks, for scripts (programs use Job::size)",
        accepts: "a number",
    },
    Var {
        name: "COURIER_MAX_UNEXPECTED_EP",
        default: "32m",
        help: "Most bytes of tag messages (and rendezvous offers) one endpoint's peer may have waiting for a receive; a peer that sends more fails its endpoint with an error naming this limit",
        accepts: "a size of at least 64k, such as 32m",
    },
    Var {
        name: "COURIER_MAX_UNEXPECTED",
        default: "128m",
        help: "Most bytes that all peers of a worker together may have waiting for the application (unexpected tag messages and stream bytes not yet received); the endpoint whose message would pass it fails with an error naming this limit",
        accepts: "a size of at least 64k, such as 128m",
    },
    Var {
        name: "COURIER_MAX_STREAM_EP",
        default: "16m",
        help: "Most stream bytes one endpoint's peer may have sent that the application has not received yet; a peer that sends more fails its endpoint with an error naming this limit",
        accepts: "a size of at least 64k, such as 16m",
    },
    Var {
        name: "COURIER_MAX_REPLY_QUEUE",
        default: "16m",
        help: "Most memory of answers (one-sided get data copies, acknowledgements) queued for one peer that does not read them; past it the endpoint fails with an error naming this limit",
        accepts: "a size of at least 64k, such as 16m",
    },
    Var {
        name: "COURIER_MAX_CONNECTING",
        default: "256",
        help: "Most accepted connections of a worker still in setup (not yet introduced); a new one beyond it pushes out the oldest",
        accepts: "a number from 1 to 1000000",
    },
    Var {
        name: "COURIER_MAX_ACCEPTED",
        default: "4096",
        help: "Most endpoints peers' connections may have made in one worker (through its address or its listeners); connections beyond it are refused",
        accepts: "a number from 1 to 1000000",
    },
    Var {
        name: "COURIER_MAX_ACCEPTED_LISTENER",
        default: "1024",
        help: "Most endpoints the connections accepted by one listener may have made; connections beyond it are refused",
        accepts: "a number from 1 to 1000000",
    },
];

/// Parsed configuration.
#[derive(Clone, Debug)]
pub struct Config {
    raw: BTreeMap<&'static str, String>,
    /// Transport selection.
    pub tls: TlsSelection,
    /// Interfaces tcp may use; `None` = all.
    pub net_devices: Option<Vec<String>>,
    /// Who may connect (`COURIER_AUTH`).
    pub auth: super::auth::AuthMode,
    /// The key file named by `COURIER_AUTH_KEY_FILE`.
    pub auth_key_file: Option<std::path::PathBuf>,
    /// The authentication key in force (the key file's or the job's), resolved when the
    /// context is made (`auth::resolve`); not an environment variable itself.
    pub auth_key: Option<std::sync::Arc<super::auth::Key>>,
    /// Logging level.
    pub log_level: LogLevel,
    /// Rendezvous threshold; `None` = per transport.
    pub rndv_thresh: Option<usize>,
    /// Split-copy threshold for CMA rendezvous; `None` = off.
    pub cma_split: Option<usize>,
    /// Largest single-copy rendezvous copy made in one call; `None` = no limit.
    pub rndv_piece: Option<usize>,
    /// Copy rendezvous data through shared segments of allocated memory.
    pub shm_segment_copy: bool,
    /// Keepalive interval.
    pub keepalive_interval: Duration,
    /// Keepalive timeout.
    pub keepalive_timeout: Duration,
    /// Longest sleep of a sleeping signal wait between looks at the word.
    pub signal_nap: Duration,
    /// Cells per shm FIFO.
    pub shm_fifo_size: usize,
    /// CMA policy.
    pub shm_cma: CmaPolicy,
    /// TCP buffer sizes.
    pub tcp_sndbuf: usize,
    /// TCP buffer sizes.
    pub tcp_rcvbuf: usize,
    /// TCP connect timeout.
    pub tcp_connect_timeout: Duration,
    /// TCP congestion control.
    pub tcp_congestion: TcpCongestion,
    /// The CUDA driver library.
    pub cuda_lib: String,
    /// Page-locked host memory kept for copies of device memory, at most.
    pub cuda_staging: usize,
    /// Tag messages from device memory from this size are offered through CUDA IPC.
    pub cuda_ipc_thresh: usize,
    /// Resource limits: what peers may make a worker spend (`COURIER_MAX_*`).
    pub limits: Limits,
    /// Whether this process may sleep on its event fd (the context's `wakeup` feature; not
    /// an environment variable). Without it, shared-memory peers skip the wakeup protocol.
    pub wakeup: bool,
}

/// What peers may make a worker spend (`COURIER_MAX_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of unexpected tag messages from one endpoint's peer.
    pub unexpected_ep: usize,
    /// Bytes waiting for the application in a worker: unexpected messages and stream bytes.
    pub unexpected: usize,
    /// Stream bytes of one endpoint not yet received.
    pub stream_ep: usize,
    /// Memory of answers queued for one peer.
    pub reply_queue: usize,
    /// Accepted connections in setup per worker.
    pub connecting: usize,
    /// Endpoints made by peers' connections per worker.
    pub accepted: usize,
    /// Endpoints made by one listener's connections.
    pub accepted_listener: usize,
}

/// Which congestion control tcp connections use (`COURIER_TCP_CONGESTION`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TcpCongestion {
    /// Reno between two ends on this host, the system's default otherwise.
    Auto,
    /// Leave every connection to the system's default.
    System,
    /// This algorithm on every connection.
    Named(String),
}

/// Transport names known to Courier.
pub const TRANSPORTS: [&str; 3] = ["self", "shm", "tcp"];

/// The effective `COURIER_TLS`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSelection {
    allowed: [bool; 3],
    /// The value as given.
    pub spec: String,
}

impl TlsSelection {
    /// Parse `all`, `a,b`, or `^a,b`.
    pub fn parse(v: &str) -> Result<TlsSelection> {
        let v = v.trim();
        let lower = v.to_ascii_lowercase();
        let err = |what: String| {
            Error::msg(
                Status::BadConfig,
                format!(
                    "COURIER_TLS={v:?}: {what}; accepted: all, a comma list of self, shm, tcp (aliases: sm, posix, cma = shm), or ^list to exclude"
                ),
            )
        };
        if v.is_empty() {
            return Err(err("empty value".into()));
        }
        if lower == "all" {
            return Ok(TlsSelection {
                allowed: [true; 3],
                spec: v.into(),
            });
        }
        let (deny, list) = match lower.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, lower.as_str()),
        };
        let mut named = [false; 3];
        for name in list.split(',').map(str::trim) {
            let idx = match name {
                "self" => 0,
                "shm" | "sm" | "posix" | "cma" => 1,
                "tcp" => 2,
                "" => return Err(err("empty name in list".into())),
                other => return Err(err(format!("unknown transport {other:?}"))),
            };
            named[idx] = true;
        }
        let allowed = if deny { named.map(|n| !n) } else { named };
        if !allowed.contains(&true) {
            return Err(err("excludes every transport".into()));
        }
        Ok(TlsSelection {
            allowed,
            spec: v.into(),
        })
    }

    /// Whether a transport is allowed.
    pub fn allows(&self, name: &str) -> bool {
        TRANSPORTS
            .iter()
            .position(|t| *t == name)
            .map(|i| self.allowed[i])
            .unwrap_or(false)
    }

    /// The allowed transports in order.
    pub fn effective(&self) -> String {
        let v: Vec<&str> = TRANSPORTS
            .iter()
            .zip(self.allowed)
            .filter(|(_, a)| *a)
            .map(|(t, _)| *t)
            .collect();
        v.join(",")
    }
}

/// Logging levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings and errors.
    Warn,
    /// Selection lines and notable events.
    Info,
    /// Protocol events.
    Debug,
    /// Everything.
    Trace,
}

/// CMA policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmaPolicy {
    /// Probe at connect time; fall back to bounce buffers if refused.
    Auto,
    /// Required: fail the connection if refused.
    Yes,
    /// Never: always bounce buffers.
    No,
}

fn var(name: &str) -> &'static Var {
    VARS.iter()
        .find(|v| v.name == name)
        .expect("config table lists every variable it parses")
}

fn bad(name: &str, value: &str, why: &str) -> Error {
    let v = var(name);
    Error::msg(
        Status::BadConfig,
        format!("{name}={value:?}: {why}; accepted: {}", v.accepts),
    )
}

/// Parse a size: `4096`, `16k`, `4m`, `1g` (binary units), case-insensitive, optional `b`.
pub fn parse_size(s: &str) -> Option<usize> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix('b').unwrap_or(&t);
    let (num, mul) = match t.chars().last()? {
        'k' => (&t[..t.len() - 1], 1usize << 10),
        'm' => (&t[..t.len() - 1], 1 << 20),
        'g' => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.trim().parse::<usize>().ok()?.checked_mul(mul)
}

impl Config {
    /// How long an operation that waits on a peer may take before Courier gives up on it
    /// (a flush, a request dropped while in flight): twice the keepalive timeout, from 5 s
    /// to 60 s.
    pub fn give_up_after(&self) -> Duration {
        self.keepalive_timeout
            .saturating_mul(2)
            .clamp(Duration::from_secs(5), Duration::from_secs(60))
    }
}

/// Parse a duration: `500ms`, `2s`, `1.5s`, `100us`, `inf`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let t = s.trim().to_ascii_lowercase();
    if t == "inf" {
        return Some(Duration::MAX);
    }
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t.as_str(), 1.0)
    };
    let v: f64 = num.trim().parse().ok()?;
    if !v.is_finite() || v < 0.0 {
        return None;
    }
    // A finite number can still be too large for a Duration (`1e30s`): not a duration.
    Duration::try_from_secs_f64(v * scale).ok()
}

/// `d` rounded up to whole seconds, at least one (`Duration::MAX` stays).
fn whole_seconds(d: Duration) -> Duration {
    if d == Duration::MAX {
        return d;
    }
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    Duration::from_secs(s.max(1))
}

/// `COURIER_*` variables in the environment that are not in the table (almost always typos;
/// `COURIER_TEST_*` belong to the test suites).
pub fn unknown_vars() -> Vec<String> {
    std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| {
            k.starts_with("COURIER_")
                && !VARS.iter().any(|v| v.name == k)
                && !k.starts_with("COURIER_TEST_")
        })
        .collect()
}

/// The known variable closest to `name` (a typo's likely intent), if one is near enough:
/// at most 3 single-character edits (insert, delete, replace, swap two neighbours) and
/// fewer than a third of the name.
pub fn closest_var(name: &str) -> Option<&'static str> {
    let a: Vec<char> = name.chars().collect();
    VARS.iter()
        .map(|v| {
            (
                edit_distance(&a, &v.name.chars().collect::<Vec<_>>()),
                v.name,
            )
        })
        .filter(|&(d, _)| d <= 3 && d * 3 < a.len().max(1))
        .min_by_key(|&(d, _)| d)
        .map(|(_, n)| n)
}

/// Optimal string alignment distance (Levenshtein with transpositions).
fn edit_distance(a: &[char], b: &[char]) -> usize {
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[a.len()][b.len()]
}

/// What to say about an unknown `COURIER_*` variable: that it is ignored, and the known
/// name it most likely meant.
pub fn unknown_var_message(name: &str) -> String {
    match closest_var(name) {
        Some(near) => format!(
            "{name} is not a Courier variable (did you mean {near}?); ignored (`courier info -c` lists them)"
        ),
        None => format!("{name} is not a Courier variable; ignored (`courier info -c` lists them)"),
    }
}

/// Warn once per process (at the first context) about each unknown `COURIER_*` variable in
/// the environment, as UCX does for `UCX_*`: a misspelt name is otherwise silently ignored.
pub fn warn_unknown_vars_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for k in unknown_vars() {
            tracing::warn!("{}", unknown_var_message(&k));
        }
    });
}

impl Config {
    /// Read every variable from the environment, then apply `overrides` (name → value).
    pub fn from_env_with(overrides: &[(&str, &str)]) -> Result<Config> {
        let mut raw = BTreeMap::new();
        for v in VARS {
            let val = match std::env::var(v.name) {
                Ok(val) => val,
                Err(std::env::VarError::NotPresent) => v.default.to_string(),
                Err(std::env::VarError::NotUnicode(os)) => {
                    return Err(bad(v.name, &os.to_string_lossy(), "not valid UTF-8"));
                }
            };
            raw.insert(v.name, val);
        }
        for (k, val) in overrides {
            let v = VARS.iter().find(|v| v.name == *k).ok_or_else(|| {
                Error::msg(
                    Status::BadConfig,
                    format!("{k} is not a Courier configuration variable"),
                )
            })?;
            raw.insert(v.name, val.to_string());
        }
        Config::parse(raw)
    }

    /// Read every variable from the environment.
    pub fn from_env() -> Result<Config> {
        Config::from_env_with(&[])
    }

    fn parse(raw: BTreeMap<&'static str, String>) -> Result<Config> {
        let get = |n: &str| raw.get(n).map(String::as_str).unwrap_or(var(n).default);
        let size = |n: &str| parse_size(get(n)).ok_or_else(|| bad(n, get(n), "not a size"));
        let auto_size = |n: &str| -> Result<Option<usize>> {
            if get(n).trim() == "auto" {
                Ok(None)
            } else {
                size(n).map(Some)
            }
        };
        let dur = |n: &str| parse_duration(get(n)).ok_or_else(|| bad(n, get(n), "not a duration"));

        let tls = TlsSelection::parse(get("COURIER_TLS"))?;
        let nd = get("COURIER_NET_DEVICES").trim();
        let net_devices = if nd == "all" {
            None
        } else {
            let list: Vec<String> = nd.split(',').map(|s| s.trim().to_string()).collect();
            if list.iter().any(String::is_empty) {
                let why = if nd.is_empty() {
                    "empty list"
                } else {
                    "empty name in list"
                };
                return Err(bad("COURIER_NET_DEVICES", nd, why));
            }
            Some(list)
        };
        let auth = super::auth::AuthMode::parse(get("COURIER_AUTH"))
            .ok_or_else(|| bad("COURIER_AUTH", get("COURIER_AUTH"), "unknown mode"))?;
        let kf = get("COURIER_AUTH_KEY_FILE").trim();
        let auth_key_file = (!kf.is_empty()).then(|| std::path::PathBuf::from(kf));
        let log_level = match get("COURIER_LOG_LEVEL")
            .trim()
            .to_ascii_lowercase()
            .as_str()
        {
            "error" | "fatal" => LogLevel::Error,
            "warn" | "warning" => LogLevel::Warn,
            "info" => LogLevel::Info,
            "debug" => LogLevel::Debug,
            "trace" => LogLevel::Trace,
            _ => {
                return Err(bad(
                    "COURIER_LOG_LEVEL",
                    get("COURIER_LOG_LEVEL"),
                    "unknown level",
                ));
            }
        };
        let keepalive_interval = dur("COURIER_KEEPALIVE_INTERVAL")?;
        if keepalive_interval.is_zero() {
            return Err(bad(
                "COURIER_KEEPALIVE_INTERVAL",
                get("COURIER_KEEPALIVE_INTERVAL"),
                "zero",
            ));
        }
        // TCP keepalive counts whole seconds: what is in force is rounded up, at least 1 s.
        let keepalive_interval = whole_seconds(keepalive_interval);
        let keepalive_timeout = dur("COURIER_KEEPALIVE_TIMEOUT")?;
        if keepalive_timeout < keepalive_interval {
            return Err(Error::msg(
                Status::BadConfig,
                format!(
                    "COURIER_KEEPALIVE_TIMEOUT={:?} is shorter than COURIER_KEEPALIVE_INTERVAL={:?} (in force: {keepalive_interval:?}); a peer would be given up before it was asked once; accepted: {}",
                    get("COURIER_KEEPALIVE_TIMEOUT"),
                    get("COURIER_KEEPALIVE_INTERVAL"),
                    var("COURIER_KEEPALIVE_TIMEOUT").accepts
                ),
            ));
        }
        let shm_fifo_size = get("COURIER_SHM_FIFO_SIZE")
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| n.is_power_of_two() && (16..=65536).contains(n))
            .ok_or_else(|| {
                bad(
                    "COURIER_SHM_FIFO_SIZE",
                    get("COURIER_SHM_FIFO_SIZE"),
                    "not a power of two in range",
                )
            })?;
        let shm_cma = match get("COURIER_SHM_CMA").trim().to_ascii_lowercase().as_str() {
            "auto" => CmaPolicy::Auto,
            "yes" | "y" | "on" | "1" => CmaPolicy::Yes,
            "no" | "n" | "off" | "0" => CmaPolicy::No,
            _ => {
                return Err(bad(
                    "COURIER_SHM_CMA",
                    get("COURIER_SHM_CMA"),
                    "unknown policy",
                ));
            }
        };
        let tcp_congestion = match get("COURIER_TCP_CONGESTION").trim() {
            "auto" => TcpCongestion::Auto,
            "system" => TcpCongestion::System,
            name if !name.is_empty()
                && name.len() < 16
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') =>
            {
                TcpCongestion::Named(name.to_string())
            }
            other => {
                return Err(bad(
                    "COURIER_TCP_CONGESTION",
                    other,
                    "not an algorithm name",
                ));
            }
        };
        let shm_segment_copy = match get("COURIER_SHM_SEGMENT_COPY")
            .trim()
            .to_ascii_lowercase()
            .as_str()
        {
            "yes" | "y" | "on" | "1" => true,
            "no" | "n" | "off" | "0" => false,
            _ => {
                return Err(bad(
                    "COURIER_SHM_SEGMENT_COPY",
                    get("COURIER_SHM_SEGMENT_COPY"),
                    "not yes or no",
                ));
            }
        };
        // setsockopt takes an int.
        let sockbuf = |n: &str| {
            size(n)?
                .try_into()
                .map(|b: i32| b as usize)
                .map_err(|_| bad(n, get(n), "larger than setsockopt's int"))
        };
        let tcp_connect_timeout = dur("COURIER_TCP_CONNECT_TIMEOUT")?;
        if tcp_connect_timeout.is_zero() {
            return Err(bad(
                "COURIER_TCP_CONNECT_TIMEOUT",
                get("COURIER_TCP_CONNECT_TIMEOUT"),
                "zero: no connection could be made",
            ));
        }
        let limit_size = |n: &str| {
            size(n).and_then(|v| {
                if v < 64 << 10 {
                    Err(bad(n, get(n), "below 64k"))
                } else {
                    Ok(v)
                }
            })
        };
        let count = |n: &str| {
            get(n)
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|v| (1..=1_000_000).contains(v))
                .ok_or_else(|| bad(n, get(n), "not a number in range"))
        };
        let limits = Limits {
            unexpected_ep: limit_size("COURIER_MAX_UNEXPECTED_EP")?,
            unexpected: limit_size("COURIER_MAX_UNEXPECTED")?,
            stream_ep: limit_size("COURIER_MAX_STREAM_EP")?,
            reply_queue: limit_size("COURIER_MAX_REPLY_QUEUE")?,
            connecting: count("COURIER_MAX_CONNECTING")?,
            accepted: count("COURIER_MAX_ACCEPTED")?,
            accepted_listener: count("COURIER_MAX_ACCEPTED_LISTENER")?,
        };
        Ok(Config {
            limits,
            tls,
            net_devices,
            auth,
            auth_key_file,
            auth_key: None,
            log_level,
            rndv_thresh: auto_size("COURIER_RNDV_THRESH")?,
            cma_split: match get("COURIER_CMA_SPLIT").trim() {
                "off" | "no" | "0" => None,
                other => Some(
                    parse_size(other)
                        .ok_or_else(|| bad("COURIER_CMA_SPLIT", other, "not a size or 'off'"))?,
                ),
            },
            rndv_piece: match get("COURIER_RNDV_PIECE").trim() {
                "off" | "no" | "0" => None,
                other => Some(parse_size(other).filter(|&n| n >= 4096).ok_or_else(|| {
                    bad(
                        "COURIER_RNDV_PIECE",
                        other,
                        "not a size of at least 4k or 'off'",
                    )
                })?),
            },
            shm_segment_copy,
            keepalive_interval,
            keepalive_timeout,
            signal_nap: dur("COURIER_SIGNAL_NAP")?,
            shm_fifo_size,
            shm_cma,
            tcp_sndbuf: sockbuf("COURIER_TCP_SNDBUF")?,
            tcp_rcvbuf: sockbuf("COURIER_TCP_RCVBUF")?,
            tcp_connect_timeout,
            tcp_congestion,
            cuda_lib: match get("COURIER_CUDA_LIB").trim() {
                "" => return Err(bad("COURIER_CUDA_LIB", "", "empty")),
                lib if lib.chars().any(char::is_control) => {
                    return Err(bad("COURIER_CUDA_LIB", lib, "contains a control character"));
                }
                lib => lib.to_string(),
            },
            cuda_ipc_thresh: parse_size(get("COURIER_CUDA_IPC_THRESH")).ok_or_else(|| {
                bad(
                    "COURIER_CUDA_IPC_THRESH",
                    get("COURIER_CUDA_IPC_THRESH"),
                    "not a size",
                )
            })?,
            cuda_staging: parse_size(get("COURIER_CUDA_STAGING")).ok_or_else(|| {
                bad(
                    "COURIER_CUDA_STAGING",
                    get("COURIER_CUDA_STAGING"),
                    "not a size",
                )
            })?,
            wakeup: true,
            raw,
        })
    }

    /// Override one variable in code; the whole configuration is re-checked.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        let v = VARS.iter().find(|v| v.name == name).ok_or_else(|| {
            Error::msg(
                Status::BadConfig,
                format!("{name} is not a Courier configuration variable"),
            )
        })?;
        let mut raw = self.raw.clone();
        raw.insert(v.name, value.to_string());
        *self = Config::parse(raw)?;
        Ok(())
    }

    /// The value in force for a variable, as text.
    pub fn value(&self, name: &str) -> Option<&str> {
        self.raw.get(name).map(String::as_str)
    }

    /// Where the library uses another value than the one given for `name` (it rounds it),
    /// that value as text and why; `None` where it uses the value as given.
    pub fn adjusted(&self, name: &str) -> Option<(String, &'static str)> {
        match name {
            "COURIER_KEEPALIVE_INTERVAL" => {
                let d = self.keepalive_interval;
                (parse_duration(self.value(name)?) != Some(d)).then(|| {
                    (
                        format!("{}s", d.as_secs()),
                        "TCP keepalive counts whole seconds",
                    )
                })
            }
            _ => None,
        }
    }

    /// Every variable with its value in force, in table order.
    pub fn entries(&self) -> Vec<(&'static Var, &str)> {
        VARS.iter()
            .map(|v| (v, self.value(v.name).unwrap_or(v.default)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg(over: &[(&str, &str)]) -> Result<Config> {
        let mut raw = BTreeMap::new();
        for v in VARS {
            raw.insert(v.name, v.default.to_string());
        }
        for (k, val) in over {
            raw.insert(var(k).name, val.to_string());
        }
        Config::parse(raw)
    }

    #[test]
    fn defaults_parse() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.tls.effective(), "self,shm,tcp");
        assert_eq!(c.keepalive_timeout, Duration::from_secs(2));
        assert_eq!(c.rndv_thresh, None);
        // Small-message streams run ahead of their receiver only when the cells they touch
        // (a line each) outgrow a core's first-level cache: see the analysis in bench/.
        assert_eq!(c.shm_fifo_size, 1024);
    }

    /// COURIER_BCOPY_THRESH was listed and parsed but never read; it is gone, and setting it
    /// in code is refused (in the environment it is warned about like any unknown name).
    #[test]
    fn closest_names_for_typos() {
        assert_eq!(closest_var("COURIER_TSL"), Some("COURIER_TLS"));
        assert_eq!(closest_var("COURIER_LOG_LEVL"), Some("COURIER_LOG_LEVEL"));
        assert_eq!(
            closest_var("COURIER_RNDV_TRESH"),
            Some("COURIER_RNDV_THRESH")
        );
        assert_eq!(closest_var("COURIER_SOMETHING_ELSE_ENTIRELY"), None);
        assert!(unknown_var_message("COURIER_TSL").contains("did you mean COURIER_TLS?"));
        assert!(!unknown_var_message("COURIER_ZZZZZZZZZZZZZZZ").contains("did you mean"));
    }

    #[test]
    fn bcopy_thresh_is_not_a_variable() {
        assert!(VARS.iter().all(|v| v.name != "COURIER_BCOPY_THRESH"));
        let e = Config::from_env_with(&[("COURIER_BCOPY_THRESH", "4k")])
            .expect_err("an unknown variable");
        assert_eq!(e.status(), Status::BadConfig);
        assert!(
            e.to_string()
                .contains("not a Courier configuration variable"),
            "{e}"
        );
    }

    #[test]
    fn tls_lists_and_exclusions() {
        let t = TlsSelection::parse("^shm").unwrap();
        assert!(t.allows("self") && !t.allows("shm") && t.allows("tcp"));
        let t = TlsSelection::parse("tcp").unwrap();
        assert_eq!(t.effective(), "tcp");
        let t = TlsSelection::parse("sm,self").unwrap();
        assert_eq!(t.effective(), "self,shm");
    }

    #[test]
    fn bad_values_name_the_variable_and_accepted_values() {
        let e = cfg(&[("COURIER_TLS", "tcp,ib")]).unwrap_err();
        assert_eq!(e.status(), Status::BadConfig);
        assert!(
            e.detail().contains("COURIER_TLS")
                && e.detail().contains("\"ib\"")
                && e.detail().contains("accepted"),
            "{e}"
        );
        for (k, v) in [
            ("COURIER_RNDV_THRESH", "lots"),
            ("COURIER_CUDA_STAGING", "plenty"),
            ("COURIER_CUDA_IPC_THRESH", "big"),
        ] {
            let e = cfg(&[(k, v)]).unwrap_err();
            assert!(
                e.detail().contains(k) && e.detail().contains("a size"),
                "{e}"
            );
        }
        let e = cfg(&[("COURIER_SHM_FIFO_SIZE", "100")]).unwrap_err();
        assert!(e.detail().contains("power of two"), "{e}");
        let e = cfg(&[("COURIER_LOG_LEVEL", "loud")]).unwrap_err();
        assert!(e.detail().contains("COURIER_LOG_LEVEL"), "{e}");
        let e = cfg(&[("COURIER_KEEPALIVE_TIMEOUT", "100ms")]).unwrap_err();
        assert!(e.detail().contains("shorter"), "{e}");
        let e = cfg(&[("COURIER_TCP_CONGESTION", "re no")]).unwrap_err();
        assert!(e.detail().contains("COURIER_TCP_CONGESTION"), "{e}");
        assert_eq!(cfg(&[]).unwrap().cuda_ipc_thresh, 16 << 10);
        assert_eq!(cfg(&[]).unwrap().cuda_staging, 256 << 20);
        assert_eq!(
            cfg(&[("COURIER_CUDA_STAGING", "0")]).unwrap().cuda_staging,
            0
        );
    }

    /// Values that parse as sizes or durations but cannot work are refused when read, with
    /// the variable named, instead of failing every connection later; names and yes/no
    /// values take any case; TCP keepalive's whole seconds are what is in force.
    #[test]
    fn values_that_cannot_work_are_refused_when_read() {
        for (k, v, why) in [
            ("COURIER_TCP_SNDBUF", "3g", "int"),
            ("COURIER_TCP_RCVBUF", "18446744073709551615", "int"),
            ("COURIER_TCP_CONNECT_TIMEOUT", "0", "zero"),
            ("COURIER_KEEPALIVE_INTERVAL", "0s", "zero"),
            ("COURIER_TLS", "^self,shm,tcp", "every transport"),
            ("COURIER_NET_DEVICES", "lo,,eth0", "empty name"),
            ("COURIER_CUDA_LIB", "libx.so\nCOURIER_TLS=foo", "control"),
        ] {
            let e = cfg(&[(k, v)]).expect_err(k);
            assert_eq!(e.status(), Status::BadConfig);
            assert!(
                e.detail().contains(k) && e.detail().contains(why),
                "{k}: {e}"
            );
        }
        let c = cfg(&[("COURIER_TCP_SNDBUF", "2047m")]).unwrap();
        assert_eq!(c.tcp_sndbuf, 2047 << 20);
        // A too-long interval names both variables and both values.
        let e = cfg(&[("COURIER_KEEPALIVE_INTERVAL", "inf")]).unwrap_err();
        assert!(
            e.detail().contains("COURIER_KEEPALIVE_INTERVAL=\"inf\"")
                && e.detail().contains("COURIER_KEEPALIVE_TIMEOUT=\"2s\""),
            "{e}"
        );
        let c = cfg(&[("COURIER_KEEPALIVE_INTERVAL", "500ms")]).unwrap();
        assert_eq!(c.keepalive_interval, Duration::from_secs(1));
        let c = cfg(&[("COURIER_KEEPALIVE_INTERVAL", "1.2s")]).unwrap();
        assert_eq!(c.keepalive_interval, Duration::from_secs(2));
        // What `courier info -c` shows as in force: the rounded value, and why.
        let (used, why) = c.adjusted("COURIER_KEEPALIVE_INTERVAL").unwrap();
        assert_eq!(used, "2s");
        assert!(why.contains("whole seconds"), "{why}");
        let c = cfg(&[("COURIER_KEEPALIVE_INTERVAL", "1s")]).unwrap();
        assert_eq!(c.adjusted("COURIER_KEEPALIVE_INTERVAL"), None);
        assert_eq!(c.adjusted("COURIER_TLS"), None);
        let c = cfg(&[
            ("COURIER_TLS", "SHM,Tcp"),
            ("COURIER_SHM_CMA", "YES"),
            ("COURIER_SHM_SEGMENT_COPY", "Off"),
        ])
        .unwrap();
        assert_eq!(c.tls.effective(), "shm,tcp");
        assert_eq!(c.shm_cma, CmaPolicy::Yes);
        assert!(!c.shm_segment_copy);
    }

    #[test]
    fn tcp_congestion_choices() {
        assert_eq!(cfg(&[]).unwrap().tcp_congestion, TcpCongestion::Auto);
        let c = cfg(&[("COURIER_TCP_CONGESTION", "system")]).unwrap();
        assert_eq!(c.tcp_congestion, TcpCongestion::System);
        let c = cfg(&[("COURIER_TCP_CONGESTION", "cubic")]).unwrap();
        assert_eq!(c.tcp_congestion, TcpCongestion::Named("cubic".into()));
    }

    #[test]
    fn sizes_and_durations() {
        assert_eq!(parse_size("16k"), Some(16384));
        assert_eq!(parse_size("4M"), Some(4 << 20));
        assert_eq!(parse_size("8192"), Some(8192));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("-1s"), None);
        assert_eq!(parse_duration("1e30s"), None);
        assert_eq!(parse_duration("1e300ms"), None);
    }

    #[test]
    fn set_rechecks() {
        let mut c = cfg(&[]).unwrap();
        c.set("COURIER_TLS", "shm").unwrap();
        assert!(!c.tls.allows("tcp"));
        assert!(c.set("COURIER_NOPE", "1").is_err());
        assert!(c.set("COURIER_TLS", "bogus").is_err());
        assert_eq!(c.value("COURIER_TLS"), Some("shm"));
    }

    proptest! {
        #[test]
        fn duration_parse_never_panics(x in proptest::num::f64::ANY, unit in "(ms|us|s|m|)") {
            let _ = parse_duration(&format!("{x}{unit}"));
            let _ = parse_duration(&format!("{x:e}{unit}"));
        }

        #[test]
        fn size_parse_never_panics(s in ".{0,12}") {
            let _ = parse_size(&s);
            let _ = parse_duration(&s);
            let _ = TlsSelection::parse(&s);
        }

        #[test]
        fn sizes_round_trip(n in 0usize..1_000_000) {
            prop_assert_eq!(parse_size(&n.to_string()), Some(n));
            prop_assert_eq!(parse_size(&format!("{n}k")), Some(n * 1024));
        }
    }
}
