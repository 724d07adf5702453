//! `courier info`: the one-sided lanes and capabilities of `-e` and `-d`, `-e` for every
//! kind of peer, and the feature letters. Shapes and the presence of the right lanes are
//! checked, not numbers that may be tuned.

mod common;
use common::courier;

/// Run `courier info ARGS`, which must succeed; its standard output.
#[path = "../../courier/tests/mockcuda/mod.rs"]
mod mockcuda;

fn info(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut all = vec!["info"];
    all.extend_from_slice(args);
    let o = courier(&all, env);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{all:?} failed:\n{out}\n{err}");
    out
}

/// The value of the `#   NAME: value` line (names are right-aligned), if there is one.
fn field<'a>(lines: &[&'a str], name: &str) -> Option<&'a str> {
    lines.iter().find_map(|l| {
        let (k, v) = l.strip_prefix('#')?.split_once(": ")?;
        (k.trim() == name).then_some(v)
    })
}

/// The lines `-e` prints under `#   KIND memory: key path ...` (up to the next such line),
/// and the key path named there.
fn memory<'a>(out: &'a str, kind: &str) -> (&'a str, Vec<&'a str>) {
    let head = format!("#   {kind} memory: key path ");
    let mut it = out.lines().skip_while(|l| !l.starts_with(&head));
    let first = it
        .next()
        .unwrap_or_else(|| panic!("no {kind} memory section:\n{out}"));
    let path = first[head.len()..].split(' ').next().unwrap_or("");
    let body = it
        .take_while(|l| !l.contains(" memory: key path ") && l.starts_with("#    "))
        .collect();
    (path, body)
}

/// `0..<label>..(inf)` or `0..<a>..N..<b>..(inf)` with increasing sizes: the labels.
fn range_labels(range: &str) -> Vec<String> {
    let parts: Vec<&str> = range.split("..").collect();
    assert!(
        parts.len() >= 3 && parts[0] == "0" && parts[parts.len() - 1] == "(inf)",
        "not a range: {range}"
    );
    let mut labels = Vec::new();
    let mut last = 0u64;
    for (i, p) in parts[1..parts.len() - 1].iter().enumerate() {
        if i % 2 == 0 {
            let l = p
                .strip_prefix('<')
                .and_then(|p| p.strip_suffix('>'))
                .unwrap_or_else(|| panic!("not a <label> in {range}"));
            labels.push(l.to_string());
        } else {
            let n: u64 = p
                .parse()
                .unwrap_or_else(|_| panic!("not a size in {range}"));
            assert!(n > last, "sizes do not increase in {range}");
            last = n;
        }
    }
    labels
}

/// The transport of `lane[0]` (`shm/memory` → `shm`).
fn lane0(out: &str) -> &str {
    let l = out
        .lines()
        .find(|l| l.starts_with("#   lane[0]: "))
        .unwrap_or_else(|| panic!("no lane[0]:\n{out}"));
    l["#   lane[0]: ".len()..].split('/').next().unwrap_or("")
}

/// Every kind of memory has put, get and put_signal ranges, and atomic32/64 lines, with
/// routes consistent with its key path. Returns the labels of each kind's put.
fn check_one_sided(out: &str) -> Vec<(String, Vec<String>)> {
    let mut puts = Vec::new();
    for kind in ["allocated", "registered", "cuda"] {
        let (path, body) = memory(out, kind);
        for op in ["put", "get", "put_signal"] {
            let r = field(&body, op).unwrap_or_else(|| panic!("{kind}: no {op}:\n{out}"));
            let labels = range_labels(r);
            // Operations done in the call take the key's path for every size; the others
            // go through the owner.
            let in_call = labels.len() == 1 && labels[0] == path;
            let remote = labels.iter().all(|l| l.starts_with("remote"));
            assert!(in_call || remote, "{kind} {op}: {r} with key path {path}");
            if path == "remote" {
                assert!(remote, "{kind} {op}: {r}");
            }
            if op == "put" {
                puts.push((kind.to_string(), labels));
            }
        }
        for bits in ["atomic32", "atomic64"] {
            let a = field(&body, bits).unwrap_or_else(|| panic!("{kind}: no {bits}:\n{out}"));
            if kind == "cuda" {
                assert!(a.starts_with("unsupported"), "{kind} {bits}: {a}");
            } else {
                assert!(
                    a.contains("add and or xor swap cswap") && a.starts_with('<'),
                    "{kind} {bits}: {a}"
                );
            }
        }
    }
    puts
}

