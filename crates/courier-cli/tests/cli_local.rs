//! `courier perf` run as users run it: `--local` and its options, the loopback table's
//! once-a-second rows, and the header details shared with ucx_perftest. No assertion looks
//! at a timing value; timings only choose how long a run must be.

mod common;
use common::{TCP, allowed_cpus, courier, fields as numbers, json_of, text};

/// Seconds the measured part of a `tag_lat` run took, from its final row (iterations and
/// overall one-way latency, in the table and in CSV alike).
fn measured_secs(final_row: &str) -> f64 {
    let n = numbers(final_row);
    assert_eq!(n.len(), 8, "not a result row: {final_row}");
    n[0] * n[3] * 2.0 / 1e6
}

/// `courier perf -l -t tag_lat` over TCP with `extra` options, measuring for more than
/// 1.1 s. The iteration count comes from a short probe run on the same loopback path; a
/// run that still turns out shorter (the machine was busier while probing) is repeated
/// with more iterations. Returns stdout.
fn loopback_run_over_a_second(extra: &[&str]) -> String {
    let o = courier(
        &[
            "perf", "-l", "-t", "tag_lat", "-n", "2000", "-w", "200", "--json",
        ],
        TCP,
    );
    let v = json_of(&o, "probe");
    let per_iter = v["latency_overall_us"].as_f64().expect("latency") * 2.0 / 1e6;
    let mut iters = (1.6 / per_iter.max(1e-7))
        .ceil()
        .clamp(1000.0, 100_000_000.0);
    for _ in 0..4 {
        let n = format!("{}", iters as u64);
        let mut args = vec!["perf", "-l", "-t", "tag_lat", "-n", &n, "-w", "200"];
        args.extend_from_slice(extra);
        let o = courier(&args, TCP);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{args:?}: {out}{err}");
        let last = out.lines().last().unwrap_or_default();
        let secs = measured_secs(last.trim_start_matches("Final:"));
        if secs > 1.1 {
            return out;
        }
        iters = (iters * 1.6 / secs.max(0.05)).min(1e9);
    }
    panic!("could not make a loopback run last over 1.1 s");
}

/// ucx_perftest prints a `[thread 0]` row about once a second before `Final:`.
#[test]
fn a_run_over_a_second_prints_progress_rows_before_final() {
    let out = loopback_run_over_a_second(&[]);
    let lines: Vec<&str> = out.lines().collect();
    let head = lines
        .iter()
        .position(|l| l.starts_with("|    Stage     | # iterations |"))
        .unwrap_or_else(|| panic!("no column header:\n{out}"));
    let body = &lines[head + 2..];
    let (fin, progress) = body.split_last().expect("rows");
    assert!(fin.starts_with("Final:"), "{out}");
    assert!(
        !progress.is_empty(),
        "no [thread 0] row in a run over 1 s:\n{out}"
    );
    let mut last = 0.0;
    for l in progress {
        assert!(l.starts_with("[thread 0]"), "{l}\n{out}");
        let n = numbers(l);
        assert_eq!(n.len(), 8, "{l}");
        assert!(n[0] > last, "iterations do not grow: {out}");
        last = n[0];
    }
    assert!(numbers(fin)[0] > last, "{out}");
}

