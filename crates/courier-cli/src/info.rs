//! `courier info`: a drop-in for ucx_info.

use std::net::IpAddr;
use std::time::Duration;

use courier::onesided::{ATOMIC_BITS, Op, OwnerLimits, Reach, Route, TargetMemory, op_route};
use courier::{AtomicOp, Caps, Config, DeviceInfo, RndvMode, TransportInfo};

use crate::error::{CliError, CliResult};

/// Options of `courier info` (ucx_info's). As with ucx_info's getopt, an option given twice
/// takes its last value; `-f` prints the configuration by itself, `-a` and `-C` modify it.
#[derive(clap::Args, Debug, Clone)]
#[command(
    disable_version_flag = true,
    args_override_self = true,
    group(clap::ArgGroup::new("print_config").args(["config", "full"]).multiple(true))
)]
pub struct InfoArgs {
    /// Version and build features
    #[arg(short = 'v')]
    pub version: bool,
    /// Build configuration (same as -v)
    #[arg(short = 'b')]
    pub build: bool,
    /// Transports and devices with their capabilities
    #[arg(short = 'd')]
    pub devices: bool,
    /// Only this transport in -d
    #[arg(
        short = 't',
        value_name = "NAME",
        requires = "devices",
        value_parser = ["self", "shm", "tcp", "cuda_copy"]
    )]
    pub transport: Option<String>,
    /// Configuration variables in force
    #[arg(short = 'c')]
    pub config: bool,
    /// With -c or -f: also default, accepted values and help
    #[arg(short = 'a', requires = "print_config")]
    pub all: bool,
    /// Configuration fully decorated: default, accepted values and help (implies -c)
    #[arg(short = 'f')]
    pub full: bool,
    /// With -c or -f: comment out the variables not set in the environment
    #[arg(short = 'C', requires = "print_config")]
    pub comment_defaults: bool,
    /// Endpoint lanes and protocol thresholds
    #[arg(short = 'e')]
    pub endpoint: bool,
    /// Features for -e: t tag, m am, s stream, r rma, a amo (at least one); e error handling
    /// (peer failure detection), w wakeup (both also keep transports that lack them out)
    #[arg(short = 'u', default_value = "t", requires = "endpoint")]
    pub features: String,
    /// Peer for -e: self (same process), intra (same host) or inter (another host)
    #[arg(short = 'P', default_value = "self", requires = "endpoint")]
    pub peer: String,
    /// Device types for -d and -e: all, shm (shared memory), net (tcp) or self
    #[arg(short = 'D', value_parser = ["all", "shm", "net", "self"])]
    pub device_types: Option<String>,
}

fn version_line() -> String {
    format!(
        "# Courier version={} ({} build, {}-{})",
        env!("CARGO_PKG_VERSION"),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        std::env::consts::ARCH,
        std::env::consts::OS
    )
}

/// The transport named `name` among those `courier::transports` listed.
fn find<'a>(list: &'a [TransportInfo], name: &str) -> Option<&'a TransportInfo> {
    list.iter().find(|t| t.name == name)
}

/// The capabilities of a transport with one device (`self`, `shm`), or why it is not
/// usable.
fn memory_caps(list: &[TransportInfo], name: &str) -> Result<Caps, String> {
    let t = find(list, name).ok_or_else(|| format!("no transport {name}"))?;
    if let Some(why) = &t.unusable {
        return Err(why.clone());
    }
    t.devices
        .first()
        .ok_or_else(|| "no device".to_string())?
        .caps
        .clone()
}

fn caps_block(c: &Caps, thresh: usize, extra: &[(String, String)]) -> String {
    let mut s = String::new();
    s.push_str(&format!("#      Transport: {}\n", c.name));
    s.push_str(&format!("#         Device: {}\n", c.device));
    let ty = match c.name {
        "self" => "loopback",
        "shm" => "intra-node",
        _ => "network",
    };
    s.push_str(&format!(
        "#           Type: {ty}\n#\n#      capabilities:\n"
    ));
    s.push_str(&format!(
        "#            bandwidth: {:.2} MB/sec\n",
        c.bandwidth_mbs
    ));
    s.push_str(&format!(
        "#              latency: {:.0} nsec\n",
        c.latency_ns
    ));
    s.push_str(&format!("#            max short: {}\n", c.max_short));
    s.push_str(&format!("#            max frame: {}\n", c.max_frame));
    let mode = match c.rndv {
        RndvMode::RemoteRead => "remote read (zero-copy)",
        RndvMode::Push => "push (sender streams data frames)",
    };
    s.push_str(&format!(
        "#           rendezvous: {mode}, tag messages from {thresh} bytes\n"
    ));
    s.push_str(&format!(
        "#       error handling: {}\n",
        if c.peer_failure {
            "peer failure"
        } else {
            "none"
        }
    ));
    s.push_str(&format!(
        "#               wakeup: {}\n",
        if c.wakeup { "yes" } else { "no" }
    ));
    for (k, v) in extra {
        s.push_str(&format!("#{k:>21}: {v}\n"));
    }
    s.push_str("#\n");
    s
}