#[test]
fn e_self_shows_local_lanes_for_every_operation() {
    let out = info(&["-e", "-u", "tmsra", "-P", "self"], &[]);
    assert!(out.contains("(peer: self, features: tmsra)"), "{out}");
    assert_eq!(lane0(&out), "self", "{out}");
    assert!(out.contains("#   lane[1]: self/memory  (rma amo)"), "{out}");
    assert!(
        field(&out.lines().collect::<Vec<_>>(), "tag_send")
            .is_some_and(|r| range_labels(r).contains(&"rndv".to_string())),
        "{out}"
    );
    // self copies every eager message in the call, as one frame: no bcopy range.
    for op in ["tag_send", "tag_send_sync", "am_send"] {
        let r = field(&out.lines().collect::<Vec<_>>(), op).unwrap_or_default();
        assert_eq!(range_labels(r), ["egr/short", "rndv"], "{op}: {r}");
    }
    check_one_sided(&out);
    for kind in ["allocated", "registered"] {
        let (path, body) = memory(&out, kind);
        assert_eq!(path, "local", "{kind}:\n{out}");
        assert_eq!(field(&body, "put"), Some("0..<local>..(inf)"), "{out}");
        assert!(field(&body, "atomic64").is_some_and(|a| a.starts_with("<local>")));
    }
    // The peer is this context whatever transport carries the endpoint.
    let out = info(&["-e", "-u", "ra", "-P", "self"], &[("COURIER_TLS", "tcp")]);
    assert_eq!(lane0(&out), "tcp", "{out}");
    assert_eq!(memory(&out, "registered").0, "local", "{out}");
    assert!(
        out.contains("skipped self: excluded by COURIER_TLS=tcp"),
        "{out}"
    );
}

