//! `-d`: each memory domain with its transports and their capabilities, as
//! `courier::transports` reports them.

use super::*;

pub(super) fn caps_block(c: &Caps, thresh: usize, extra: &[(String, String)]) -> String {
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

pub(super) fn unusable(name: &str, device: &str, why: &str) -> String {
    format!(
        "#      Transport: {name}\n#         Device: {device}\n#         Status: not usable: {why}\n#\n"
    )
}

/// `-d`: each memory domain with its transports; `only` (`-t`): just that transport.
pub(super) fn devices(cfg: &Config, only: Option<&str>) -> String {
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
pub(super) fn tcp_device(d: &DeviceInfo, thresh: impl Fn(&Caps) -> usize) -> String {
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
pub(super) fn cuda_domain(cfg: &Config) -> String {
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