fn unusable(name: &str, device: &str, why: &str) -> String {
    format!(
        "#      Transport: {name}\n#         Device: {device}\n#         Status: not usable: {why}\n#\n"
    )
}

/// The rendezvous threshold in force on a link with `c`: `COURIER_RNDV_THRESH` or the
/// transport's own.
fn rndv_thresh(c: &Caps, cfg: &Config) -> usize {
    cfg.rndv_thresh.unwrap_or(c.rndv_thresh).max(1)
}

/// The first size of `kind` messages sent by rendezvous on a link with `c`: the
/// threshold, or sooner where the message and its header no longer fit one frame.
fn rndv_from(c: &Caps, cfg: &Config, kind: courier::wire::Kind) -> usize {
    rndv_thresh(c, cfg).min((c.max_frame + 1).saturating_sub(kind.header_len()))
}

/// `-d`: each memory domain with its transports; `only` (`-t`): just that transport.
fn devices(cfg: &Config, only: Option<&str>) -> String {
    let shows = |t: &str| only.is_none_or(|o| o == t);
    let thresh = |c: &Caps| rndv_from(c, cfg, courier::wire::Kind::TagEagerSync);
    let list = courier::transports(cfg);
    let mut s = String::new();
    if shows("self") || shows("shm") {
        s.push_str("#\n# Memory domain: memory\n#\n");
    }
    if shows("self") {
        match memory_caps(&list, "self") {
            Ok(c) => s.push_str(&caps_block(
                &c,
                thresh(&c),
                &one_sided_caps(&c, Reach::SameContext),
            )),
            Err(why) => s.push_str(&unusable("self", "memory", &why)),
        }
    }
    if shows("shm") {
        match memory_caps(&list, "shm") {
            Ok(c) => {
                let cma = if c.rndv == RndvMode::RemoteRead {
                    "works (probed in this process)".to_string()
                } else if cfg.shm_cma == courier::config::CmaPolicy::No {
                    "off (COURIER_SHM_CMA=no: bounce buffers)".to_string()
                } else {
                    "refused (bounce buffers)".to_string()
                };
                let likely = find(&list, "shm")
                    .and_then(|t| t.devices.first())
                    .and_then(|d| d.notes.iter().find(|(k, _)| *k == "cma likelihood"))
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default();
                let mut extra = vec![
                    ("cma".to_string(), cma),
                    (
                        "cma policy".to_string(),
                        format!("{:?}; {likely}", cfg.shm_cma),
                    ),
                ];
                extra.extend(one_sided_caps(&c, shm_reach(&c, cfg, true).0));
                s.push_str(&caps_block(&c, thresh(&c), &extra));
            }
            Err(e) => s.push_str(&unusable("shm", "memory", &e)),
        }
    }
    if shows("cuda_copy") {
        s.push_str(&cuda_domain(cfg));
    }
    if !shows("tcp") {
        return s;
    }
    s.push_str("#\n# Memory domain: tcp\n#\n");
    let Some(tcp) = find(&list, "tcp") else {
        return s;
    };
    match &tcp.unusable {
        // Excluded: all its interfaces; otherwise there is none to use.
        Some(why) if !cfg.tls.allows("tcp") => {
            s.push_str(&unusable("tcp", "(all interfaces)", why))
        }
        Some(why) => s.push_str(&unusable("tcp", "(none)", why)),
        // One block per device, as ucx_info: an interface's addresses share its limits.
        None => {
            for d in &tcp.devices {
                s.push_str(&tcp_device(d, thresh));
            }
        }
    }
    s
}

