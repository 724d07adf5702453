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
    /// Tag messages in windows, each window ended by the receiver's ack: osu_bw's
    /// pattern (for `--sweep`), where `tag_bw` keeps a window in flight without one.
    TagWinBw,
    /// Put ping-pong: each side puts into the other's memory and polls its own.
    PutLat,
    /// Puts with a window into the server's memory.
    PutBw,
    /// Gets from the server's memory.
    Get,
    /// Posted (non-fetching) atomic adds streamed with a window, flushed at the end.
    Add,
    /// Fetch-and-add.
    Fadd,
    /// Atomic swap.
    Swap,
    /// Atomic compare-and-swap.
    Cswap,
    /// Put-with-signal ping-pong: each side waits on its own signal word.
    PutSignalLat,
    /// Puts-with-signal with a window; the server waits for the final signal.
    PutSignalBw,
    /// The baseline of put-with-signal: put, flush, then an atomic on the signal word.
    PutFlushSignalLat,
}

/// Every test, for help and errors.
pub const ALL_TESTS: [TestKind; 20] = [
    TestKind::TagLat,
    TestKind::TagBw,
    TestKind::TagSyncLat,
    TestKind::TagSyncBw,
    TestKind::AmLat,
    TestKind::AmBw,
    TestKind::StreamLat,
    TestKind::StreamBw,
    TestKind::TagBibw,
    TestKind::TagWinBw,
    TestKind::PutLat,
    TestKind::PutBw,
    TestKind::Get,
    TestKind::Add,
    TestKind::Fadd,
    TestKind::Swap,
    TestKind::Cswap,
    TestKind::PutSignalLat,
    TestKind::PutSignalBw,
    TestKind::PutFlushSignalLat,
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
            TestKind::TagWinBw => "tag_win_bw",
            TestKind::PutLat => "ucp_put_lat",
            TestKind::PutBw => "ucp_put_bw",
            TestKind::Get => "ucp_get",
            TestKind::Add => "ucp_add",
            TestKind::Fadd => "ucp_fadd",
            TestKind::Swap => "ucp_swap",
            TestKind::Cswap => "ucp_cswap",
            TestKind::PutSignalLat => "put_signal_lat",
            TestKind::PutSignalBw => "put_signal_bw",
            TestKind::PutFlushSignalLat => "put_flush_signal_lat",
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
            TestKind::TagWinBw => "tag match bandwidth, an ack per window",
            TestKind::PutLat => "put latency",
            TestKind::PutBw => "put bandwidth",
            TestKind::Get => "get latency / bandwidth / message rate",
            TestKind::Add => "atomic add bandwidth / message rate",
            TestKind::Fadd => "atomic fetch-and-add latency / bandwidth / rate",
            TestKind::Swap => "atomic swap latency / bandwidth / rate",
            TestKind::Cswap => "atomic compare-and-swap latency / bandwidth / rate",
            TestKind::PutSignalLat => "put with signal latency",
            TestKind::PutSignalBw => "put with signal bandwidth / message rate",
            TestKind::PutFlushSignalLat => "put + flush + atomic signal latency",
        }
    }

    /// What the table's first column group measures, as ucx_perftest names it: "latency"
    /// for the ping-pongs and the operations that wait for their reply (`ucp_get`, the
    /// fetching atomics), "overhead" (the sender's time per operation) for the streams.
    pub fn lat_label(self) -> &'static str {
        match self {
            TestKind::TagBw
            | TestKind::TagSyncBw
            | TestKind::AmBw
            | TestKind::StreamBw
            | TestKind::TagBibw
            | TestKind::TagWinBw
            | TestKind::PutBw
            | TestKind::Add
            | TestKind::PutSignalBw => "overhead",
            _ => "latency",
        }
    }

    /// Whether ucx_perftest's header box has an "AM header size" row (the active-message
    /// tests; Courier's carry no user header, so it is 0).
    pub fn is_am(self) -> bool {
        matches!(self, TestKind::AmLat | TestKind::AmBw)
    }

    /// Parse a test name.
    pub fn parse(s: &str) -> CliResult<TestKind> {
        if let Some(t) = ALL_TESTS.iter().find(|t| t.name() == s) {
            return Ok(*t);
        }
        let known: Vec<&str> = ALL_TESTS.iter().map(|t| t.name()).collect();
        Err(CliError::usage(format!(
            "unknown test {s:?}; supported tests: {}",
            known.join(", ")
        )))
    }

    /// Ping-pong tests report one-way latency (RTT/2).
    pub fn is_pingpong(self) -> bool {
        matches!(
            self,
            TestKind::TagLat
                | TestKind::TagSyncLat
                | TestKind::AmLat
                | TestKind::StreamLat
                | TestKind::PutLat
                | TestKind::PutSignalLat
                | TestKind::PutFlushSignalLat
        )
    }

    /// One-sided tests: both sides map memory and exchange remote keys.
    pub fn is_rma(self) -> bool {
        matches!(
            self,
            TestKind::PutLat
                | TestKind::PutBw
                | TestKind::Get
                | TestKind::Add
                | TestKind::Fadd
                | TestKind::Swap
                | TestKind::Cswap
                | TestKind::PutSignalLat
                | TestKind::PutSignalBw
                | TestKind::PutFlushSignalLat
        )
    }

    /// Atomic tests: `-s` is the word width (4 or 8).
    pub fn is_atomic(self) -> bool {
        matches!(
            self,
            TestKind::Add | TestKind::Fadd | TestKind::Swap | TestKind::Cswap
        )
    }

    /// The window when `-O` is not given.
    pub fn default_window(self) -> usize {
        match self {
            TestKind::TagBw
            | TestKind::TagSyncBw
            | TestKind::AmBw
            | TestKind::PutBw
            | TestKind::PutSignalBw => 32,
            TestKind::TagBibw | TestKind::TagWinBw => 64,
            _ => 1,
        }
    }
}

