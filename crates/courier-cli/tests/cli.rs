//! The `courier` binary, run as users run it. No assertion looks at timing values.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
mod common;
use common::{TCP, courier, json_of, numbers, text};

/// The header box of `ucx_perftest -l -t tag_lat -s 64` (UCX 1.13.1), byte for byte.
const UCX_BOX: &str = "\
+----------------------------------------------------------------------------------------------------------+
| API:          protocol layer                                                                             |
| Test:         tag match latency                                                                          |
| Data layout:  (automatic)                                                                                |
| Send memory:  host                                                                                       |
| Recv memory:  host                                                                                       |
| Message size: 64                                                                                         |
+--------------+--------------+------------------------------+---------------------+-----------------------+
|              |              |        latency (usec)        |   bandwidth (MB/s)  |  message rate (msg/s) |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
";

#[test]
fn loopback_tag_lat_prints_the_ucx_perftest_table() {
    let o = courier(
        &[
            "perf", "-l", "-t", "tag_lat", "-s", "64", "-n", "2000", "-w", "100",
        ],
        TCP,
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "stdout:\n{out}\nstderr:\n{err}");
    let lines: Vec<&str> = out.lines().collect();
    // The whole box, as ucx_perftest prints it (the rule under the message size spans the
    // column groups).
    assert!(
        out.starts_with(UCX_BOX),
        "expected the box:\n{UCX_BOX}\ngot:\n{out}"
    );
    let fin = lines
        .iter()
        .find(|l| l.starts_with("Final:"))
        .unwrap_or_else(|| panic!("no Final row:\n{out}"));
    let n = numbers(fin);
    assert_eq!(n.len(), 8, "{fin}");
    assert_eq!(n[0], 2000.0);
    // Between the column header and `Final:` only `[thread 0]` rows may appear (a run this
    // short usually has none; cli_local.rs checks a run over a second prints them).
    let stage = lines
        .iter()
        .position(|l| l.starts_with("|    Stage "))
        .unwrap_or_else(|| panic!("{out}"));
    for l in &lines[stage + 2..lines.len() - 1] {
        assert!(l.starts_with("[thread 0]"), "{l}\n{out}");
        assert_eq!(numbers(l).len(), 8, "{l}");
    }
    assert!(lines[lines.len() - 1].starts_with("Final:"), "{out}");
}