/// The `-d` block of tcp on one interface: each address was tried with a test connection;
/// the capabilities are those of the first that works.
fn tcp_device(d: &DeviceInfo, thresh: impl Fn(&Caps) -> usize) -> String {
    let c = match &d.caps {
        Ok(c) => c,
        Err(why) => return unusable("tcp", &d.name, why),
    };
    let good: Vec<IpAddr> = d
        .addresses
        .iter()
        .copied()
        .filter(|ip| !d.failed.iter().any(|(f, _)| f == ip))
        .collect();
    let bad: Vec<String> = d
        .failed
        .iter()
        .map(|(ip, e)| format!("{ip}: {e}"))
        .collect();
    let list = |v: &[IpAddr]| {
        let t: Vec<String> = v.iter().map(IpAddr::to_string).collect();
        t.join(", ")
    };
    let (v4, v6): (Vec<IpAddr>, Vec<IpAddr>) = good.iter().partition(|ip| ip.is_ipv4());
    let worker = match (v4.is_empty(), v6.is_empty()) {
        (false, true) => "yes: advertised, and listened on".to_string(),
        (true, _) => {
            "no: worker addresses carry IPv4 only (a listener bound to this address works)"
                .to_string()
        }
        (false, false) => format!(
            "{}: advertised, and listened on; {}: not (worker addresses carry IPv4 only; a listener bound to it works)",
            list(&v4),
            list(&v6)
        ),
    };
    let mut extra = vec![
        ("address".to_string(), list(&good)),
        ("worker address".to_string(), worker),
    ];
    if !bad.is_empty() {
        extra.push(("not usable".to_string(), bad.join("; ")));
    }
    extra.extend(one_sided_caps(c, Reach::Elsewhere));
    extra.push((
        "same-host peers".to_string(),
        "while COURIER_TLS allows shm, their keys are used as on shm (direct, cma)".to_string(),
    ));
    caps_block(c, thresh(c), &extra)
}

/// The CUDA memory domain: whether the driver loads and what it sees (loads it).
fn cuda_domain(cfg: &Config) -> String {
    let mut s = String::from("#\n# Memory domain: cuda\n#\n");
    s.push_str(&format!(
        "#      Transport: cuda_copy\n#         Driver: {} (loaded at run time, COURIER_CUDA_LIB)\n",
        cfg.cuda_lib
    ));
    match courier::cuda_driver(&cfg.cuda_lib) {
        Ok(d) => s.push_str(&format!(
            "#        Devices: {} (device 0: {}), driver version {}\n\
             #   memory types: cuda (device memory), host\n\
             #         copies: staged through page-locked host memory on a private stream; same-host peers open a cuda region through CUDA IPC, others reach it through its owner\n\
             #         limits: no atomics or signal words in device memory\n#\n",
            d.devices, d.device_name, d.version
        )),
        Err(e) => s.push_str(&format!("#         Status: not usable: {}\n#\n", e.detail())),
    }
    s
}

/// "32, 64 bit": the word widths of atomics.
fn atomic_widths() -> String {
    let w: Vec<String> = ATOMIC_BITS.iter().map(|b| b.to_string()).collect();
    format!("{} bit", w.join(", "))
}

/// The atomic operations' names, space-separated.
fn atomic_names() -> String {
    let n: Vec<&str> = AtomicOp::ALL.iter().map(|o| o.name()).collect();
    n.join(" ")
}

/// The one-sided operations other than atomics, comma-separated.
fn rma_names() -> String {
    let n: Vec<&str> = Op::ALL
        .iter()
        .filter(|o| **o != Op::Atomic)
        .map(|o| o.name())
        .collect();
    n.join(", ")
}

/// How keys of a same-host peer are used over link `c` (shm, or tcp on this host), as
/// `rkey_unpack` decides; `.1`: whether that needs a per-key CMA probe, which `info` cannot
/// make (it is shown as failing).
fn shm_reach(c: &Caps, cfg: &Config, same_host: bool) -> (Reach, bool) {
    let probed = std::cell::Cell::new(false);
    let r = Reach::find(
        Some(c),
        false,
        same_host,
        cfg.tls.allows("shm"),
        cfg.shm_cma,
        || {
            probed.set(true);
            false
        },
    );
    (r, probed.get())
}

/// Which route each one-sided operation takes to memory `mem`: `direct: put, get, ...`.
fn route_summary(reach: Reach, mem: TargetMemory) -> String {
    let mut groups: Vec<(Route, Vec<&str>)> = Vec::new();
    for op in Op::ALL {
        let r = op_route(reach, mem, op);
        match groups.iter_mut().find(|g| g.0 == r) {
            Some(g) => g.1.push(op.name()),
            None => groups.push((r, vec![op.name()])),
        }
    }
    let parts: Vec<String> = groups
        .iter()
        .map(|(r, ops)| format!("{}: {}", r.name(), ops.join(", ")))
        .collect();
    parts.join("; ")
}

/// Whether `op` goes through the owner for some kind of memory.
fn uses_owner(reach: Reach, op: Op) -> bool {
    TargetMemory::ALL
        .iter()
        .any(|m| op_route(reach, *m, op) == Route::Remote)
}

