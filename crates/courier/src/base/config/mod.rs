//! The `COURIER_*` configuration table.
//!
//! Every variable has a name, a default, a one-line help and a parser. Values come from the
//! environment and may be overridden in code (`Config::set`). A value that does not parse is
//! an error that names the variable and the accepted values; nothing is silently ignored.

use std::collections::BTreeMap;
use std::time::Duration;

use super::status::{Error, Result, Status};

mod vars;
pub use vars::{VARS, Var};

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
    /// Smallest EXS registration moved into a shared segment in place; `None` = never.
    pub exs_share_min: Option<usize>,
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
    /// Bytes all tcp links of the process hold in receive buffers grown past their first.
    pub rx_buffered: usize,
    /// The largest frame accepted from a peer (a multiple of 1 KiB, 4 KiB to 16 MiB).
    pub max_frame: usize,
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
            rx_buffered: {
                let n = "COURIER_MAX_RX_BUFFERED";
                let v = size(n)?;
                if v < 16 << 20 {
                    return Err(bad(n, get(n), "below 16m (the largest tcp frame must fit)"));
                }
                v
            },
            max_frame: {
                let n = "COURIER_MAX_FRAME";
                let v = size(n)?;
                if !(4 << 10..=16 << 20).contains(&v) {
                    return Err(bad(n, get(n), "not from 4k to 16m"));
                }
                v & !1023
            },
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
            exs_share_min: match get("COURIER_EXS_SHARE_MIN").trim() {
                "off" | "no" | "0" => None,
                other => {
                    Some(parse_size(other).ok_or_else(|| {
                        bad("COURIER_EXS_SHARE_MIN", other, "not a size or 'off'")
                    })?)
                }
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
mod tests;