#[test]
fn final_only_csv_and_json_shapes() {
    let o = courier(
        &[
            "perf", "-l", "-t", "tag_bw", "-n", "2000", "-w", "100", "-f",
        ],
        TCP,
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    let last = out.lines().last().unwrap();
    assert!(!last.contains("Final:"));
    assert_eq!(numbers(last).len(), 8, "{out}");
    assert!(out.starts_with("+---") && out.contains("| Test:         tag match bandwidth"));
    // As ucx_perftest -f: the column headers, the first column named "Test".
    assert!(out.contains("|     Test     | # iterations |"), "{out}");
    assert!(!out.contains("Stage"), "{out}");

    let o = courier(
        &[
            "perf",
            "-l",
            "-t",
            "ucp_am_lat",
            "-n",
            "1000",
            "-w",
            "10",
            "-v",
        ],
        TCP,
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    let mut lines = out.lines();
    assert_eq!(
        lines.next().unwrap(),
        "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr"
    );
    let last = out.lines().last().unwrap();
    assert_eq!(
        last.split(',').filter(|f| f.parse::<f64>().is_ok()).count(),
        8,
        "{out}"
    );

    let o = courier(
        &[
            "perf",
            "-l",
            "-t",
            "stream_lat",
            "-s",
            "1k",
            "-n",
            "1000",
            "-w",
            "10",
            "--json",
            "--check",
        ],
        TCP,
    );
    let v = json_of(&o, "run");
    assert_eq!(v["test"], "stream_lat");
    assert_eq!(v["message_size"], 1024);
    assert_eq!(v["iterations"], 1000);
    assert_eq!(v["transport"], "tcp");
    assert!(v["latency_avg_us"].as_f64().is_some());
}

#[test]
fn every_test_runs_with_iov_and_check() {
    for (t, s) in [
        ("tag_sync_lat", "8"),
        ("tag_sync_bw", "100k"),
        ("ucp_am_bw", "4k,100"),
        ("stream_bw", "64k"),
        ("tag_lat", "64,64"),
        ("ucp_am_lat", "100k"),
    ] {
        let o = courier(
            &[
                "perf", "-l", "-t", t, "-s", s, "-n", "200", "-w", "10", "-f", "--check",
            ],
            TCP,
        );
        let (out, err) = text(&o);
        assert!(o.status.success(), "{t} {s}: {out}{err}");
        assert_eq!(numbers(out.lines().last().unwrap()).len(), 8, "{t}: {out}");
    }
}

/// Rendezvous active-message tests as the benchmarks run them, without `--check`, on the
/// default transport and over tcp: every message is counted, and the runs end with the
/// table's row.
#[test]
fn rendezvous_active_message_tests_run_without_check() {
    for env in [&[][..], TCP] {
        for (t, s) in [("ucp_am_bw", "300k"), ("ucp_am_lat", "100k")] {
            let o = courier(
                &[
                    "perf", "-l", "-t", t, "-s", s, "-n", "300", "-w", "10", "--json",
                ],
                env,
            );
            let v = json_of(&o, t);
            assert_eq!(v["test"], t, "{env:?}");
            assert_eq!(v["iterations"], 300, "{env:?} {v}");
            assert!(
                v["bandwidth_avg_mbs"].as_f64().is_some_and(|b| b > 0.0),
                "{env:?} {v}"
            );
        }
    }
}

#[test]
fn bad_options_are_clear_errors() {
    let cases: &[(&[&str], &str)] = &[
        (&["-m", "cuda"], "CUDA"),
        (&["-m", "host,floppy"], "unknown memory type"),
        (&["-t", "ucp_fadd", "-s", "16"], "takes 4 or 8"),
        (&["-t", "ucp_put_bw", "-s", "8,8"], "one message size"),
        (&["-T", "0"], "-T 0"),
        (&["-T", "4", "-M", "single"], "-M multi"),
        (&["-M", "many"], "expected single, serialized or multi"),
        (&["-s", "8,x"], "bad size"),
        (&["-t", "nope"], "unknown test"),
        (&["-c", "z"], "CPU list"),
        // A well-formed list naming a CPU no CPU set can hold.
        (&["-c", "0,1024"], "CPU 1024 is beyond"),
        (&["-c", "3-1"], "ends before it starts"),
    ];
    for (extra, want) in cases {
        let mut args = vec!["perf", "-l", "-n", "10"];
        args.extend_from_slice(extra);
        if !extra.contains(&"-t") {
            args.extend_from_slice(&["-t", "tag_lat"]);
        }
        let o = courier(&args, TCP);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
    }
}

/// Values that overflow the totals, or that conflict with others, are usage errors naming
/// the options (none is ignored, none runs).
#[test]
fn overflowing_and_conflicting_options_are_usage_errors() {
    let cases: &[(&[&str], &[&str])] = &[
        // A stream has no empty messages (the receiver would wait for ever).
        (
            &["-l", "-t", "stream_lat", "-s", "0"],
            &["-s 0", "stream tests need at least 1 byte"],
        ),
        (
            &["-l", "-t", "stream_bw", "-s", "0"],
            &["stream tests need at least 1 byte"],
        ),
        // The IOV's sum overflows.
        (
            &[
                "-l",
                "-t",
                "tag_bw",
                "-s",
                "9223372036854775808,9223372036854775808",
            ],
            &["-s 9223372036854775808,9223372036854775808", "message size"],
        ),
        // Message size × window overflows.
        (
            &[
                "-l",
                "-t",
                "tag_bw",
                "-s",
                "16",
                "-O",
                "1152921504606846976",
            ],
            &["-s 16 -O 1152921504606846976", "window"],
        ),
        (
            &[
                "-l",
                "-t",
                "tag_bw",
                "-s",
                "4k",
                "-O",
                "4503599627370496",
                "--check",
            ],
            &["-O 4503599627370496", "window"],
        ),
        (
            &[
                "-l",
                "-t",
                "ucp_get",
                "-s",
                "16",
                "-O",
                "1152921504606846976",
            ],
            &["-O 1152921504606846976"],
        ),
        // Iterations plus warm-up overflow.
        (
            &[
                "-l",
                "-t",
                "tag_lat",
                "-n",
                "18446744073709551615",
                "-w",
                "1",
            ],
            &["-n 18446744073709551615 -w 1"],
        ),
        // Conflicts.
        (
            &["-l", "-t", "tag_lat", "-D", "contig", "-s", "8,8"],
            &["-D contig", "IOV"],
        ),
        (&["127.0.0.1", "-l", "-t", "tag_lat"], &["-l", "127.0.0.1"]),
        (
            &["--local", "--sweep", "--max-size", "0"],
            &["--max-size 0"],
        ),
        (&["-l", "-t", "tag_lat", "--pairs", "0"], &["--pairs 0"]),
        (
            &["-l", "-t", "tag_lat", "--json", "-v"],
            &["--json cannot be used with -v"],
        ),
        (
            &["-l", "-t", "tag_lat", "--json", "-f"],
            &["--json cannot be used with -f"],
        ),
    ];
    for (extra, wants) in cases {
        let mut args = vec!["perf"];
        args.extend_from_slice(extra);
        if !extra.contains(&"-n") && !extra.contains(&"--sweep") {
            args.extend_from_slice(&["-n", "10", "-w", "0"]);
        }
        let o = courier(&args, TCP);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {out}{err}");
        for w in *wants {
            assert!(err.contains(w), "{extra:?}: wants {w:?}: {err}");
        }
        assert!(!err.contains("panicked"), "{extra:?}: {err}");
    }
    // -D iov with an IOV, and -D contig with one size, are what they say.
    for d in [
        &["-D", "iov", "-s", "8,8"][..],
        &["-D", "contig", "-s", "8"],
    ] {
        let mut args = vec!["perf", "-l", "-t", "tag_lat", "-n", "10", "-w", "0", "-f"];
        args.extend_from_slice(d);
        let o = courier(&args, TCP);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{d:?}: {out}{err}");
    }
}

/// A CPU this machine does not have (or does not allow here) is named with the ones it has.
#[test]
fn a_cpu_that_is_not_here_is_named_with_the_allowed_ones() {
    // One past the last CPU the machine could ever have.
    let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .expect("/sys/devices/system/cpu/possible");
    let missing = possible
        .trim()
        .split([',', '-'])
        .filter_map(|c| c.parse::<usize>().ok())
        .max()
        .map_or(0, |m| m + 1);
    if missing >= 1024 {
        return;
    }
    let c = missing.to_string();
    let o = courier(&["perf", "-l", "-t", "tag_lat", "-n", "10", "-c", &c], TCP);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "CPU {missing} does not exist or is not allowed here"
        )),
        "{err}"
    );
    assert!(err.contains("(allowed: "), "{err}");
    assert!(!err.contains("Invalid argument"), "{err}");
}