/// `-d` capability lines of one-sided operations over a link with `c` to a peer at `reach`
/// (ucx_info's `put_zcopy`, `get_bcopy`, `atomic_add` lines).
fn one_sided_caps(c: &Caps, reach: Reach) -> Vec<(String, String)> {
    let mut v = Vec::new();
    let widths: Vec<String> = ATOMIC_BITS.iter().map(|b| format!("atomic{b}")).collect();
    v.push((
        "one-sided".to_string(),
        format!("{}, {}", rma_names(), widths.join(", ")),
    ));
    for m in TargetMemory::ALL {
        v.push((format!("{} memory", m.name()), route_summary(reach, m)));
    }
    // Routes that do the whole operation in the call: no size limit but the region's.
    for op in [Op::Put, Op::Get, Op::PutSignal] {
        let mut names: Vec<&str> = Vec::new();
        for m in TargetMemory::ALL {
            let r = op_route(reach, m, op);
            if r.in_call() && !names.contains(&r.name()) {
                names.push(r.name());
            }
        }
        if !names.is_empty() {
            v.push((
                format!("{}_zcopy", op.name()),
                format!("unlimited ({}: done in the call)", names.join(", ")),
            ));
        }
    }
    let l = OwnerLimits::of(c);
    // Placement is only looked at for the kinds of memory whose operation goes through
    // the owner.
    let placed = |op: Op, what: &str| {
        let from = TargetMemory::ALL
            .iter()
            .filter(|m| op_route(reach, **m, op) == Route::Remote)
            .filter_map(|m| l.placed_from(op, *m))
            .min();
        match from {
            Some(p) => format!("; frames from {p} bytes may be read {what}"),
            None => String::new(),
        }
    };
    for (op, piece, last) in [
        (Op::Put, l.put_piece, ""),
        (
            Op::PutSignal,
            l.put_signal_piece,
            "; the signal with the last frame",
        ),
    ] {
        if !uses_owner(reach, op) {
            continue;
        }
        let put_placed = placed(op, "straight into the owner's host memory");
        match l.zcopy_from {
            Some(z) => {
                v.push((
                    format!("{}_bcopy", op.name()),
                    format!("< {z} bytes, copied by the link; {piece} bytes a frame{last} (by the owner)"),
                ));
                v.push((
                    format!("{}_zcopy", op.name()),
                    format!("from {z} bytes, sent from the caller's buffer; {piece} bytes a frame{last} (by the owner){put_placed}"),
                ));
            }
            None => v.push((
                format!("{}_bcopy", op.name()),
                format!(
                    "{piece} bytes a frame, longer ones in pieces{last} (by the owner){put_placed}"
                ),
            )),
        }
    }
    if uses_owner(reach, Op::Get) {
        v.push((
            "get_bcopy".to_string(),
            format!(
                "{} bytes a frame of the answer, longer ones in pieces (by the owner){}",
                l.get_piece,
                placed(Op::Get, "straight into the caller's buffer")
            ),
        ));
    }
    for op in AtomicOp::ALL {
        v.push((
            format!("atomic_{}", op.name()),
            format!("{} (returns the old value)", atomic_widths()),
        ));
    }
    if uses_owner(reach, Op::Atomic) {
        v.push((
            "remote atomics".to_string(),
            "one frame each way (by the owner)".to_string(),
        ));
    }
    v
}

/// `a..<label>..b` ranges of a one-sided operation on `route` (`-e`).
fn one_sided_range(op: Op, mem: TargetMemory, route: Route, l: &OwnerLimits) -> String {
    let name = op.name();
    let mut s = format!("#   {name:>14}: ");
    if route != Route::Remote {
        if route == Route::Unsupported {
            s.push_str("unsupported");
        } else {
            s.push_str(&format!("0..<{}>..(inf)", route.name()));
        }
        s.push('\n');
        return s;
    }
    // Through the owner: copied by the link, or sent from the caller's buffer; large
    // frames may be read straight into their destination.
    let zcopy = match op {
        Op::Put | Op::PutSignal => l.zcopy_from,
        _ => None,
    };
    let placed = l.placed_from(op, mem);
    let mut cuts: Vec<usize> = [Some(0), zcopy, placed].into_iter().flatten().collect();
    cuts.sort_unstable();
    cuts.dedup();
    for (i, &from) in cuts.iter().enumerate() {
        let copy = match (op, zcopy) {
            (Op::Get, _) => "",
            (_, Some(z)) if from >= z => "/zcopy",
            _ => "/bcopy",
        };
        let at = if placed.is_some_and(|p| from >= p) {
            ",placed"
        } else {
            ""
        };
        if i > 0 {
            s.push_str(&format!("..{from}"));
        } else {
            s.push('0');
        }
        s.push_str(&format!("..<remote{copy}{at}>"));
    }
    s.push_str("..(inf)\n");
    s
}