#[test]
fn e_intra_maps_allocated_memory_and_uses_cma_or_the_owner_for_registered() {
    let out = info(&["-e", "-u", "tmsra", "-P", "intra"], &[]);
    assert!(out.contains("(peer: intra-node, features: tmsra)"), "{out}");
    let puts = check_one_sided(&out);
    match lane0(&out) {
        "shm" => {
            let (path, body) = memory(&out, "allocated");
            assert_eq!(path, "direct", "{out}");
            for op in ["put", "get", "put_signal"] {
                assert_eq!(field(&body, op), Some("0..<direct>..(inf)"), "{op}:\n{out}");
            }
            assert!(field(&body, "atomic64").is_some_and(|a| a.starts_with("<direct>")));
            let (path, body) = memory(&out, "registered");
            assert!(path == "cma" || path == "remote", "{out}");
            // put_signal into registered memory goes the key's way (with CMA the data in
            // the call, the signal word set directly); atomics through the owner.
            let signal_route = if path == "cma" { "<cma" } else { "<remote" };
            assert!(
                field(&body, "put_signal").is_some_and(|r| r.contains(signal_route)),
                "{out}"
            );
            assert!(field(&body, "atomic32").is_some_and(|a| a.starts_with("<remote>")));
            assert_eq!(memory(&out, "cuda").0, "cuda_ipc", "{out}");
            // Frame sizes are shown when puts or gets go through the owner: into registered
            // memory without CMA (atomics, which always do, are one frame each way).
            assert_eq!(
                out.contains("#   remote frames: put "),
                path == "remote",
                "{out}"
            );
            // Tag messages from device memory: a host copy, then from 16 KiB
            // (COURIER_CUDA_IPC_THRESH) the peer reads them through CUDA IPC; where the
            // driver loads, for there is no device memory on this host otherwise (and a
            // note says so).
            let cuda_line = format!(
                "#   tag_send from cuda memory: 0..<host copy, as above>..{}..<rndv, read by the peer through CUDA IPC>..(inf)",
                16 << 10
            );
            let no_cuda = out.contains("#   (no CUDA memory on this host: ");
            assert_eq!(out.contains(&cuda_line), !no_cuda, "{out}");
            // With a driver (the stand-in where the machine has none), the line shows the
            // limit in force.
            let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mockcuda");
            let lib = mockcuda::build(&dir);
            let env = [
                ("COURIER_CUDA_LIB", lib.as_str()),
                ("COURIER_CUDA_IPC_THRESH", "4k"),
            ];
            let at4k = info(&["-e", "-u", "t", "-P", "intra"], &env);
            let line = cuda_line.replace(&(16 << 10).to_string(), "4096");
            assert!(at4k.contains(&line), "{at4k}");
            // The lanes: shared memory for messages, CMA for large ones where it works,
            // direct stores into allocated memory.
            assert!(
                out.contains("#   lane[0]: shm/memory  (tag am stream)"),
                "{out}"
            );
            assert!(
                out.contains("  (rma amo)\n") && out.contains("direct/memory"),
                "{out}"
            );
        }
        // Shared memory does not work here: tcp, and the reason shm was skipped.
        "tcp" => {
            assert!(out.contains("#   skipped shm: "), "{out}");
            assert!(!out.contains("tag_send from cuda memory"), "{out}");
        }
        other => panic!("intra-node lane {other}:\n{out}"),
    }
    assert!(puts.iter().all(|(_, l)| !l.is_empty()));

    // Without CMA, registered memory goes through the owner.
    let out = info(
        &["-e", "-u", "r", "-P", "intra"],
        &[("COURIER_SHM_CMA", "no")],
    );
    if lane0(&out) == "shm" {
        let (path, body) = memory(&out, "registered");
        assert_eq!(path, "remote", "{out}");
        assert_eq!(
            field(&body, "put").map(range_labels),
            Some(vec!["remote/bcopy".to_string()]),
            "{out}"
        );
        assert_eq!(memory(&out, "allocated").0, "direct", "{out}");
    }

    // Over tcp with shared memory excluded, everything goes through the owner.
    let out = info(
        &["-e", "-u", "ra", "-P", "intra"],
        &[("COURIER_TLS", "tcp")],
    );
    assert_eq!(lane0(&out), "tcp", "{out}");
    for kind in ["allocated", "registered", "cuda"] {
        assert_eq!(memory(&out, kind).0, "remote", "{kind}:\n{out}");
    }
    check_one_sided(&out);
}

#[test]
fn e_inter_goes_through_the_owner_with_tcp_thresholds() {
    let out = info(
        &["-e", "-u", "ra", "-P", "inter"],
        &[("COURIER_TLS", "tcp")],
    );
    assert_eq!(lane0(&out), "tcp", "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("#   lane[0]: tcp/") && l.ends_with("  (rma amo)")),
        "{out}"
    );
    assert!(
        out.contains("#   selection: inter-node tag(tcp/") && out.contains(" rma(tcp/"),
        "{out}"
    );
    // No two-sided lines when only r and a are asked for.
    assert!(!out.contains("tag_send"), "{out}");
    for (kind, put) in check_one_sided(&out) {
        // Copied by the link first, then sent from the caller's buffer.
        assert_eq!(put[0], "remote/bcopy", "{kind}:\n{out}");
        assert!(
            put[1..].iter().any(|l| l == "remote/zcopy"),
            "{kind}:\n{out}"
        );
    }
    let (_, body) = memory(&out, "allocated");
    let get = field(&body, "get").map(range_labels).unwrap_or_default();
    assert_eq!(get[0], "remote", "{out}");
    assert!(out.contains("#   remote frames: put "), "{out}");

    // Only what was asked for: atomics alone, rma alone, neither.
    let out = info(&["-e", "-u", "a", "-P", "inter"], &[("COURIER_TLS", "tcp")]);
    let (_, body) = memory(&out, "registered");
    assert!(
        field(&body, "atomic64").is_some() && field(&body, "put").is_none(),
        "{out}"
    );
    let out = info(&["-e", "-u", "r", "-P", "inter"], &[("COURIER_TLS", "tcp")]);
    let (_, body) = memory(&out, "registered");
    assert!(
        field(&body, "put").is_some() && field(&body, "atomic64").is_none(),
        "{out}"
    );
    let out = info(&["-e", "-u", "t", "-P", "inter"], &[("COURIER_TLS", "tcp")]);
    assert!(!out.contains("key path") && !out.contains("(rma"), "{out}");
}

