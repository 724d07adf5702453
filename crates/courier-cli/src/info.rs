//! `courier info`: a drop-in for ucx_info.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use courier::base::config::{Config, VARS};
use courier::transport::{Caps, LinkTx, RndvMode, loopback, shm, tcp};

use crate::error::{CliError, CliResult};

/// Options of `courier info` (ucx_info's).
#[derive(clap::Args, Debug, Clone)]
#[command(disable_version_flag = true)]
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
    /// Configuration variables in force
    #[arg(short = 'c')]
    pub config: bool,
    /// With -c: also default, accepted values and help
    #[arg(short = 'a')]
    pub all: bool,
    /// With -c: fully decorated (same as -a)
    #[arg(short = 'f')]
    pub full: bool,
    /// Endpoint lanes and protocol thresholds
    #[arg(short = 'e')]
    pub endpoint: bool,
    /// Features for -e: t tag, m am, s stream (r rma, a amo: not supported); e, w accepted
    #[arg(short = 'u', default_value = "t")]
    pub features: String,
    /// Peer for -e: self, intra (same host) or inter (another host)
    #[arg(short = 'P', default_value = "inter")]
    pub peer: String,
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

fn self_caps() -> Caps {
    let ((tx, _rx), _other) = loopback::pair();
    LinkTx::Loopback(tx).caps().clone()
}

fn tcp_caps(ip: IpAddr, cfg: &Config) -> Result<Caps, String> {
    let mut l = tcp::Listener::bind(SocketAddr::new(ip, 0), cfg).map_err(|e| e.to_string())?;
    let (tx, _rx) = tcp::connect(l.local_addr(), cfg).map_err(|e| e.to_string())?;
    let _ = l.accept();
    Ok(LinkTx::Tcp(tx).caps().clone())
}

fn shm_caps(cfg: &Config) -> Result<Caps, String> {
    shm::probe(cfg)?;
    let mut acc = shm::Acceptor::bind(cfg).map_err(|e| e.to_string())?;
    let name = acc.name().to_vec();
    let cfg2 = cfg.clone();
    let h = std::thread::spawn(move || {
        shm::connect(&name, &cfg2)
            .map(|(tx, _rx)| LinkTx::Shm(tx).caps().clone())
            .map_err(|e| e.to_string())
    });
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut kept = Vec::new();
    while !h.is_finished() && Instant::now() < deadline {
        match acc.accept() {
            Ok(Some(link)) => kept.push(link),
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => return Err(e.to_string()),
        }
    }
    if !h.is_finished() {
        return Err("a test connection did not complete in 3 s".into());
    }
    h.join()
        .map_err(|_| "the test connection panicked".to_string())?
}

fn caps_block(c: &Caps, thresh: usize, extra: &[(&str, String)]) -> String {
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
        "#           rendezvous: {mode}, from {thresh} bytes\n"
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

fn devices(cfg: &Config) -> String {
    let tls = &cfg.tls;
    let thresh = |c: &Caps| cfg.rndv_thresh.unwrap_or(c.rndv_thresh).max(1);
    let mut s = String::from("#\n# Memory domain: memory\n#\n");
    let excluded = |_: &str| format!("excluded by COURIER_TLS={}", tls.spec);
    if tls.allows("self") {
        let c = self_caps();
        s.push_str(&caps_block(&c, thresh(&c), &[]));
    } else {
        s.push_str(&unusable("self", "memory", &excluded("self")));
    }
    if tls.allows("shm") {
        match shm_caps(cfg) {
            Ok(c) => {
                let cma = if c.rndv == RndvMode::RemoteRead {
                    "works (probed in this process)".to_string()
                } else {
                    "refused (bounce buffers)".to_string()
                };
                s.push_str(&caps_block(
                    &c,
                    thresh(&c),
                    &[
                        ("cma", cma),
                        (
                            "cma policy",
                            format!("{:?}; {}", cfg.shm_cma, shm::cma_status()),
                        ),
                    ],
                ));
            }
            Err(e) => s.push_str(&unusable("shm", "memory", &e)),
        }
    } else {
        s.push_str(&unusable("shm", "memory", &excluded("shm")));
    }
    s.push_str(&cuda_domain(cfg));
    s.push_str("#\n# Memory domain: tcp\n#\n");
    let ifs = tcp::interfaces(cfg);
    if !tls.allows("tcp") {
        s.push_str(&unusable("tcp", "(all interfaces)", &excluded("tcp")));
    } else if ifs.is_empty() {
        let why = match &cfg.net_devices {
            Some(l) => format!(
                "no interface that is up matches COURIER_NET_DEVICES={}",
                l.join(",")
            ),
            None => "no network interface is up".into(),
        };
        s.push_str(&unusable("tcp", "(none)", &why));
    } else {
        for (name, ip) in ifs {
            match tcp_caps(ip, cfg) {
                Ok(mut c) => {
                    if c.device.is_empty() || c.device == "?" {
                        c.device = name.clone();
                    }
                    s.push_str(&caps_block(&c, thresh(&c), &[("address", ip.to_string())]));
                }
                Err(e) => s.push_str(&unusable("tcp", &format!("{name} ({ip})"), &e)),
            }
        }
    }
    s
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
             #         copies: staged through host memory on a private stream; peers reach a cuda region through its owner\n\
             #         limits: no atomics or signal words in device memory\n#\n",
            d.devices, d.device_name, d.version
        )),
        Err(e) => s.push_str(&format!("#         Status: not usable: {}\n#\n", e.detail())),
    }
    s
}