/// `-e` lines of the one-sided operations (`rma`: put, get, put_signal; `amo`: atomics)
/// by the memory the peer's key names.
fn one_sided_ranges(c: &Caps, reach: Reach, rma: bool, amo: bool) -> String {
    let l = OwnerLimits::of(c);
    let mut s = String::new();
    let mut owner = false;
    for m in TargetMemory::ALL {
        let key = courier::onesided::key_route(reach, m);
        s.push_str(&format!(
            "#   {} memory: key path {} ({})\n",
            m.name(),
            key.name(),
            key.describe()
        ));
        let mut ops = Vec::new();
        if rma {
            ops.extend([Op::Put, Op::Get, Op::PutSignal]);
        }
        if amo {
            ops.push(Op::Atomic);
        }
        for op in ops {
            let r = op_route(reach, m, op);
            owner |= r == Route::Remote && op != Op::Atomic;
            if op == Op::Atomic {
                for b in ATOMIC_BITS {
                    let how = match r {
                        Route::Unsupported => "unsupported (atomics need host memory)".to_string(),
                        Route::Remote => {
                            format!("<remote> {} (one frame each way)", atomic_names())
                        }
                        r => format!("<{}> {}", r.name(), atomic_names()),
                    };
                    s.push_str(&format!("#   {:>14}: {how}\n", format!("atomic{b}")));
                }
            } else {
                s.push_str(&one_sided_range(op, m, r, &l));
            }
        }
    }
    if owner {
        s.push_str(&format!(
            "#   remote frames: put {}, put_signal {}, get {} payload bytes at most (longer operations are split)\n",
            l.put_piece, l.put_signal_piece, l.get_piece
        ));
    }
    if rma {
        s.push_str("#   put_signal: the signal word in allocated memory of the same peer\n");
    }
    s
}

/// `-c`: every variable with its value in force, `NAME=value`; `full` (`-a`, `-f`): each
/// after its help, syntax and default; `comment_defaults` (`-C`): those not set in the
/// environment commented out, as ucx_info does.
fn config_text(cfg: &Config, full: bool, comment_defaults: bool) -> String {
    let mut s = String::new();
    for (v, value) in cfg.entries() {
        let given = shown(value);
        let used = cfg.adjusted(v.name);
        if full {
            s.push_str(&format!(
                "#\n# {}\n#\n# syntax:    {}\n# default:   {}\n",
                v.help, v.accepts, v.default
            ));
            if let Some((used, why)) = &used {
                s.push_str(&format!("# in force:  {used} (given: {given}; {why})\n"));
            }
            s.push_str("#\n");
        }
        let unset = std::env::var_os(v.name).is_none();
        let hash = if comment_defaults && unset { "# " } else { "" };
        let value = used.map_or(given, |(u, _)| u);
        s.push_str(&format!("{hash}{}={value}\n", v.name));
    }
    s
}