/// The block of `-d` for one transport (from its `Transport:` line to the next).
fn transport_blocks(out: &str) -> Vec<Vec<&str>> {
    let mut blocks: Vec<Vec<&str>> = Vec::new();
    for l in out.lines() {
        if l.trim_start_matches('#')
            .trim_start()
            .starts_with("Transport:")
        {
            blocks.push(Vec::new());
        }
        if let Some(b) = blocks.last_mut() {
            b.push(l);
        }
    }
    blocks
}

#[test]
fn d_lists_one_sided_capabilities_per_transport() {
    let out = info(&["-d"], &[]);
    let mut seen = Vec::new();
    for b in transport_blocks(&out) {
        let name = field(&b, "Transport").unwrap_or("");
        if field(&b, "Status").is_some_and(|s| s.starts_with("not usable")) || name == "cuda_copy" {
            continue;
        }
        seen.push(name.to_string());
        assert_eq!(
            field(&b, "one-sided"),
            Some("put, get, put_signal, atomic32, atomic64"),
            "{name}:\n{}",
            b.join("\n")
        );
        for op in ["add", "and", "or", "xor", "swap", "cswap"] {
            let a = field(&b, &format!("atomic_{op}"));
            assert!(
                a.is_some_and(|a| a.starts_with("32, 64 bit")),
                "{name} atomic_{op}"
            );
        }
        for kind in ["allocated", "registered", "cuda"] {
            assert!(
                field(&b, &format!("{kind} memory")).is_some(),
                "{name}: {kind}"
            );
        }
        let cuda = field(&b, "cuda memory").unwrap_or("");
        assert!(cuda.contains("unsupported: atomic"), "{name}: {cuda}");
        match name {
            "self" => {
                assert_eq!(
                    field(&b, "allocated memory"),
                    Some("local: put, get, put_signal, atomic")
                );
                assert!(field(&b, "put_zcopy").is_some_and(|v| v.starts_with("unlimited")));
                assert!(
                    field(&b, "put_bcopy").is_none(),
                    "self never goes through frames"
                );
            }
            "shm" => {
                assert_eq!(
                    field(&b, "allocated memory"),
                    Some("direct: put, get, put_signal, atomic")
                );
                let reg = field(&b, "registered memory").unwrap_or("");
                assert!(
                    reg == "cma: put, get, put_signal; remote: atomic"
                        || reg.starts_with("remote:"),
                    "{reg}"
                );
                assert!(field(&b, "get_zcopy").is_some_and(|v| v.starts_with("unlimited")));
                // Puts with a signal go through the owner only where CMA does not reach.
                assert_eq!(
                    field(&b, "put_signal_bcopy").is_some_and(|v| v.contains("bytes a frame")),
                    reg.starts_with("remote:"),
                    "{reg}"
                );
                assert!(field(&b, "remote atomics").is_some());
            }
            "tcp" => {
                assert_eq!(
                    field(&b, "registered memory"),
                    Some("remote: put, get, put_signal, atomic")
                );
                for k in ["put_bcopy", "put_zcopy", "put_signal_bcopy", "get_bcopy"] {
                    assert!(
                        field(&b, k).is_some_and(|v| v.contains("bytes a frame")),
                        "tcp {k}:\n{}",
                        b.join("\n")
                    );
                }
                assert!(field(&b, "remote atomics").is_some());
            }
            other => panic!("unknown transport {other}"),
        }
    }
    assert!(
        seen.iter().any(|t| t == "self") && seen.iter().any(|t| t == "tcp"),
        "{out}"
    );
}

#[test]
fn v_lists_the_one_sided_apis() {
    let out = info(&["-v"], &[]);
    assert!(!out.contains("rma/atomics: no"), "{out}");
    let apis = out
        .lines()
        .find(|l| l.starts_with("# apis: "))
        .unwrap_or_else(|| panic!("no apis line:\n{out}"));
    for w in [
        "tag",
        "rma (put, get, put_signal)",
        "atomics (add and or xor swap cswap; 32, 64 bit)",
    ] {
        assert!(apis.contains(w), "{w}: {apis}");
    }
}