/// The default window (`-O`) is 32 for tag_bw, tag_sync_bw, ucp_put_bw, ucp_am_bw and
/// put_signal_bw, 1 for every other test, as in ucx_perftest and as --help says.
#[test]
fn the_default_window_is_ucx_perftests() {
    for (t, w) in [
        ("tag_bw", 32),
        ("tag_sync_bw", 32),
        ("ucp_am_bw", 32),
        ("ucp_put_bw", 32),
        ("put_signal_bw", 32),
        ("ucp_add", 1),
        ("ucp_get", 1),
        ("ucp_fadd", 1),
        ("tag_lat", 1),
        ("stream_bw", 1),
    ] {
        let o = courier(
            &["perf", "-l", "-t", t, "-n", "100", "-w", "0", "--json"],
            TCP,
        );
        let v = json_of(&o, t);
        assert_eq!(v["window"], w, "{t}: {v}");
    }
    let o = courier(&["perf", "--help"], &[]);
    let (out, _) = text(&o);
    let help = out.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains(
            "default 32 for tag_bw, tag_sync_bw, ucp_am_bw, ucp_put_bw, put_signal_bw; 64 for tag_bibw, tag_win_bw; 1 otherwise"
        ),
        "{out}"
    );
}

#[test]
fn client_without_server_fails_fast() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t = Instant::now();
    let o = courier(
        &[
            "perf",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-t",
            "tag_lat",
        ],
        TCP,
    );
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("cannot connect to 127.0.0.1"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(15));
}