/// A value as `-c` prints it: trimmed, as it is read; control characters escaped, so that
/// each variable stays on its line.
fn shown(value: &str) -> String {
    value
        .trim()
        .chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// `a..<label>..b` protocol ranges as ucx_info prints them. `short_end`: first size that
/// is not short; `eager_end`: first size sent by rendezvous (None = never).
fn ranges(name: &str, short_end: usize, eager_end: Option<usize>) -> String {
    let mut s = format!("#   {name:>14}: 0");
    let short_end = eager_end.map_or(short_end, |e| short_end.min(e));
    if short_end > 0 {
        s.push_str(&format!("..<egr/short>..{short_end}"));
    }
    match eager_end {
        Some(e) if e > short_end => s.push_str(&format!("..<egr/bcopy>..{e}..<rndv>..(inf)")),
        Some(_) => s.push_str("..<rndv>..(inf)"),
        None => s.push_str("..<egr/bcopy>..(inf)"),
    }
    s.push('\n');
    s
}

/// The tcp capabilities of the address tcp would use: a non-loopback one for a peer on
/// another host; for one on this host the loopback device's, which the kernel routes a
/// connection to any local address through, whatever `COURIER_NET_DEVICES` says (it picks
/// the addresses a worker listens on and advertises). `list` is `courier::transports` of a
/// configuration without that filter for a local peer.
fn pick_interface(list: &[TransportInfo], remote: bool) -> Option<Result<Caps, String>> {
    let devices = &find(list, "tcp")?.devices;
    let ifs: Vec<(&DeviceInfo, IpAddr)> = devices
        .iter()
        .flat_map(|d| d.addresses.iter().map(move |ip| (d, *ip)))
        .collect();
    let pos = if remote {
        ifs.iter().position(|(_, ip)| !ip.is_loopback())
    } else {
        ifs.iter().position(|(_, ip)| ip.is_loopback())
    };
    let (d, ip) = pos
        .or(if ifs.is_empty() { None } else { Some(0) })
        .map(|i| ifs[i])?;
    Some(match d.failed.iter().find(|(f, _)| *f == ip) {
        Some((_, why)) => Err(why.clone()),
        None => d.caps.clone(),
    })
}

/// How a failed peer is noticed on a link with `c` (`-e -u e`).
fn keepalive_text(c: &Caps, cfg: &Config) -> String {
    match c.name {
        "self" => "none needed: the peer is this worker".into(),
        "shm" => "none needed: a peer's exit hangs up the link's socket, seen at the next progress".into(),
        _ if cfg.keepalive_timeout == Duration::MAX => {
            "no keepalive (COURIER_KEEPALIVE_TIMEOUT=inf); a closed connection is still seen at once".into()
        }
        _ => format!(
            "TCP keepalive: an idle connection probed every {:?}, the peer given up after {:?} without an answer (COURIER_KEEPALIVE_INTERVAL, COURIER_KEEPALIVE_TIMEOUT)",
            cfg.keepalive_interval, cfg.keepalive_timeout
        ),
    }
}

fn endpoint(cfg: &Config, a: &InfoArgs) -> CliResult<String> {
    let order: &[&str] = match a.peer.as_str() {
        "self" => &["self", "shm", "tcp"],
        "intra" => &["shm", "tcp"],
        "inter" => &["tcp"],
        p => {
            return Err(CliError::usage(format!(
                "-P {p}: expected self, intra or inter"
            )));
        }
    };
    if a.features.is_empty() {
        return Err(CliError::usage(
            "-u '': no features; accepted: t tag, m am, s stream, r rma, a amo, e error handling, w wakeup".to_string(),
        ));
    }
    for f in a.features.chars() {
        if !"tmsraew".contains(f) {
            return Err(CliError::usage(format!(
                "-u {}: unknown feature {f:?}; accepted: t tag, m am, s stream, r rma, a amo, e error handling, w wakeup",
                a.features
            )));
        }
    }
    // As ucx_info: e and w only modify the features that make lanes.
    if !a.features.chars().any(|f| "tmsra".contains(f)) {
        return Err(CliError::usage(format!(
            "-u {}: e and w only modify other features; select at least one of t tag, m am, s stream, r rma, a amo",
            a.features
        )));
    }
    let has = |f: char| a.features.contains(f);
    let mut s = String::new();
    let peer = match a.peer.as_str() {
        "self" => "self",
        "intra" => "intra-node",
        _ => "inter-node",
    };
    let mut why = Vec::new();
    let mut chosen = None;
    // A peer on this host reaches tcp through the loopback device whatever
    // COURIER_NET_DEVICES says (see `pick_interface`).
    let list = if a.peer == "inter" {
        courier::transports(cfg)
    } else {
        let mut all = cfg.clone();
        all.net_devices = None;
        courier::transports(&all)
    };
    for t in order {
        if !cfg.tls.allows(t) {
            why.push(format!("{t}: excluded by COURIER_TLS={}", cfg.tls.spec));
            continue;
        }
        let c = match *t {
            "self" | "shm" => memory_caps(&list, t),
            _ => match pick_interface(&list, a.peer == "inter") {
                Some(c) => c,
                None => Err("no usable network interface".into()),
            },
        };
        match c {
            // As ucx_info -u e / -u w: a transport that cannot do what was asked is left out.
            Ok(c) if has('e') && !c.peer_failure => {
                why.push(format!("{t}: cannot detect peer failure (-u e)"));
            }
            Ok(c) if has('w') && !c.wakeup => {
                why.push(format!("{t}: cannot wake a sleeping worker (-u w)"));
            }
            Ok(c) => {
                chosen = Some(c);
                break;
            }
            Err(e) => why.push(format!("{t}: {e}")),
        }
    }
    let Some(c) = chosen else {
        return Err(CliError::run(format!(
            "no transport can reach a {peer} peer: {}",
            why.join("; ")
        )));
    };
    let thresh = rndv_thresh(&c, cfg);
    s.push_str(&format!(
        "#\n# Courier endpoint (peer: {peer}, features: {})\n#\n",
        a.features
    ));
    let lane = format!("{}/{}", c.name, c.device);
    // The lanes as the library picks them (the same function writes its selection line),
    // two-sided ones first: each transport with the features that use it.
    let by_feature = courier::onesided::lanes(&c);
    let letter = |f: &str| match f {
        "tag" => 't',
        "am" => 'm',
        "stream" => 's',
        "rma" => 'r',
        _ => 'a',
    };
    let mut n = 0;
    for group in [&by_feature[..3], &by_feature[3..]] {
        let mut lanes: Vec<(&str, Vec<&str>)> = Vec::new();
        for (f, ts) in group.iter().filter(|(f, _)| has(letter(f))) {
            for t in ts {
                match lanes.iter_mut().find(|(x, _)| x == t) {
                    Some((_, fs)) => fs.push(f),
                    None => lanes.push((t, vec![*f])),
                }
            }
        }
        for (t, fs) in lanes {
            s.push_str(&format!("#   lane[{n}]: {t}  ({})\n", fs.join(" ")));
            n += 1;
        }
    }
    s.push_str(&format!(
        "#   selection: {peer} {} (as COURIER_LOG_LEVEL=info prints it)\n",
        courier::onesided::lanes_line(&c)
    ));
    if a.peer == "intra"
        && c.name == "tcp"
        && let Some(l) = &cfg.net_devices
    {
        s.push_str(&format!(
            "#   note: COURIER_NET_DEVICES={} picks the addresses a worker listens on and advertises; a connection to a listener's socket address on this host runs over {}\n",
            l.join(","),
            c.device
        ));
    }
    // Where the peer's memory is: the same context for a self peer; for the others, as
    // rkey_unpack decides from the link.
    let (reach, probed) = match a.peer.as_str() {
        "self" => (Reach::SameContext, false),
        p => shm_reach(&c, cfg, p == "intra"),
    };
    // Device memory on this host needs the driver; a peer on another host may have one.
    let no_cuda_here = match a.peer.as_str() {
        "inter" => None,
        _ => courier::cuda_driver(&cfg.cuda_lib)
            .err()
            .map(|e| e.detail().to_string()),
    };
    if has('e') {
        s.push_str(&format!(
            "#   keepalive: {lane}  ({})\n",
            keepalive_text(&c, cfg)
        ));
    }
    if has('w') {
        s.push_str(&format!(
            "#   wakeup: {lane}  (a sleeping worker is woken through its event fd)\n"
        ));
    }
    for w in &why {
        s.push_str(&format!("#   skipped {w}\n"));
    }
    s.push_str("#\n");
    // Frame header sizes of the protocol (see courier::wire::frame::Kind::header_len).
    use courier::wire::Kind;
    let (tag_hdr, tag_fit_hdr, am_hdr, stream_hdr) = (
        Kind::TagEager.header_len(),
        Kind::TagEagerSync.header_len(),
        Kind::Am.header_len(),
        Kind::Stream.header_len(),
    );
    let short = |h: usize| (c.max_short + 1).saturating_sub(h);
    if has('t') {
        let eager_end = rndv_from(&c, cfg, Kind::TagEagerSync);
        s.push_str(&ranges("tag_send", short(tag_hdr), Some(eager_end)));
        s.push_str(&ranges(
            "tag_send_sync",
            short(tag_fit_hdr),
            Some(eager_end),
        ));
        if c.name == "shm" && no_cuda_here.is_none() {
            s.push_str(&format!(
                "#   tag_send from cuda memory: 0..<host copy, as above>..{}..<rndv, read by the peer through CUDA IPC>..(inf)\n",
                cfg.cuda_ipc_thresh.max(1)
            ));
        }
    }
    if has('m') {
        let eager_end = rndv_from(&c, cfg, Kind::Am);
        s.push_str(&ranges("am_send", short(am_hdr), Some(eager_end)));
    }
    if has('s') {
        s.push_str(&ranges("stream_send", short(stream_hdr), None));
    }
    if has('r') || has('a') {
        if has('t') || has('m') || has('s') {
            s.push_str("#\n");
        }
        if let Some(why) = &no_cuda_here {
            s.push_str(&format!(
                "#   (no CUDA memory on this host: {why}; the cuda lines say what a host with a device does)\n"
            ));
        }
        s.push_str(&one_sided_ranges(&c, reach, has('r'), has('a')));
        if probed {
            s.push_str("#   registered memory: cma only where a one-word CMA read of the owner's region works (probed per key); shown as if it does not\n");
        }
    }
    if !s.ends_with("#\n") {
        s.push_str("#\n");
    }
    s.push_str(&format!(
        "#   rendezvous threshold: {thresh}{}\n",
        if cfg.rndv_thresh.is_some() {
            " (COURIER_RNDV_THRESH)"
        } else {
            " (transport default)"
        }
    ));
    Ok(s)
}

/// Entry point of `courier info`.
pub fn main(a: InfoArgs) -> CliResult<()> {
    let mut cfg = Config::from_env().map_err(|e| CliError::usage(e.detail().to_string()))?;
    // Said here, not through the library's log (which `info` does not set up): this is
    // the command users run to check their configuration.
    for k in courier::config::unknown_vars() {
        eprintln!(
            "courier: warning: {k} is not a Courier variable (see `courier info -c`); ignored"
        );
    }
    if let Some(d) = &a.device_types {
        restrict(&mut cfg, d)?;
    }
    let mut out = String::new();
    let any = a.version || a.build || a.devices || a.config || a.full || a.endpoint;
    if a.version || a.build {
        out.push_str(&version_line());
        out.push('\n');
        out.push_str("# transports: self (in-worker), shm (memfd FIFOs + CMA), tcp\n");
        out.push_str(&format!(
            "# apis: tag, active messages, stream, rma ({}), atomics ({}; {}), signal waits, semaphores\n",
            rma_names(),
            atomic_names(),
            atomic_widths()
        ));
    }
    if a.config || a.full {
        out.push_str(&config_text(&cfg, a.all || a.full, a.comment_defaults));
    }
    if a.devices {
        out.push_str(&devices(&cfg, a.transport.as_deref()));
    }
    if a.endpoint {
        out.push_str(&endpoint(&cfg, &a)?);
    }
    if !any {
        out.push_str(&version_line());
        out.push('\n');
        for t in courier::config::TRANSPORTS {
            let st = if cfg.tls.allows(t) {
                "allowed"
            } else {
                "excluded by COURIER_TLS"
            };
            out.push_str(&format!("#   {t:<5} {st}\n"));
        }
        out.push_str("# courier info -d: devices and capabilities; -c: configuration; -e -u tra: protocol thresholds\n");
    }
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(()),
        // The reader went away (`| head`): nothing more to say.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::run(format!(
            "cannot write to standard output: {e}"
        ))),
    }
}