#[test]
fn feature_letters_e_and_w_show_keepalive_and_wakeup_and_others_are_refused() {
    let out = info(
        &["-e", "-u", "te", "-P", "inter"],
        &[("COURIER_TLS", "tcp")],
    );
    let ka = out
        .lines()
        .find(|l| l.starts_with("#   keepalive: tcp/"))
        .unwrap_or_else(|| panic!("no keepalive lane:\n{out}"));
    // What is in force: TCP keepalive counts whole seconds, so the default is 1 s.
    assert!(
        ka.contains("TCP keepalive") && ka.contains("every 1s") && ka.contains("after 2s"),
        "{ka}"
    );
    let out = info(
        &["-e", "-u", "te", "-P", "inter"],
        &[
            ("COURIER_TLS", "tcp"),
            ("COURIER_KEEPALIVE_INTERVAL", "1.5s"),
        ],
    );
    assert!(
        out.contains("every 2s"),
        "rounded up to whole seconds:\n{out}"
    );
    // Shared memory needs none: a peer's exit hangs up its socket.
    let out = info(&["-e", "-u", "te", "-P", "intra"], &[]);
    if lane0(&out) == "shm" {
        assert!(
            out.contains("#   keepalive: shm/memory  (none needed: "),
            "{out}"
        );
    }
    assert!(!out.contains("#   wakeup: "), "{out}");
    let out = info(&["-e", "-u", "tw", "-P", "self"], &[]);
    assert!(out.contains("#   wakeup: self/memory"), "{out}");
    assert!(!out.contains("keepalive"), "{out}");
    let o = courier(&["info", "-e", "-u", ""], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no features"));
    let o = courier(&["info", "-e", "-u", "tq"], &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("unknown feature 'q'") && err.contains("w wakeup"),
        "{err}"
    );
}

/// The lanes `-e` names are the ones the library picks: its selection line (printed at
/// `COURIER_LOG_LEVEL=info` by a real run between two endpoints on this host) is the line
/// `-e` shows, on shared memory and on tcp.
#[test]
fn e_selection_is_what_a_run_logs() {
    for env in [&[][..], &[("COURIER_TLS", "tcp")][..]] {
        let out = info(&["-e", "-u", "tmsra", "-P", "intra"], env);
        let want = out
            .lines()
            .find_map(|l| l.strip_prefix("#   selection: "))
            .and_then(|l| l.strip_suffix(" (as COURIER_LOG_LEVEL=info prints it)"))
            .unwrap_or_else(|| panic!("no selection line:\n{out}"))
            .to_string();
        let mut run_env = env.to_vec();
        run_env.push(("COURIER_LOG_LEVEL", "info"));
        let o = courier(&["perf", "-l", "-t", "tag_lat", "-n", "100"], &run_env);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        let got = err
            .lines()
            .find_map(|l| {
                let (_, rest) = l.split_once(" intra-node cfg#0 ")?;
                Some(format!("intra-node {rest}"))
            })
            .unwrap_or_else(|| panic!("no selection line in the run's log:\n{err}"));
        assert_eq!(got, want, "{env:?}");
    }
}

/// `info` says what it could not write instead of panicking, and warns about misspelled
/// variables itself (the library's log is not set up in `info`).
#[test]
fn write_errors_and_unknown_variables_are_reported() {
    let full = std::fs::File::create("/dev/full").expect("/dev/full");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_courier"))
        .args(["info", "-c"])
        .stdout(full)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot write to standard output") && !err.contains("panicked"),
        "{err}"
    );
    let o = courier(&["info", "-c"], &[("COURIER_RNDV_TRESH", "4k")]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("COURIER_RNDV_TRESH is not a Courier variable"),
        "{err}"
    );
    // Values stay on their line.
    let out = info(&["-c"], &[("COURIER_TLS", " tcp ")]);
    assert!(out.lines().any(|l| l == "COURIER_TLS=tcp"), "{out}");
}