/// A memory type of `-m` (ucx_perftest's names, plus `nic` for on-NIC memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    /// Host memory.
    Host,
    /// On-NIC memory (MEMIC; ucx_perftest's `rdma`); the library falls back to host memory.
    Nic,
    /// CUDA device memory.
    Cuda,
}

impl MemKind {
    /// The name in `-m` and in the header box.
    pub fn name(self) -> &'static str {
        match self {
            MemKind::Host => "host",
            MemKind::Nic => "nic",
            MemKind::Cuda => "cuda",
        }
    }

    /// Parse one name (`rdma` is ucx_perftest's name for on-NIC memory).
    pub fn parse(s: &str) -> Option<MemKind> {
        match s {
            "host" => Some(MemKind::Host),
            "nic" | "rdma" => Some(MemKind::Nic),
            "cuda" => Some(MemKind::Cuda),
            _ => None,
        }
    }

    /// The library's memory type.
    pub fn memory_type(self) -> courier::MemoryType {
        match self {
            MemKind::Host => courier::MemoryType::Host,
            MemKind::Nic => courier::MemoryType::Nic,
            MemKind::Cuda => courier::MemoryType::Cuda,
        }
    }
}

/// The most bytes a message or a window of messages may take (`isize::MAX`, the most
/// one allocation can hold, less room for the layout's rounding and signal word).
pub const MAX_BYTES: usize = (isize::MAX as usize) >> 1;

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
    /// Memory types: the client's (sender's) and the server's (receiver's).
    pub mem: [MemKind; 2],
}

impl Params {
    /// Total message size (`usize::MAX` where the sum overflows: `check_totals` refuses
    /// such parameters, and an allocation of that size fails).
    pub fn msg_size(&self) -> usize {
        self.sizes
            .iter()
            .try_fold(0usize, |a, &b| a.checked_add(b))
            .unwrap_or(usize::MAX)
    }

    /// Iterations including warm-up (`u64::MAX` where the sum overflows: `check_totals`
    /// refuses such parameters).
    pub fn total(&self) -> u64 {
        self.iters.saturating_add(self.warmup)
    }

    /// The bytes of a window of messages: message size × window, the receive buffers of a
    /// two-sided test (one slot per outstanding receive) and the landing slots of
    /// `ucp_get`. `None` when it overflows.
    pub fn window_bytes(&self) -> Option<usize> {
        self.sizes
            .iter()
            .try_fold(0usize, |a, &b| a.checked_add(b))?
            .checked_mul(self.window.max(1))
    }