fn config_text(cfg: &Config, all: bool) -> String {
    let mut s = String::new();
    for (v, value) in cfg.entries() {
        if all {
            s.push_str(&format!(
                "#\n# {}\n#\n# syntax:    {}\n# default:   {}\n#\n",
                v.help, v.accepts, v.default
            ));
        }
        s.push_str(&format!("{}={}\n", v.name, value));
    }
    let _ = VARS;
    s
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

/// The interface tcp would use: a non-loopback one for a peer on another host.
fn pick_interface(cfg: &Config, remote: bool) -> Option<(String, IpAddr)> {
    let ifs = tcp::interfaces(cfg);
    let pos = if remote {
        ifs.iter().position(|(_, ip)| !ip.is_loopback())
    } else {
        ifs.iter().position(|(_, ip)| ip.is_loopback())
    };
    pos.or(if ifs.is_empty() { None } else { Some(0) })
        .map(|i| ifs[i].clone())
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
    for f in a.features.chars() {
        if !"tmsraew".contains(f) {
            return Err(CliError::usage(format!(
                "-u {}: unknown feature {f:?}; accepted: t tag, m am, s stream, r rma, a amo, e error handling, w wakeup",
                a.features
            )));
        }
    }
    let mut s = String::new();
    let peer = match a.peer.as_str() {
        "self" => "self",
        "intra" => "intra-node",
        _ => "inter-node",
    };
    let mut why = Vec::new();
    let mut chosen = None;
    for t in order {
        if !cfg.tls.allows(t) {
            why.push(format!("{t}: excluded by COURIER_TLS={}", cfg.tls.spec));
            continue;
        }
        let c = match *t {
            "self" => Ok(self_caps()),
            "shm" => shm_caps(cfg),
            _ => match pick_interface(cfg, a.peer == "inter") {
                Some((_, ip)) => tcp_caps(ip, cfg),
                None => Err("no usable network interface".into()),
            },
        };
        match c {
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
    let thresh = cfg.rndv_thresh.unwrap_or(c.rndv_thresh).max(1);
    s.push_str(&format!(
        "#\n# Courier endpoint (peer: {peer}, features: {})\n#\n",
        a.features
    ));
    let mut feats = Vec::new();
    if a.features.contains('t') {
        feats.push("tag");
    }
    if a.features.contains('m') {
        feats.push("am");
    }
    if a.features.contains('s') {
        feats.push("stream");
    }
    s.push_str(&format!(
        "#   lane[0]: {}/{}  ({})\n",
        c.name,
        c.device,
        feats.join(" ")
    ));
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
    if a.features.contains('t') {
        let eager_end = thresh.min((c.max_frame + 1).saturating_sub(tag_fit_hdr));
        s.push_str(&ranges("tag_send", short(tag_hdr), Some(eager_end)));
        s.push_str(&ranges(
            "tag_send_sync",
            short(tag_fit_hdr),
            Some(eager_end),
        ));
    }
    if a.features.contains('m') {
        let eager_end = thresh.min((c.max_frame + 1).saturating_sub(am_hdr));
        s.push_str(&ranges("am_send", short(am_hdr), Some(eager_end)));
    }
    if a.features.contains('s') {
        s.push_str(&ranges("stream_send", short(stream_hdr), None));
    }
    if a.features.contains('r') || a.features.contains('a') {
        s.push_str("#   rma/amo: not supported by Courier yet\n");
    }
    s.push_str(&format!(
        "#\n#   rendezvous threshold: {thresh}{}\n",
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
    let cfg = Config::from_env().map_err(|e| CliError::usage(e.detail().to_string()))?;
    let mut out = String::new();
    let any = a.version || a.build || a.devices || a.config || a.endpoint;
    if a.version || a.build {
        out.push_str(&version_line());
        out.push('\n');
        out.push_str("# transports: self (in-worker), shm (memfd FIFOs + CMA), tcp\n");
        out.push_str("# apis: tag, active messages, stream; rma/atomics: no\n");
    }
    if a.config {
        out.push_str(&config_text(&cfg, a.all || a.full));
    }
    if a.devices {
        out.push_str(&devices(&cfg));
    }
    if a.endpoint {
        out.push_str(&endpoint(&cfg, &a)?);
    }
    if !any {
        out.push_str(&version_line());
        out.push('\n');
        for t in courier::base::config::TRANSPORTS {
            let st = if cfg.tls.allows(t) {
                "allowed"
            } else {
                "excluded by COURIER_TLS"
            };
            out.push_str(&format!("#   {t:<5} {st}\n"));
        }
        out.push_str("# courier info -d: devices and capabilities; -c: configuration; -e -u t: protocol thresholds\n");
    }
    print!("{out}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
