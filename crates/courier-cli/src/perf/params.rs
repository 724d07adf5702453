//! Test names, parameters, and their wire form (sent by the client to the server).

use crate::error::{CliError, CliResult};

/// The tests `courier perf` runs (ucx_perftest names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestKind {
    /// Tag ping-pong.
    TagLat,
    /// Tag stream of messages with a window.
    TagBw,
    /// Synchronous tag ping-pong.
    TagSyncLat,
    /// Synchronous tag stream.
    TagSyncBw,
    /// Active-message ping-pong.
    AmLat,
    /// Active-message stream.
    AmBw,
    /// Stream ping-pong.
    StreamLat,
    /// Stream bandwidth.
    StreamBw,
    /// Both sides stream tag messages at once (for `--sweep`).
    TagBibw,
}

/// Every test, for help and errors.
pub const ALL_TESTS: [TestKind; 9] = [
    TestKind::TagLat,
    TestKind::TagBw,
    TestKind::TagSyncLat,
    TestKind::TagSyncBw,
    TestKind::AmLat,
    TestKind::AmBw,
    TestKind::StreamLat,
    TestKind::StreamBw,
    TestKind::TagBibw,
];

impl TestKind {
    /// The ucx_perftest name.
    pub fn name(self) -> &'static str {
        match self {
            TestKind::TagLat => "tag_lat",
            TestKind::TagBw => "tag_bw",
            TestKind::TagSyncLat => "tag_sync_lat",
            TestKind::TagSyncBw => "tag_sync_bw",
            TestKind::AmLat => "ucp_am_lat",
            TestKind::AmBw => "ucp_am_bw",
            TestKind::StreamLat => "stream_lat",
            TestKind::StreamBw => "stream_bw",
            TestKind::TagBibw => "tag_bibw",
        }
    }

    /// The description ucx_perftest prints in its header.
    pub fn description(self) -> &'static str {
        match self {
            TestKind::TagLat => "tag match latency",
            TestKind::TagBw => "tag match bandwidth",
            TestKind::TagSyncLat => "tag sync match latency",
            TestKind::TagSyncBw => "tag sync match bandwidth",
            TestKind::AmLat => "am latency",
            TestKind::AmBw => "am bandwidth / message rate",
            TestKind::StreamLat => "stream latency",
            TestKind::StreamBw => "stream bandwidth",
            TestKind::TagBibw => "tag match bi-directional bandwidth",
        }
    }

    /// Parse a test name.
    pub fn parse(s: &str) -> CliResult<TestKind> {
        if let Some(t) = ALL_TESTS.iter().find(|t| t.name() == s) {
            return Ok(*t);
        }
        let known: Vec<&str> = ALL_TESTS.iter().map(|t| t.name()).collect();
        match s {
            "ucp_put_lat" | "ucp_put_bw" | "ucp_get" | "ucp_add" | "ucp_fadd" | "ucp_swap"
            | "ucp_cswap" => Err(CliError::usage(format!(
                "test {s} is not supported yet (Courier has no RMA or atomics); supported tests: {}",
                known.join(", ")
            ))),
            _ => Err(CliError::usage(format!(
                "unknown test {s:?}; supported tests: {}",
                known.join(", ")
            ))),
        }
    }

    /// Ping-pong tests report one-way latency (RTT/2).
    pub fn is_pingpong(self) -> bool {
        matches!(
            self,
            TestKind::TagLat | TestKind::TagSyncLat | TestKind::AmLat | TestKind::StreamLat
        )
    }

    /// The window when `-O` is not given.
    pub fn default_window(self) -> usize {
        match self {
            TestKind::TagBw | TestKind::TagSyncBw | TestKind::AmBw => 32,
            TestKind::TagBibw => 64,
            _ => 1,
        }
    }
}

/// What the client asks the server to run.
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    /// The test.
    pub test: TestKind,
    /// Message segments (more than one = an IOV message).
    pub sizes: Vec<usize>,
    /// Measured iterations.
    pub iters: u64,
    /// Warm-up iterations before measuring.
    pub warmup: u64,
    /// Outstanding operations.
    pub window: usize,
    /// Verify message contents on the receiver.
    pub check: bool,
}

impl Params {
    /// Total message size.
    pub fn msg_size(&self) -> usize {
        self.sizes.iter().sum()
    }

    /// Iterations including warm-up.
    pub fn total(&self) -> u64 {
        self.iters + self.warmup
    }

    /// The wire form (JSON text).
    pub fn encode(&self) -> Vec<u8> {
        serde_json::json!({
            "op": "test",
            "test": self.test.name(),
            "sizes": self.sizes,
            "iters": self.iters,
            "warmup": self.warmup,
            "window": self.window,
            "check": self.check,
        })
        .to_string()
        .into_bytes()
    }

    /// Parse the wire form.
    pub fn decode(b: &[u8]) -> CliResult<Params> {
        let bad = |what: &str| {
            CliError::run(format!("malformed test parameters from the client: {what}"))
        };
        let v: serde_json::Value = serde_json::from_slice(b).map_err(|e| bad(&e.to_string()))?;
        let test = TestKind::parse(v["test"].as_str().ok_or_else(|| bad("no test"))?)?;
        let sizes = v["sizes"]
            .as_array()
            .ok_or_else(|| bad("no sizes"))?
            .iter()
            .map(|x| {
                x.as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| bad("size is not a number"))
            })
            .collect::<CliResult<Vec<usize>>>()?;
        if sizes.is_empty() {
            return Err(bad("empty size list"));
        }
        let num = |k: &str| v[k].as_u64().ok_or_else(|| bad(k));
        Ok(Params {
            test,
            sizes,
            iters: num("iters")?,
            warmup: num("warmup")?,
            window: (num("window")? as usize).max(1),
            check: v["check"].as_bool().unwrap_or(false),
        })
    }
}