    /// Refuse parameters whose totals overflow (why, naming the options): the message size
    /// (the sum of the `-s` IOV), message size × window (`-s` × `-O`) and the iterations
    /// with warm-up (`-n` + `-w`). Sizes that fit but cannot be had are refused when the
    /// buffers are allocated.
    pub fn check_totals(&self) -> Result<(), String> {
        let sizes = || {
            self.sizes
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let Some(size) = self
            .sizes
            .iter()
            .try_fold(0usize, |a, &b| a.checked_add(b))
            .filter(|&s| s <= MAX_BYTES)
        else {
            return Err(format!(
                "-s {}: the message size (the sum of the IOV segments) exceeds {MAX_BYTES} bytes",
                sizes()
            ));
        };
        if self.window_bytes().is_none_or(|b| b > MAX_BYTES) {
            return Err(format!(
                "-s {} -O {}: message size × window ({size} × {}) exceeds {MAX_BYTES} bytes",
                sizes(),
                self.window,
                self.window
            ));
        }
        if self.iters.checked_add(self.warmup).is_none() {
            return Err(format!(
                "-n {} -w {}: iterations plus warm-up exceed {}",
                self.iters,
                self.warmup,
                u64::MAX
            ));
        }
        Ok(())
    }

    /// The wire form as a JSON value (the caller may add fields).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "op": "test",
            "test": self.test.name(),
            "sizes": self.sizes,
            "iters": self.iters,
            "warmup": self.warmup,
            "window": self.window,
            "check": self.check,
            "mem": [self.mem[0].name(), self.mem[1].name()],
        })
    }

    /// The wire form (JSON text).
    pub fn encode(&self) -> Vec<u8> {
        self.to_json().to_string().into_bytes()
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
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| bad("size is not a number"))
            })
            .collect::<CliResult<Vec<usize>>>()?;
        if sizes.is_empty() {
            return Err(bad("empty size list"));
        }
        let num = |k: &str| v[k].as_u64().ok_or_else(|| bad(k));
        let mut mem = [MemKind::Host; 2];
        if let Some(a) = v["mem"].as_array() {
            for (slot, x) in mem.iter_mut().zip(a) {
                *slot = x
                    .as_str()
                    .and_then(MemKind::parse)
                    .ok_or_else(|| bad("unknown memory type"))?;
            }
        }
        let window = usize::try_from(num("window")?).map_err(|_| bad("window too large"))?;
        let p = Params {
            test,
            sizes,
            iters: num("iters")?,
            warmup: num("warmup")?,
            window: window.max(1),
            check: v["check"].as_bool().unwrap_or(false),
            mem,
        };
        p.check_totals().map_err(|why| bad(&why))?;
        Ok(p)
    }
}