/// `-D` keeps transports of one device type (ucx_info's option); options that only
/// modify `-c` or `-e` are refused without them.
#[test]
fn device_types_and_options_that_need_another() {
    let out = info(&["-d", "-D", "net"], &[]);
    for t in ["self", "shm"] {
        let block: Vec<&str> = out
            .lines()
            .skip_while(|l| *l != format!("#      Transport: {t}"))
            .take(3)
            .collect();
        assert!(
            block
                .iter()
                .any(|l| l.contains("not usable: excluded by COURIER_TLS=all, -D net")),
            "{t}:\n{out}"
        );
    }
    let out = info(&["-e", "-P", "intra", "-D", "net"], &[]);
    assert_eq!(lane0(&out), "tcp", "{out}");
    let o = courier(&["info", "-e", "-D", "shm"], &[("COURIER_TLS", "tcp")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("-D shm"));
    for args in [
        &["info", "-a"][..],
        &["info", "-C"],
        &["info", "-u", "t"],
        &["info", "-P", "self"],
        &["info", "-t", "tcp"],
    ] {
        let o = courier(args, &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("required arguments"),
            "{args:?}"
        );
    }
}

/// The lines `NAME=value` of `-c` (commented out or not): name → (value, commented).
fn config_lines(out: &str) -> Vec<(String, String, bool)> {
    out.lines()
        .filter_map(|l| {
            let (commented, l) = match l.strip_prefix("# ") {
                Some(rest) => (true, rest),
                None => (false, l),
            };
            let (k, v) = l.split_once('=')?;
            k.starts_with("COURIER_")
                .then(|| (k.to_string(), v.to_string(), commented))
        })
        .collect()
}

/// As ucx_info: `-f` alone prints the decorated configuration, `-C` comments out the
/// variables not set in the environment, and a value the library rounds shows as it is
/// in force.
#[test]
fn f_alone_prints_the_configuration_and_c_comments_out_unset_variables() {
    let out = info(&["-f"], &[]);
    let lines = config_lines(&out);
    for v in courier::config::VARS {
        assert!(
            lines.iter().any(|(k, _, c)| k == v.name && !c),
            "{}:\n{out}",
            v.name
        );
        assert!(out.contains(&format!("# {}\n", v.help)), "{}", v.name);
    }
    assert!(out.contains("# default:   "), "{out}");

    let env = [("COURIER_TLS", "tcp"), ("COURIER_LOG_LEVEL", "warn")];
    for args in [&["-c", "-C"][..], &["-cC"], &["-fC"]] {
        let out = info(args, &env);
        let lines = config_lines(&out);
        assert_eq!(lines.len(), courier::config::VARS.len(), "{out}");
        for (k, v, commented) in &lines {
            let set = env.iter().find(|(n, _)| n == k);
            // Set (even to the default): in force, not commented; unset: the default.
            assert_eq!(*commented, set.is_none(), "{args:?} {k}:\n{out}");
            if let Some((_, val)) = set {
                assert_eq!(v, val, "{k}");
            }
        }
    }

    // TCP keepalive counts whole seconds: 500ms is 1s in force.
    let env = [("COURIER_KEEPALIVE_INTERVAL", "500ms")];
    let out = info(&["-c"], &env);
    assert!(
        out.lines().any(|l| l == "COURIER_KEEPALIVE_INTERVAL=1s"),
        "{out}"
    );
    let out = info(&["-f"], &env);
    assert!(out.contains("# in force:  1s (given: 500ms; "), "{out}");
    let out = info(
        &["-c"],
        &[
            ("COURIER_KEEPALIVE_INTERVAL", "2s"),
            ("COURIER_KEEPALIVE_TIMEOUT", "4s"),
        ],
    );
    assert!(
        out.lines().any(|l| l == "COURIER_KEEPALIVE_INTERVAL=2s"),
        "{out}"
    );
}

/// As ucx_info: `-e` shows a peer in the same process unless `-P` says otherwise, `-u`
/// needs a feature that makes lanes (e and w only modify them), and an option given twice
/// takes its last value (getopt's way) instead of failing.
#[test]
fn e_defaults_to_a_self_peer_and_options_repeat_as_in_getopt() {
    let out = info(&["-e", "-u", "t"], &[]);
    assert!(out.contains("(peer: self, features: t)"), "{out}");
    assert_eq!(lane0(&out), "self", "{out}");
    for u in ["e", "w", "ew"] {
        let o = courier(&["info", "-e", "-u", u], &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "-u {u}: {err}");
        assert!(err.contains("at least one of t tag"), "{err}");
    }
    let out = info(
        &["-e", "-u", "t", "-u", "m", "-P", "inter", "-P", "self"],
        &[],
    );
    assert!(out.contains("(peer: self, features: m)"), "{out}");
    let once = info(&["-c"], &[]);
    assert_eq!(info(&["-c", "-c"], &[]), once);
    assert_eq!(info(&["-cc"], &[]), once);
}

/// `-t NAME` keeps one transport in `-d` (ucx_info's option); tcp lists each interface once,
/// with all its addresses, and the short limit `-d` states is where `-e`'s eager short
/// range ends.
#[test]
fn d_t_keeps_one_transport_and_lists_each_device_once() {
    let out = info(&["-d", "-t", "tcp"], &[]);
    let blocks = transport_blocks(&out);
    assert!(!blocks.is_empty(), "{out}");
    let mut devices = Vec::new();
    for b in &blocks {
        assert_eq!(field(b, "Transport"), Some("tcp"), "{out}");
        let dev = field(b, "Device").unwrap_or("").to_string();
        assert!(!devices.contains(&dev), "{dev} twice:\n{out}");
        devices.push(dev);
    }
    assert!(
        !out.contains("Memory domain: memory") && !out.contains("cuda_copy"),
        "{out}"
    );
    let out = info(&["-d", "-t", "self"], &[]);
    let names: Vec<&str> = transport_blocks(&out)
        .iter()
        .filter_map(|b| field(b, "Transport"))
        .collect();
    assert_eq!(names, ["self"], "{out}");
    let o = courier(&["info", "-d", "-t", "ib"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("possible values"));

    // The loopback interface carries the IPv4 loopback address, which worker addresses use.
    let lo = blocks
        .iter()
        .find(|b| field(b, "Device") == Some("lo"))
        .unwrap_or_else(|| panic!("no lo:\n{out}"));
    let addrs = field(lo, "address").unwrap_or("");
    assert!(addrs.split(", ").any(|a| a == "127.0.0.1"), "{addrs}");

    let short: usize = field(lo, "max short")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no max short:\n{out}"));
    let e = info(
        &["-e", "-u", "tm", "-P", "intra"],
        &[("COURIER_TLS", "tcp")],
    );
    let lines: Vec<&str> = e.lines().collect();
    use courier::wire::Kind;
    for (op, hdr) in [
        ("tag_send", Kind::TagEager.header_len()),
        ("am_send", Kind::Am.header_len()),
    ] {
        let r = field(&lines, op).unwrap_or_else(|| panic!("no {op}:\n{e}"));
        let want = format!("0..<egr/short>..{}..", short + 1 - hdr);
        assert!(r.starts_with(&want), "{op}: {r}, want {want}");
    }
}

/// `-c` lists the authentication settings and says what is in force: no key, a key file,
/// a key file refused for its permissions (with what to do).
#[test]
fn c_shows_the_authentication_in_force() {
    use std::os::unix::fs::PermissionsExt;
    let out = info(&["-c"], &[]);
    assert!(out.contains("\nCOURIER_AUTH=auto\n"), "{out}");
    assert!(out.contains("\nCOURIER_AUTH_KEY_FILE=\n"), "{out}");
    assert!(
        out.contains("# authentication in force: auto, no key: only this host's peers"),
        "{out}"
    );
    let dir = std::env::temp_dir().join(format!("courier-info-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    let k = key.to_str().unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = info(&["-c"], &[("COURIER_AUTH_KEY_FILE", k)]);
    assert!(
        out.contains(&format!(
            "# authentication in force: auto: every peer proves it holds COURIER_AUTH_KEY_FILE={k}"
        )),
        "{out}"
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = info(&["-c"], &[("COURIER_AUTH_KEY_FILE", k)]);
    assert!(
        out.contains("# authentication in force: error:") && out.contains("chmod 600"),
        "{out}"
    );
    let out = info(&["-c"], &[("COURIER_AUTH", "off")]);
    assert!(out.contains("# authentication in force: off"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}