/// `-D`: only transports of the given device type (and still only those `COURIER_TLS`
/// allows).
fn restrict(cfg: &mut Config, d: &str) -> CliResult<()> {
    let kept: Vec<&str> = courier::config::TRANSPORTS
        .into_iter()
        .filter(|t| match d {
            "shm" => *t == "shm",
            "net" => *t == "tcp",
            "self" => *t == "self",
            _ => true,
        })
        .filter(|t| cfg.tls.allows(t))
        .collect();
    if kept.is_empty() {
        return Err(CliError::usage(format!(
            "-D {d}: COURIER_TLS={} excludes every transport of that type",
            cfg.tls.spec
        )));
    }
    let spec = format!("{}, -D {d}", cfg.tls.spec);
    cfg.tls = courier::config::TlsSelection::parse(&kept.join(","))
        .map_err(|e| CliError::run(e.detail().to_string()))?;
    cfg.tls.spec = spec;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sided_range_shape() {
        let cfg = Config::from_env_with(&[("COURIER_TLS", "all")]).expect("configuration");
        let self_caps =
            memory_caps(&courier::transports(&cfg), "self").expect("self is always usable");
        let l = OwnerLimits::of(&self_caps);
        let (op, m) = (Op::Put, TargetMemory::Registered);
        assert_eq!(
            one_sided_range(op, m, Route::Direct, &l),
            "#              put: 0..<direct>..(inf)\n"
        );
        // A link that neither sends from the caller's buffer nor places frames.
        assert_eq!(
            one_sided_range(op, m, Route::Remote, &l),
            "#              put: 0..<remote/bcopy>..(inf)\n"
        );
        assert_eq!(
            one_sided_range(Op::Get, m, Route::Remote, &l),
            "#              get: 0..<remote>..(inf)\n"
        );
    }

    #[test]
    fn tcp_ranges_follow_the_link() {
        let mut cfg = Config::from_env_with(&[("COURIER_TLS", "all")]).expect("configuration");
        cfg.net_devices = None;
        let Some(Ok(c)) = pick_interface(&courier::transports(&cfg), false) else {
            return; // no loopback interface: nothing to look at
        };
        let l = OwnerLimits::of(&c);
        let (Some(z), Some(p)) = (
            l.zcopy_from,
            l.placed_from(Op::Put, TargetMemory::Allocated),
        ) else {
            panic!("tcp sends from the caller's buffer and places puts: {l:?}");
        };
        assert_eq!(
            one_sided_range(Op::Put, TargetMemory::Allocated, Route::Remote, &l),
            format!(
                "#              put: 0..<remote/bcopy>..{z}..<remote/zcopy>..{p}..<remote/zcopy,placed>..(inf)\n"
            )
        );
        // Device memory at the owner is not placed; neither is the frame with the signal.
        assert!(
            !one_sided_range(Op::Put, TargetMemory::Cuda, Route::Remote, &l).contains("placed")
        );
        assert!(
            !one_sided_range(Op::PutSignal, TargetMemory::Allocated, Route::Remote, &l)
                .contains("placed")
        );
        let d = one_sided_caps(&c, Reach::Elsewhere);
        let get = d
            .iter()
            .find(|(k, _)| k == "get_bcopy")
            .expect("get_bcopy line");
        assert!(get.1.contains(&l.get_piece.to_string()), "{get:?}");
    }

    #[test]
    fn ranges_shape() {
        assert_eq!(
            ranges("tag_send", 241, Some(65536)),
            "#         tag_send: 0..<egr/short>..241..<egr/bcopy>..65536..<rndv>..(inf)\n"
        );
        assert_eq!(
            ranges("stream_send", 249, None),
            "#      stream_send: 0..<egr/short>..249..<egr/bcopy>..(inf)\n"
        );
        assert_eq!(
            ranges("tag_send", 241, Some(100)),
            "#         tag_send: 0..<egr/short>..100..<rndv>..(inf)\n"
        );
    }
}