/// Parse a size with an optional k/m/g suffix (binary units).
pub fn parse_size(s: &str) -> CliResult<usize> {
    courier::config::parse_size(s).ok_or_else(|| {
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

/// The warm-up iterations run for `-w w -n n`, as ucx_perftest runs them: at most a tenth
/// of the measured iterations, rounded up (`min(w, ceil(n / 10))`), so that `-n 10` of a
/// large message warms up once, not ten thousand times (the default `-w`).
pub fn warmup_run(w: u64, n: u64) -> u64 {
    w.min(n.div_ceil(10))
}

/// Parse `-m SEND[,RECV]` (RECV defaults to SEND, as in ucx_perftest).
pub fn parse_mem(s: &str) -> CliResult<[MemKind; 2]> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    if parts.len() > 2 {
        return Err(CliError::usage(format!("-m {s:?}: expected SEND[,RECV]")));
    }
    let mut v = Vec::with_capacity(2);
    for part in &parts {
        match MemKind::parse(part) {
            Some(k) => v.push(k),
            None => {
                return Err(CliError::usage(format!(
                    "unknown memory type {part:?}; accepted: host, nic, cuda"
                )));
            }
        }
    }
    let send = v[0];
    Ok([send, v.get(1).copied().unwrap_or(send)])
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

/// Parse a duration as every `COURIER_*` duration is parsed: `30s`, `2.5s`, `1500ms`,
/// `100us`, `2m`, a bare number of seconds, or `inf` (`Duration::MAX`). None for anything
/// else, negative or too large.
pub fn parse_duration(s: &str) -> Option<std::time::Duration> {
    courier::config::parse_duration(s)
}

/// Parse a CPU list such as `0,2-3`.
pub fn parse_cpus(s: &str) -> CliResult<Vec<usize>> {
    let bad = || CliError::usage(format!("-c {s:?}: expected a CPU list such as 0,2-3"));
    let beyond = |c: usize| {
        CliError::usage(format!(
            "-c {s}: CPU {c} is beyond what a CPU set can name (CPU_SETSIZE is {}: CPUs 0 \
             to {})",
            libc::CPU_SETSIZE,
            libc::CPU_SETSIZE - 1
        ))
    };
    let max = libc::CPU_SETSIZE as usize;
    let mut v = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        if let Some((a, b)) = part.split_once('-') {
            let a: usize = a.trim().parse().map_err(|_| bad())?;
            let b: usize = b.trim().parse().map_err(|_| bad())?;
            if b < a {
                return Err(CliError::usage(format!(
                    "-c {s}: the range {a}-{b} ends before it starts"
                )));
            }
            if b >= max {
                return Err(beyond(b));
            }
            v.extend(a..=b);
        } else {
            let c: usize = part.parse().map_err(|_| bad())?;
            if c >= max {
                return Err(beyond(c));
            }
            v.push(c);
        }
    }
    Ok(v)
}

/// Why `cpus` cannot be pinned to when the kernel says EINVAL: the first of them that is
/// not in `allowed` (the CPUs this process may be given; unknown when empty).
pub fn not_allowed(cpus: &[usize], allowed: &[usize]) -> String {
    let list = if allowed.is_empty() {
        String::new()
    } else {
        format!(" (allowed: {})", cpu_list(allowed))
    };
    match cpus.iter().find(|c| !allowed.contains(c)) {
        Some(c) if !allowed.is_empty() => {
            format!("CPU {c} does not exist or is not allowed here{list}")
        }
        _ => format!("no such CPU, or not allowed here{list}"),
    }
}

/// Pin the calling thread to one CPU.
pub fn pin_to(cpu: usize) -> CliResult<()> {
    set_affinity(&[cpu])
}

/// Let the calling thread run on `cpus` (threads and processes it starts inherit that).
pub fn set_affinity(cpus: &[usize]) -> CliResult<()> {
    if let Some(&c) = cpus.iter().find(|&&c| c >= libc::CPU_SETSIZE as usize) {
        return Err(CliError::usage(format!(
            "cannot pin to CPU {c}: beyond the {} CPUs a CPU set holds",
            libc::CPU_SETSIZE
        )));
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET stays inside it (checked
    // against CPU_SETSIZE above); sched_setaffinity(0) applies to this thread.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        let what = match cpus {
            [c] => format!("CPU {c}"),
            _ => format!("CPUs {}", cpu_list(cpus)),
        };
        // EINVAL: a CPU the machine does not have, or one outside this process's cpuset.
        let why = if err.raw_os_error() == Some(libc::EINVAL) {
            not_allowed(cpus, &cpus_here())
        } else {
            err.to_string()
        };
        return Err(CliError::usage(format!("cannot pin to {what}: {why}")));
    }
    Ok(())
}

/// The CPUs this process may be given (whatever its threads' affinity is now): those of
/// its cpuset (cgroup v2, or v1's cpuset hierarchy), else those online; empty when
/// unknown.
fn cpus_here() -> Vec<usize> {
    let read = |f: String| {
        std::fs::read_to_string(f)
            .ok()
            .and_then(|l| parse_cpus(l.trim()).ok())
            .filter(|v| !v.is_empty())
    };
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let path = |prefix: &str| {
        cgroups
            .lines()
            .find_map(|l| l.split_once(':').and_then(|(_, r)| r.strip_prefix(prefix)))
            .map(|p| p.trim().trim_end_matches('/').to_string())
    };
    path("cpuset:")
        .and_then(|p| read(format!("/sys/fs/cgroup/cpuset{p}/cpuset.effective_cpus")))
        .or_else(|| {
            path(":").and_then(|p| read(format!("/sys/fs/cgroup{p}/cpuset.cpus.effective")))
        })
        .or_else(|| read("/sys/devices/system/cpu/online".to_string()))
        .unwrap_or_default()
}

/// The CPUs the calling thread may run on.
pub fn affinity() -> CliResult<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set for the kernel to fill;
    // sched_getaffinity(0) reads this thread's mask; CPU_ISSET stays inside the set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(CliError::run(format!(
                "cannot read the CPU affinity: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok((0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect())
    }
}