#[test]
fn killed_server_ends_the_client_with_an_error() {
    let mut srv = Command::new(env!("CARGO_BIN_EXE_courier"))
        .args(["perf", "-p", "0", "--announce"])
        .env("COURIER_TLS", "tcp")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(srv.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let port = line.trim().strip_prefix("PORT ").unwrap().to_string();
    let client = Command::new(env!("CARGO_BIN_EXE_courier"))
        .args([
            "perf",
            "127.0.0.1",
            "-p",
            &port,
            "-t",
            "tag_lat",
            "-n",
            "1000000000",
            "-f",
        ])
        .env("COURIER_TLS", "tcp")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    srv.kill().unwrap();
    let _ = srv.wait();
    let t = Instant::now();
    let o = client.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(t.elapsed() < Duration::from_secs(40));
}

#[test]
fn info_lists_config_and_rejects_bad_values() {
    let o = courier(&["info", "-c"], &[]);
    let (out, _) = text(&o);
    assert!(o.status.success());
    for v in courier::config::VARS {
        assert!(
            out.lines().any(|l| l.starts_with(&format!("{}=", v.name))),
            "{} missing:\n{out}",
            v.name
        );
    }
    let o = courier(&["info", "-c", "-a"], &[]);
    assert!(text(&o).0.contains("# default:"));
    for args in [
        &["info", "-c"][..],
        &["info"][..],
        &["perf", "-l", "-t", "tag_lat", "-n", "10"][..],
    ] {
        let o = courier(args, &[("COURIER_TLS", "tcp,ib")]);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("COURIER_TLS"), "{err}");
    }
    let o = courier(&["info", "-v"], &[]);
    assert!(text(&o).0.contains("version="));
    let o = courier(&["info", "-e", "-u", "tms", "-P", "inter"], TCP);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("tag_send: 0..<egr/short>..") && out.contains("<rndv>..(inf)"),
        "{out}"
    );
    let o = courier(&["info", "-d"], TCP);
    let (out, _) = text(&o);
    assert!(
        out.contains("Transport: tcp") && out.contains("excluded by COURIER_TLS=tcp"),
        "{out}"
    );
}