/// `-f -v`: the CSV column names and the final row only, however long the run.
#[test]
fn final_only_csv_prints_only_the_final_row() {
    let out = loopback_run_over_a_second(&["-f", "-v"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(
        lines[0],
        "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr"
    );
    assert_eq!(
        lines[1]
            .split(',')
            .filter(|f| f.parse::<f64>().is_ok())
            .count(),
        8,
        "{out}"
    );
}

/// An IOV message: the header shows the whole message's size, the layout as ucx_perftest
/// shows it for protocol-layer tests, and no window row.
#[test]
fn iov_header_shows_the_total_message_size() {
    for (t, extra) in [("tag_bw", &["-O", "8"][..]), ("tag_lat", &["-f"][..])] {
        let mut args = vec![
            "perf", "-l", "-t", t, "-s", "64,64", "-n", "200", "-w", "10",
        ];
        args.extend_from_slice(extra);
        let o = courier(&args, TCP);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{t}: {out}{err}");
        assert!(out.contains("| Message size: 128 "), "{t}: {out}");
        assert!(out.contains("| Data layout:  (automatic) "), "{t}: {out}");
        assert!(!out.contains("Window"), "{t}: {out}");
        assert!(!out.contains("64,64"), "{t}: {out}");
    }
    let o = courier(
        &[
            "perf", "-l", "-t", "ucp_fadd", "-n", "100", "-w", "10", "-f",
        ],
        TCP,
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(
        out.contains("| Test:         atomic fetch-and-add latency / bandwidth / rate "),
        "{out}"
    );
}

/// `courier perf --local -n N -t LIST`: the rows `-t` picks (the suite's 1 MiB latency row
/// included), with N iterations each, on both transports, each printed once, then one line
/// saying how many passed (`make run` runs the whole suite so).
#[test]
fn local_suite_honours_n_and_t_and_prints_each_row_once() {
    let o = courier(
        &["perf", "--local", "-n", "400", "-t", "ucp_fadd,tag_lat"],
        &[],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0], "courier perf --local: 3 tests per transport, server and client in two processes",
        "{out}"
    );
    assert!(lines[1].contains("latency is one-way for *_lat"), "{out}");
    let shm_skipped = out.contains("shm  skipped:");
    let want = [
        ("tag_lat", "8 B"),
        ("tag_lat", "1 MiB"),
        ("ucp_fadd", "8 B"),
    ];
    // One line per row, in suite order, with -n's count, and nothing printed twice.
    let rows: Vec<&&str> = lines.iter().filter(|l| l.contains(" iters ")).collect();
    let ran = if shm_skipped { 3 } else { 6 };
    assert_eq!(rows.len(), ran, "{out}");
    let tls = if shm_skipped {
        ["tcp"; 2]
    } else {
        ["shm", "tcp"]
    };
    for (i, (l, (t, size))) in rows.iter().zip(want.iter().cycle()).enumerate() {
        let w: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(w[0], tls[i / 3], "{l}");
        assert_eq!(w[1], *t, "{l}");
        assert_eq!(format!("{} {}", w[2], w[3]), *size, "{l}");
        assert_eq!(w[4], "400", "{l}");
        let same = lines
            .iter()
            .filter(|x| x.split_whitespace().take(4).eq(w[..4].iter().copied()))
            .count();
        assert_eq!(same, 1, "{l} printed {same} times:\n{out}");
    }
    assert!(!out.contains("tag_bw") && !out.contains("ucp_put"), "{out}");
    let summary = if shm_skipped {
        "3 of 3 tests passed (3 skipped: a transport this machine lacks)"
    } else {
        "6 of 6 tests passed"
    };
    assert_eq!(lines.last().copied(), Some(summary), "{out}");
}

/// `--local --json`: one JSON object per row, each saying where its client and server ran
/// (`-c`, `-M`) as they found it themselves, then the summary; nothing else on stdout.
#[test]
fn local_suite_json_rows_honour_c_m_r_and_check() {
    let cpus = allowed_cpus();
    let (c0, c1) = (cpus[0], *cpus.get(1).unwrap_or(&cpus[0]));
    let list = format!("{c0},{c1}");
    let o = courier(
        &[
            "perf",
            "--local",
            "--json",
            "-n",
            "500",
            "-w",
            "20",
            "-t",
            "ucp_am_lat,ucp_fadd",
            "-c",
            &list,
            "-M",
            "multi",
            "-R",
            "99",
            "--check",
        ],
        &[],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    let objs: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}\n{out}")))
        .collect();
    let (summary, rows) = objs.split_last().expect("objects");
    assert_eq!(rows.len(), 4, "{out}");
    let mut passed = 0;
    for (i, v) in rows.iter().enumerate() {
        let tls = if i < 2 { "shm" } else { "tcp" };
        assert_eq!(v["tls"], tls, "{v}");
        assert_eq!(v["test"], ["ucp_am_lat", "ucp_fadd"][i % 2], "{v}");
        assert_eq!(v["message_size"], 8, "{v}");
        if v.get("error").is_some() {
            assert!(tls == "shm" && err.contains("shm  skipped:"), "{v}\n{err}");
            continue;
        }
        passed += 1;
        assert_eq!(v["transport"], tls, "{v}");
        assert_eq!(v["iterations"], 500, "{v}");
        assert_eq!(v["percentile"], 99.0, "{v}");
        assert!(v["latency_percentile_us"].as_f64().is_some(), "{v}");
        assert_eq!(v["check"], true, "{v}");
        for side in ["client", "server"] {
            assert_eq!(v[side]["thread_mode"], "multi", "{side}: {v}");
        }
        assert_eq!(v["client"]["cpus"], serde_json::json!([c0]), "{v}");
        assert_eq!(v["server"]["cpus"], serde_json::json!([c1]), "{v}");
        assert_ne!(v["client"]["pid"], v["server"]["pid"], "{v}");
    }
    let s = &summary["summary"];
    assert_eq!(s["tests_per_transport"], 2, "{summary}");
    assert_eq!(s["passed"], passed, "{summary}");
    assert_eq!(s["failed"], 4 - passed, "{summary}");
    let srows = s["rows"].as_array().expect("rows");
    assert_eq!(srows.len(), 4, "{summary}");
    for (r, v) in srows.iter().zip(rows) {
        assert_eq!(r["test"], v["test"]);
        assert_eq!(r["tls"], v["tls"]);
        assert_eq!(r["iterations"], 500);
    }
}

/// `-c` with one CPU: the client is pinned there, the server (a thread with `-l`, a
/// process with `--local`) to the next CPU, never to the same one; a note says so.
#[test]
fn one_cpu_pins_client_and_server_apart() {
    let cpus = allowed_cpus();
    let c0 = cpus[0].to_string();
    for mode in [&["-l", "-t", "tag_lat"][..], &["--local", "-t", "ucp_fadd"]] {
        let mut args = vec!["perf", "-n", "200", "-w", "10", "--json", "-c", &c0];
        args.extend_from_slice(mode);
        let o = courier(&args, TCP);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{mode:?}: {out}{err}");
        assert!(
            err.contains(&format!("note: -c {c0} names one CPU")),
            "{mode:?}: {err}"
        );
        let rows: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .filter(|v: &serde_json::Value| v.get("server").is_some())
            .collect();
        assert!(!rows.is_empty(), "{mode:?}: {out}");
        for v in rows {
            assert_eq!(v["client"]["cpus"], serde_json::json!([cpus[0]]), "{v}");
            assert_eq!(v["client"]["thread_mode"], "single", "{v}");
            assert_eq!(v["server"]["thread_mode"], "single", "{v}");
            let server = v["server"]["cpus"].as_array().expect("cpus").clone();
            if cpus.len() > 1 {
                assert_eq!(server, [serde_json::json!(cpus[1])], "{v}");
            } else {
                assert_eq!(server, [serde_json::json!(cpus[0])], "{v}");
            }
        }
    }
}

/// Options `--local` cannot honour are usage errors, before anything starts.
#[test]
fn local_refuses_options_it_cannot_honour() {
    for (extra, want) in [
        (&["-s", "1k"][..], "-s cannot be used with --local"),
        (&["127.0.0.1"], "HOST cannot be used with --local"),
        (&["-f"], "-f cannot be used with --local"),
        (&["-O", "2"], "-O cannot be used with --local"),
        (&["-t", "ucp_get"], "-t ucp_get: not in the --local suite"),
        (&["-M", "many"], "expected single, serialized or multi"),
        (&["--sweep", "-n", "10"], "-n cannot be used with --sweep"),
    ] {
        let mut args = vec!["perf", "--local"];
        args.extend_from_slice(extra);
        let o = courier(&args, &[]);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {out}{err}");
        assert!(err.contains(want), "{extra:?}: {err}");
        assert!(out.is_empty(), "{extra:?}: {out}");
    }
}

/// `--sweep`: every section, the multi-pair one included (it stopped at 4 MiB), goes up
/// to `--max-size`, and the bandwidth sections say which window each size used.
#[test]
fn sweep_reaches_max_size_and_names_its_windows() {
    let o = courier(
        &[
            "perf",
            "--local",
            "--sweep",
            "--max-size",
            "8m",
            "--pairs",
            "1",
            "--quick",
        ],
        &[],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    let windows = "window size: 64 (1 B .. 1 MiB), 32 (2 MiB), 16 (4 MiB), 8 (8 MiB) ]";
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with("# [") && l.ends_with(windows))
            .count(),
        3,
        "{out}"
    );
    assert!(
        out.contains(&format!("# [ pairs: 1 ] [ {windows}")),
        "{out}"
    );
    let sections: Vec<&str> = out.split("# OSU-style ").skip(1).collect();
    assert_eq!(sections.len(), 4, "{out}");
    for s in sections {
        let sizes: Vec<f64> = s
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .skip(1)
            .map(|l| numbers(l)[0])
            .collect();
        assert_eq!(sizes.len(), 24, "{s}");
        assert_eq!(sizes.last(), Some(&8388608.0), "{s}");
    }
}