/// A CPU list as `-c` takes it, ranges folded: `0-3,6`.
pub fn cpu_list(cpus: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if j > i {
            format!("{}-{}", cpus[i], cpus[j])
        } else {
            cpus[i].to_string()
        });
        i = j + 1;
    }
    parts.join(",")
}

/// The `-M` name of a worker's thread mode.
pub fn thread_mode_name(m: courier::ThreadMode) -> &'static str {
    match m {
        courier::ThreadMode::Single => "single",
        courier::ThreadMode::Multi => "multi",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_up_is_at_most_a_tenth_of_the_iterations_rounded_up() {
        for (w, n, run) in [
            (10_000, 10, 1),
            (10_000, 11, 2),
            (10_000, 1_000_000, 10_000),
            (5, 1000, 5),
            (0, 100, 0),
            (10_000, 1, 1),
            (u64::MAX, u64::MAX, u64::MAX.div_ceil(10)),
        ] {
            assert_eq!(warmup_run(w, n), run, "-w {w} -n {n}");
        }
    }

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
        assert_eq!(parse_mem("host").unwrap(), [MemKind::Host; 2]);
        assert_eq!(
            parse_mem("nic,host").unwrap(),
            [MemKind::Nic, MemKind::Host]
        );
        assert_eq!(parse_mem("cuda").unwrap(), [MemKind::Cuda; 2]);
        assert!(parse_mem("host,host,host").is_err());
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
        use std::time::Duration;
        assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("2.5"), Some(Duration::from_millis(2500)));
        assert_eq!(parse_duration("1500ms"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("inf"), Some(Duration::MAX));
        for bad in ["", "-1s", "1e30s", "nan", "3h", "x"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        assert_eq!(parse_cpus("0,2-3").unwrap(), vec![0, 2, 3]);
        assert!(parse_cpus("a").is_err());
        let e = parse_cpus("0,1024").unwrap_err().msg;
        assert!(
            e.contains("CPU 1024 is beyond") && e.contains("CPU_SETSIZE is 1024"),
            "{e}"
        );
        assert!(parse_cpus("2-5000").unwrap_err().msg.contains("CPU 5000"));
        assert!(parse_cpus("3-1").unwrap_err().msg.contains("ends before"));
        assert_eq!(
            not_allowed(&[0, 5], &[0, 1]),
            "CPU 5 does not exist or is not allowed here (allowed: 0-1)"
        );
        assert_eq!(not_allowed(&[5], &[]), "no such CPU, or not allowed here");
        assert_eq!(cpu_list(&[0, 1, 2, 3, 6]), "0-3,6");
        assert_eq!(cpu_list(&[5]), "5");
        assert_eq!(
            parse_cpus(&cpu_list(&[0, 2, 3, 7])).unwrap(),
            vec![0, 2, 3, 7]
        );
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
            mem: [MemKind::Nic, MemKind::Host],
        };
        assert_eq!(Params::decode(&p.encode()).unwrap(), p);
        // A peer's parameters whose totals overflow are refused, not computed with.
        for (sizes, window, iters) in [
            (vec![usize::MAX / 2 + 1, usize::MAX / 2 + 1], 1, 10),
            (vec![16], 1 << 60, 10),
            (vec![8], 1, u64::MAX),
        ] {
            let q = Params {
                sizes,
                window,
                iters,
                ..p.clone()
            };
            let e = Params::decode(&q.encode()).unwrap_err().msg;
            assert!(e.contains("malformed test parameters"), "{e}");
        }
        let big = Params {
            sizes: vec![usize::MAX, 1],
            ..p.clone()
        };
        assert_eq!(big.msg_size(), usize::MAX);
        assert_eq!(big.window_bytes(), None);
        let many = Params {
            iters: u64::MAX,
            warmup: 1,
            ..p.clone()
        };
        assert_eq!(many.total(), u64::MAX);
        assert!(
            many.check_totals()
                .unwrap_err()
                .contains("-n 18446744073709551615 -w 1")
        );
        for t in ALL_TESTS {
            assert_eq!(TestKind::parse(t.name()).unwrap(), t);
        }
        assert!(TestKind::parse("ucp_put_lat").unwrap().is_rma());
        assert!(
            TestKind::parse("nope")
                .unwrap_err()
                .msg
                .contains("unknown test")
        );
    }
}