#[test]
fn sweep_local_prints_osu_columns() {
    let o = courier(
        &[
            "perf",
            "--local",
            "--sweep",
            "--max-size",
            "4",
            "--pairs",
            "1",
            "--quick",
        ],
        TCP,
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(
        out.contains("# Size") && out.contains("Latency (us)") && out.contains("Bandwidth (MB/s)"),
        "{out}"
    );
    assert!(out.contains("Messages/s"), "{out}");
    let rows = out
        .lines()
        .filter(|l| numbers(l).len() >= 2 && !l.starts_with('#'))
        .count();
    assert_eq!(rows, 3 * 3 + 3, "{out}");
}

const ONE_SIDED: [&str; 10] = [
    "ucp_put_lat",
    "ucp_put_bw",
    "ucp_get",
    "ucp_add",
    "ucp_fadd",
    "ucp_swap",
    "ucp_cswap",
    "put_signal_lat",
    "put_signal_bw",
    "put_flush_signal_lat",
];

#[test]
fn one_sided_tests_run_over_tcp() {
    for t in ONE_SIDED {
        let o = courier(
            &["perf", "-l", "-t", t, "-n", "300", "-w", "20", "--check"],
            TCP,
        );
        let (out, err) = text(&o);
        assert!(o.status.success(), "{t}: {out}{err}");
        assert!(out.contains("| Send memory:  host "), "{t}: {out}");
        assert!(out.contains("| Recv memory:  host "), "{t}: {out}");
        let fin = out
            .lines()
            .find(|l| l.starts_with("Final:"))
            .unwrap_or_else(|| panic!("{t}: no Final row:\n{out}"));
        let n = numbers(fin);
        assert_eq!(n.len(), 8, "{t}: {fin}");
        assert_eq!(n[0], 300.0, "{t}: {fin}");
    }
    // 32-bit atomics and a window on fetching atomics and gets.
    for args in [
        &["-t", "ucp_fadd", "-s", "4", "-O", "8"][..],
        &["-t", "ucp_cswap", "-s", "4"][..],
        &["-t", "ucp_get", "-s", "64k", "-O", "4"][..],
        &["-t", "ucp_put_lat", "-s", "3"][..],
    ] {
        let mut a = vec!["perf", "-l", "-n", "300", "-w", "20", "-f", "--check"];
        a.extend_from_slice(args);
        let o = courier(&a, TCP);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{args:?}: {out}{err}");
        assert_eq!(numbers(out.lines().last().unwrap()).len(), 8, "{out}");
    }
}

#[test]
fn put_signal_lat_runs_over_the_default_transport() {
    for t in ["put_signal_lat", "ucp_put_lat"] {
        let o = courier(
            &["perf", "-l", "-t", t, "-n", "500", "-w", "20", "--json"],
            &[],
        );
        let v = json_of(&o, t);
        assert_eq!(v["test"], t);
        assert_eq!(v["iterations"], 500);
        assert!(v["latency_avg_us"].as_f64().is_some(), "{v}");
    }
}

#[test]
fn memory_types_for_one_sided_tests() {
    let o = courier(
        &[
            "perf", "-l", "-t", "ucp_fadd", "-m", "nic,host", "-n", "300", "-w", "20", "-f",
        ],
        TCP,
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(
        out.contains("| Send memory:  nic (host fallback) "),
        "{out}"
    );
    assert!(out.contains("| Recv memory:  host "), "{out}");
    assert_eq!(numbers(out.lines().last().unwrap()).len(), 8, "{out}");

    let o = courier(
        &[
            "perf", "-l", "-t", "ucp_add", "-m", "host,nic", "-n", "300", "-w", "20", "-v",
        ],
        TCP,
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(out.starts_with("iterations,"), "{out}");

    for m in ["cuda", "host,cuda"] {
        let o = courier(
            &["perf", "-l", "-t", "ucp_put_lat", "-m", m, "-n", "10"],
            TCP,
        );
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "-m {m}: {err}");
        assert!(err.contains("CUDA"), "-m {m}: {err}");
    }
}

#[path = "../../courier/tests/mockcuda/mod.rs"]
mod mockcuda;

/// `-m cuda` against the stand-in CUDA driver (its device memory faults on any CPU
/// access), or with `COURIER_TEST_CUDA=real` on the machine's GPU: the two-sided tests and
/// `ucp_put_bw` / `ucp_get` run with device buffers and report them; the tests that need
/// the CPU on the buffers are refused with the reason.
#[test]
fn perf_with_device_memory() {
    let lib = if std::env::var("COURIER_TEST_CUDA").is_ok_and(|v| v == "real") {
        "libcuda.so.1".to_string()
    } else {
        let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mockcuda");
        mockcuda::build(&dir)
    };
    for tls in ["tcp", "all"] {
        let env = [("COURIER_TLS", tls), ("COURIER_CUDA_LIB", lib.as_str())];
        for (t, m, s) in [
            ("tag_bw", "cuda,cuda", "1048576"),
            ("tag_lat", "cuda,host", "100"),
            ("ucp_am_bw", "host,cuda", "300000"),
            ("stream_bw", "cuda,cuda", "70000"),
            ("ucp_put_bw", "cuda,cuda", "65536"),
            ("ucp_get", "host,cuda", "200000"),
        ] {
            let o = courier(
                &[
                    "perf", "-l", "-t", t, "-m", m, "-s", s, "-n", "40", "-w", "4",
                ],
                &env,
            );
            let (out, err) = text(&o);
            assert!(o.status.success(), "{tls} {t} -m {m}:\n{out}\n{err}");
            let (send, recv) = m.split_once(',').unwrap();
            assert!(
                out.contains(&format!("| Send memory:  {send}")),
                "{t}: {out}"
            );
            assert!(
                out.contains(&format!("| Recv memory:  {recv}")),
                "{t}: {out}"
            );
            let fin = out
                .lines()
                .find(|l| l.starts_with("Final:"))
                .unwrap_or_else(|| panic!("{out}"));
            assert_eq!(numbers(fin)[0], 40.0, "{fin}");
        }
        for args in [
            &["-t", "ucp_put_lat", "-m", "cuda"][..],
            &["-t", "ucp_fadd", "-m", "host,cuda"],
            &["-t", "tag_bw", "-m", "cuda", "--check"],
        ] {
            let mut a = vec!["perf", "-l", "-n", "10"];
            a.extend_from_slice(args);
            let o = courier(&a, &env);
            let (_, err) = text(&o);
            assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
            assert!(err.contains("cuda"), "{args:?}: {err}");
        }
    }
}

/// A free TCP port on 127.0.0.1 (nothing listens on it once this returns).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Wait up to `limit` for `child` to end; kill it (a hang) if it does not.
fn wait_or_kill(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let end = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return st;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("courier (pid {}) still runs after {limit:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A server given a test it does not know says so and exits with a usage error, as
/// ucx_perftest's does, instead of waiting for a client; a known one is the client's to
/// drive, as before.
#[test]
fn a_server_refuses_an_unknown_test() {
    let port = free_port().to_string();
    let mut c = common::piped(&["perf", "-p", &port, "-t", "tag_lattt"], TCP)
        .spawn()
        .expect("spawn courier");
    let st = wait_or_kill(&mut c, Duration::from_secs(60));
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut c.stderr.take().expect("piped"), &mut err);
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(err.contains("unknown test \"tag_lattt\""), "{err}");
    assert!(err.contains("supported tests: tag_lat, tag_bw"), "{err}");
}

/// `courier perf --help` states each option's default once: an option whose text says its
/// default (`--pairs`, `-O`) shows no second one in clap's `[default: ...]`.
#[test]
fn help_states_each_default_once() {
    let o = courier(&["perf", "--help"], &[]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    // One entry per option: its first line starts with a dash, continuations do not.
    let mut entries: Vec<String> = Vec::new();
    for l in out.lines() {
        let t = l.trim_start();
        if t.starts_with('-') {
            entries.push(t.to_string());
        } else if let Some(e) = entries.last_mut() {
            e.push(' ');
            e.push_str(t);
        }
    }
    assert!(entries.len() > 20, "{out}");
    for e in &entries {
        let said = e.matches("[default:").count();
        let prose = e
            .split("[default:")
            .next()
            .unwrap_or("")
            .contains("default");
        assert!(said <= 1 && !(said == 1 && prose), "two defaults: {e}");
    }
    let pairs = entries
        .iter()
        .find(|e| e.starts_with("--pairs"))
        .expect("--pairs");
    assert!(pairs.contains("default: half the CPUs"), "{pairs}");
}

/// The README's benchmark block, as a user types it: every client has a server of its own
/// (a server answers one client, then exits), and each server/client pair runs (on a free
/// port instead of 13337, over tcp).
#[test]
fn the_readme_benchmark_block_gives_each_client_a_server() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md");
    let block: Vec<Vec<String>> = readme
        .split("## Benchmarks")
        .nth(1)
        .and_then(|s| s.split("```sh").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("a sh block under ## Benchmarks")
        .lines()
        .map(|l| l.split(" #").next().unwrap_or("").split_whitespace())
        .map(|w| w.map(str::to_string).collect::<Vec<_>>())
        .filter(|w| w.len() > 2 && w[0] == "courier" && w[1] == "perf")
        .collect();
    let port_of = |w: &[String]| {
        w.iter()
            .position(|x| x == "-p")
            .and_then(|i| w.get(i + 1).cloned())
    };
    let is_server = |w: &[String]| w.len() == 4 && w[2] == "-p";
    let is_client = |w: &[String]| !w[2].starts_with('-');
    // Sessions open per port: a server line opens one, its client takes it.
    let mut open: std::collections::HashMap<String, usize> = Default::default();
    let mut pairs: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    let mut waiting: Vec<Vec<String>> = Vec::new();
    for w in &block {
        let port = port_of(w).unwrap_or_else(|| "13337".to_string());
        if is_server(w) {
            *open.entry(port).or_default() += 1;
            waiting.push(w.clone());
        } else if is_client(w) {
            let n = open.entry(port.clone()).or_default();
            assert!(
                *n > 0,
                "{w:?}: no server left on port {port} (each answers one client)"
            );
            *n -= 1;
            let srv = waiting
                .iter()
                .position(|s| port_of(s).as_deref() == Some(port.as_str()))
                .map(|i| waiting.remove(i))
                .expect("its server");
            pairs.push((srv, w.clone()));
        }
    }
    assert!(pairs.len() >= 2, "{block:?}");
    assert!(
        open.values().all(|&n| n == 0),
        "servers with no client: {block:?}"
    );
    for (srv, cli) in pairs {
        let port = free_port().to_string();
        let on = |w: &[String]| -> Vec<String> {
            let mut w = w[1..].to_vec();
            if let Some(i) = w.iter().position(|x| x == "-p") {
                w[i + 1] = port.clone();
            }
            w
        };
        let srv_args = on(&srv);
        let mut s = common::piped(
            &srv_args.iter().map(String::as_str).collect::<Vec<_>>(),
            TCP,
        )
        .spawn()
        .expect("spawn the server");
        let mut lines =
            std::io::BufRead::lines(std::io::BufReader::new(s.stdout.take().expect("piped")));
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        assert_eq!(first, "Waiting for connection...", "{srv:?}");
        let drain = std::thread::spawn(move || lines.map_while(Result::ok).count());
        let cli_args = on(&cli);
        let o = courier(
            &cli_args.iter().map(String::as_str).collect::<Vec<_>>(),
            TCP,
        );
        let (out, err) = text(&o);
        assert!(o.status.success(), "{cli:?}: {out}{err}");
        assert!(out.contains("Final:"), "{cli:?}: {out}");
        let st = wait_or_kill(&mut s, Duration::from_secs(60));
        assert!(st.success(), "{srv:?} after {cli:?}");
        let _ = drain.join();
    }
}
