//! The one-sided lines of `-d` (capabilities by route) and `-e` (ranges by memory kind), from
//! `courier::onesided`'s description of the routes.

use super::*;

/// "32, 64 bit": the word widths of atomics.
pub(super) fn atomic_widths() -> String {
    let w: Vec<String> = ATOMIC_BITS.iter().map(|b| b.to_string()).collect();
    format!("{} bit", w.join(", "))
}

/// The atomic operations' names, space-separated.
pub(super) fn atomic_names() -> String {
    let n: Vec<&str> = AtomicOp::ALL.iter().map(|o| o.name()).collect();
    n.join(" ")
}

/// The one-sided operations other than atomics, comma-separated.
pub(super) fn rma_names() -> String {
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
pub(super) fn shm_reach(c: &Caps, cfg: &Config, same_host: bool) -> (Reach, bool) {
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
pub(super) fn route_summary(reach: Reach, mem: TargetMemory) -> String {
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
pub(super) fn uses_owner(reach: Reach, op: Op) -> bool {
    TargetMemory::ALL
        .iter()
        .any(|m| op_route(reach, *m, op) == Route::Remote)
}

/// `-d` capability lines of one-sided operations over a link with `c` to a peer at `reach`
/// (ucx_info's `put_zcopy`, `get_bcopy`, `atomic_add` lines).
pub(super) fn one_sided_caps(c: &Caps, reach: Reach) -> Vec<(String, String)> {
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
pub(super) fn one_sided_range(op: Op, mem: TargetMemory, route: Route, l: &OwnerLimits) -> String {
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
pub(super) fn one_sided_ranges(c: &Caps, reach: Reach, rma: bool, amo: bool) -> String {
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

#[cfg(test)]
mod tests {
    use super::super::endpoint::pick_interface;
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
        // Device memory at the owner is not placed.
        assert!(
            !one_sided_range(Op::Put, TargetMemory::Cuda, Route::Remote, &l).contains("placed")
        );
        // A put-with-signal's frames are placed as a put's (the signal follows the payload).
        let Some(ps) = l.placed_from(Op::PutSignal, TargetMemory::Allocated) else {
            panic!("tcp places puts with a signal: {l:?}");
        };
        assert_eq!(
            one_sided_range(Op::PutSignal, TargetMemory::Allocated, Route::Remote, &l),
            format!(
                "#       put_signal: 0..<remote/bcopy>..{z}..<remote/zcopy>..{ps}..<remote/zcopy,placed>..(inf)\n"
            )
        );
        assert!(
            !one_sided_range(Op::PutSignal, TargetMemory::Cuda, Route::Remote, &l)
                .contains("placed")
        );
        let d = one_sided_caps(&c, Reach::Elsewhere);
        let get = d
            .iter()
            .find(|(k, _)| k == "get_bcopy")
            .expect("get_bcopy line");
        assert!(get.1.contains(&l.get_piece.to_string()), "{get:?}");
    }
}
