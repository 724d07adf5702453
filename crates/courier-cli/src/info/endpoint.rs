//! `-e`: the lanes and protocol thresholds an endpoint would use with a peer of a given
//! locality.

use super::*;

/// `a..<label>..b` protocol ranges as ucx_info prints them. `short_end`: first size that
/// is not short; `eager_end`: first size sent by rendezvous (None = never).
pub(super) fn ranges(name: &str, short_end: usize, eager_end: Option<usize>) -> String {
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
pub(super) fn pick_interface(list: &[TransportInfo], remote: bool) -> Option<Result<Caps, String>> {
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
pub(super) fn keepalive_text(c: &Caps, cfg: &Config) -> String {
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

pub(super) fn endpoint(cfg: &Config, a: &InfoArgs) -> CliResult<String> {
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