/// Parse a size with an optional k/m/g suffix (binary units).
pub fn parse_size(s: &str) -> CliResult<usize> {
    courier::base::config::parse_size(s).ok_or_else(|| {
        CliError::usage(format!(
            "bad size {s:?}: expected a number with an optional k, m or g suffix (e.g. 8, 4k, 1m)"
        ))
    })
}

/// Parse `-s`: a comma list is the IOV of one message.
pub fn parse_sizes(s: &str) -> CliResult<Vec<usize>> {
    let v = s
        .split(',')
        .map(|p| parse_size(p.trim()))
        .collect::<CliResult<Vec<usize>>>()?;
    if v.is_empty() {
        return Err(CliError::usage("empty size list"));
    }
    Ok(v)
}

/// Parse a count (`-n`, `-w`, `-O`), with optional k/m suffix.
pub fn parse_count(opt: &str, s: &str) -> CliResult<u64> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mul) = if let Some(n) = t.strip_suffix('k') {
        (n, 1000)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 1_000_000)
    } else {
        (t.as_str(), 1)
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| {
            CliError::usage(format!(
                "{opt} {s:?}: expected a non-negative integer (k and m suffixes allowed)"
            ))
        })
}

/// Parse `-m SEND[,RECV]`: only host memory is supported.
pub fn parse_mem(s: &str) -> CliResult<()> {
    for part in s.split(',') {
        match part.trim() {
            "host" => {}
            t @ ("cuda" | "cuda-managed" | "rocm" | "rocm-managed" | "ze-host" | "ze-device"
            | "ze-managed" | "rdma") => {
                return Err(CliError::usage(format!(
                    "memory type {t} not supported yet; accepted: host"
                )));
            }
            t => {
                return Err(CliError::usage(format!(
                    "unknown memory type {t:?}; accepted: host"
                )));
            }
        }
    }
    if s.split(',').count() > 2 {
        return Err(CliError::usage(format!("-m {s:?}: expected SEND[,RECV]")));
    }
    Ok(())
}

/// Parse `-M`.
pub fn parse_thread_mode(s: &str) -> CliResult<courier::ThreadMode> {
    match s {
        "single" => Ok(courier::ThreadMode::Single),
        "serialized" | "multi" => Ok(courier::ThreadMode::Multi),
        _ => Err(CliError::usage(format!(
            "-M {s:?}: expected single, serialized or multi"
        ))),
    }
}

/// Parse a CPU list such as `0,2-3`.
pub fn parse_cpus(s: &str) -> CliResult<Vec<usize>> {
    let bad = || CliError::usage(format!("-c {s:?}: expected a CPU list such as 0,2-3"));
    let mut v = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        if let Some((a, b)) = part.split_once('-') {
            let a: usize = a.trim().parse().map_err(|_| bad())?;
            let b: usize = b.trim().parse().map_err(|_| bad())?;
            if b < a || b - a > 4096 {
                return Err(bad());
            }
            v.extend(a..=b);
        } else {
            v.push(part.parse().map_err(|_| bad())?);
        }
    }
    if v.iter().any(|&c| c >= libc::CPU_SETSIZE as usize) {
        return Err(bad());
    }
    Ok(v)
}

/// Pin the calling thread to one CPU.
pub fn pin_to(cpu: usize) -> CliResult<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET stays inside it (checked
    // against CPU_SETSIZE when parsing); sched_setaffinity(0) applies to this thread.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(CliError::usage(format!(
            "cannot pin to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_iov() {
        assert_eq!(parse_sizes("8").unwrap(), vec![8]);
        assert_eq!(parse_sizes("4k,1m").unwrap(), vec![4096, 1 << 20]);
        assert_eq!(parse_sizes("64, 64").unwrap(), vec![64, 64]);
        assert!(parse_sizes("8,x").unwrap_err().msg.contains("bad size"));
    }

    #[test]
    fn counts_mem_modes_cpus() {
        assert_eq!(parse_count("-n", "100k").unwrap(), 100_000);
        assert_eq!(parse_count("-n", "2000").unwrap(), 2000);
        assert!(parse_count("-n", "-1").is_err());
        assert!(parse_mem("host").is_ok() && parse_mem("host,host").is_ok());
        assert_eq!(
            parse_mem("cuda").unwrap_err().msg,
            "memory type cuda not supported yet; accepted: host"
        );
        assert!(
            parse_mem("floppy")
                .unwrap_err()
                .msg
                .contains("unknown memory type")
        );
        assert_eq!(
            parse_thread_mode("multi").unwrap(),
            courier::ThreadMode::Multi
        );
        assert!(parse_thread_mode("many").is_err());
        assert_eq!(parse_cpus("0,2-3").unwrap(), vec![0, 2, 3]);
        assert!(parse_cpus("a").is_err());
    }

    #[test]
    fn params_round_trip() {
        let p = Params {
            test: TestKind::AmBw,
            sizes: vec![8, 16],
            iters: 10,
            warmup: 2,
            window: 32,
            check: true,
        };
        assert_eq!(Params::decode(&p.encode()).unwrap(), p);
        for t in ALL_TESTS {
            assert_eq!(TestKind::parse(t.name()).unwrap(), t);
        }
        assert!(
            TestKind::parse("ucp_put_lat")
                .unwrap_err()
                .msg
                .contains("not supported yet")
        );
    }
}
