//! `courier perf` where a user or a script written for ucx_perftest 1.13.1 would notice a
//! difference: the shape of `-f` output, what the server prints, options given twice and
//! odd values. No assertion looks at timing values.

use std::io::{BufRead, BufReader};
use std::process::Child;
use std::sync::mpsc;
use std::time::Duration;
mod common;
use common::{TCP, courier, json_of, numbers, piped, text};

/// The rule that closes the server's box (and opens ucx_perftest's).
fn box_rule() -> String {
    format!("+{}+", "-".repeat(106))
}

/// `-f` prints the box, then the table's column headers (first column "Test", the first
/// group "latency" or "overhead" per the test), then one unlabelled row whose numbers sit
/// in the table's columns: the iterations end where "# iterations" ends (column 28).
#[test]
fn final_only_keeps_the_column_headers_and_positions() {
    for (t, group, am) in [
        ("tag_lat", "latency", false),
        ("tag_bw", "overhead", false),
        ("ucp_am_lat", "latency", true),
        ("ucp_put_bw", "overhead", false),
    ] {
        let o = courier(
            &["perf", "-l", "-t", t, "-n", "1000", "-w", "10", "-f"],
            TCP,
        );
        let (out, err) = text(&o);
        assert!(o.status.success(), "{t}: {out}{err}");
        let lines: Vec<&str> = out.lines().collect();
        // 7 box rows (8 with the AM header size), 5 of column headers, 1 row.
        assert_eq!(lines.len(), if am { 14 } else { 13 }, "{t}: {out}");
        assert!(
            lines[..lines.len() - 1].iter().all(|l| l.len() == 108),
            "{out}"
        );
        assert_eq!(out.contains("| AM header size: 0 "), am, "{t}: {out}");
        let head = lines.len() - 6;
        assert!(
            lines[head + 1].contains(&format!("|       {group:>8} (usec)        |")),
            "{t}: {out}"
        );
        assert!(
            lines[head + 3].starts_with("|     Test     | # iterations |"),
            "{t}: {out}"
        );
        let row = lines[lines.len() - 1];
        assert_eq!(numbers(row).len(), 8, "{t}: {row}");
        assert_eq!(
            row.get(..28).map(str::trim_start),
            Some("1000"),
            "{t}: {row}"
        );
        assert!(row[28..].starts_with(' '), "{t}: {row}");
    }
}

/// Lines of a child's stdout, read as they come.
fn stdout_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let out = child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines() {
            let Ok(l) = l else { break };
            let _ = tx.send(l);
        }
    });
    rx
}

/// A server prints on stdout what ucx_perftest's does: "Waiting for connection...", then
/// "Accepted connection from ADDR" and the box of the client's test, closed by a rule; it
/// ends with the client's session.
#[test]
fn a_server_prints_what_ucx_perftests_server_prints() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
        .to_string();
    let mut server = piped(&["perf", "-p", &port], TCP)
        .spawn()
        .expect("start the server");
    let lines = stdout_lines(&mut server);
    let first = lines.recv_timeout(Duration::from_secs(30));
    assert_eq!(first.as_deref(), Ok("Waiting for connection..."));
    let o = courier(
        &[
            "perf",
            "127.0.0.1",
            "-p",
            &port,
            "-t",
            "ucp_am_bw",
            "-s",
            "16,48",
            "-n",
            "1000",
            "-w",
            "10",
            "-f",
        ],
        TCP,
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    // The server ends with the session; one still running after 30 s is killed and fails.
    let until = std::time::Instant::now() + Duration::from_secs(30);
    let st = loop {
        match server.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if std::time::Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => {
                let _ = server.kill();
                panic!("the server did not end with the client's session");
            }
        }
    };
    // Every line, up to the end of its stdout.
    let said: Vec<String> = lines.iter().collect();
    assert!(st.success(), "{st}: {said:?}");
    assert!(
        said.first()
            .is_some_and(|l| l.starts_with("Accepted connection from 127.0.0.1:")),
        "{said:?}"
    );
    let rest = &said[1..];
    let rule = box_rule();
    assert_eq!(rest.len(), 9, "{said:?}");
    assert_eq!(rest[0], rule);
    assert!(rest[2].starts_with("| Test:         am bandwidth / message rate "));
    assert!(rest[6].starts_with("| Message size: 64 "), "{said:?}");
    assert!(rest[7].starts_with("| AM header size: 0 "), "{said:?}");
    assert_eq!(rest[8], rule);
    assert!(rest.iter().all(|l| l.len() == 108), "{said:?}");
}

/// As with ucx_perftest (getopt), an option given twice takes its last value.
#[test]
fn an_option_given_twice_takes_its_last_value() {
    let o = courier(
        &[
            "perf", "-l", "-t", "tag_bw", "-t", "tag_lat", "-n", "10", "-n", "300", "-s", "16",
            "-s", "8,8", "-w", "5", "-w", "10", "--json",
        ],
        TCP,
    );
    let v = json_of(&o, "options given twice");
    assert_eq!(v["test"], "tag_lat", "{v}");
    assert_eq!(v["iterations"], 300, "{v}");
    assert_eq!(v["message_size"], 16, "{v}");
    assert_eq!(v["iov"], serde_json::json!([8, 8]), "{v}");
}

/// `-O 0`, ucx_perftest's default value, is the test's default window (32 for tag_bw, 1
/// for tag_lat), not an error.
#[test]
fn window_zero_is_the_default_window() {
    for (t, w) in [("tag_bw", 32), ("tag_lat", 1), ("ucp_put_bw", 32)] {
        let o = courier(
            &[
                "perf", "-l", "-t", t, "-O", "0", "-n", "100", "-w", "0", "--json",
            ],
            TCP,
        );
        let v = json_of(&o, t);
        assert_eq!(v["window"], w, "{t}: {v}");
    }
}

/// Negative, zero and missing values are usage errors that name the option and say what
/// it takes (a negative number is not taken for an unknown option).
#[test]
fn odd_values_are_usage_errors_that_say_why() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["-n", "-5"], &["-n \"-5\"", "non-negative integer"]),
        (&["-w", "-1"], &["-w \"-1\"", "non-negative integer"]),
        (&["-O", "-1"], &["-O \"-1\"", "non-negative integer"]),
        (&["-s", "-5"], &["bad size \"-5\""]),
        (&["-R", "-1"], &["-R -1", "percentile from 0 to 100"]),
        (&["-c", "-1"], &["-c \"-1\"", "CPU list"]),
        (&["-n", "0"], &["-n 0", "at least 1 iteration"]),
        (&["-n", "100", "-n", "0"], &["-n 0"]),
        (&["-s"], &["a value is required", "--size"]),
        (&["-Z"], &["unexpected argument '-Z'"]),
    ];
    for (extra, wants) in cases {
        let mut args = vec!["perf", "-l", "-t", "tag_bw", "-w", "0"];
        if !extra.contains(&"-n") {
            args.extend_from_slice(&["-n", "10"]);
        }
        args.extend_from_slice(extra);
        let o = courier(&args, TCP);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {out}{err}");
        for w in *wants {
            assert!(err.contains(w), "{extra:?}: wants {w:?}: {err}");
        }
        assert!(out.is_empty(), "{extra:?}: {out}");
    }
}

/// The warm-up that runs is ucx_perftest's: `min(-w, ceil(-n / 10))`, whatever `-w` says
/// (10,000 by default), so `-n 10` of 16 MiB messages warms up once. The count is the one
/// the test loop made before it started measuring (`warmup_iterations` of `--json`), for a
/// streaming, a ping-pong and a one-sided loop.
#[test]
fn warm_up_is_at_most_a_tenth_of_the_iterations_as_in_ucx_perftest() {
    let cases: &[(&str, &str, u64, Option<u64>)] = &[
        ("tag_bw", "16m", 10, None),
        ("tag_bw", "64", 25, None),
        ("tag_bw", "64", 1000, Some(5)),
        ("tag_bw", "64", 100, Some(0)),
        ("tag_lat", "8", 1, None),
        ("tag_lat", "8", 200, Some(50)),
        ("ucp_put_lat", "8", 95, None),
    ];
    for &(t, size, n, w) in cases {
        let n_text = n.to_string();
        let mut args = vec!["perf", "-l", "-t", t, "-s", size, "-n", &n_text, "--json"];
        let w_text = w.map(|w| w.to_string());
        if let Some(w) = &w_text {
            args.extend_from_slice(&["-w", w]);
        }
        let o = courier(&args, TCP);
        let v = json_of(&o, &format!("{args:?}"));
        let want = w.unwrap_or(10_000).min(n.div_ceil(10));
        assert_eq!(v["warmup_iterations"], want, "{args:?}: {v}");
        assert_eq!(v["iterations"], n, "{args:?}: {v}");
    }
    // --local: -w replaces each test's warm-up under the same rule.
    let o = courier(
        &[
            "perf", "--local", "-t", "tag_lat", "-n", "30", "-w", "1000", "--json",
        ],
        TCP,
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    let rows: Vec<serde_json::Value> = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["test"] == "tag_lat")
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    for r in &rows {
        assert_eq!(r["warmup_iterations"], 3, "{r}");
    }
}

/// Peak resident memory (KiB) of `courier ARGS` over tcp, from the kernel's accounting of
/// the finished child (`wait4`).
// The child is reaped by `wait4`, which clippy cannot see.
#[allow(clippy::zombie_processes)]
fn peak_rss_kib(args: &[&str]) -> (i64, String) {
    let child = piped(args, TCP)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn courier");
    let pid = child.id() as libc::pid_t;
    let mut err = child.stderr.expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, whose pid we hold; the pointers are to live locals.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    let err = reader.join().unwrap_or_default();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{args:?} failed: {err}"
    );
    (usage.ru_maxrss, err)
}

/// As ucx_perftest, the receiver of `tag_bw` maps one receive buffer, into which every
/// receive of the window lands, and nothing writes the buffers before the run: 32 MiB
/// messages with 32 outstanding (the default window) take about one message on each side,
/// not a window's worth (1 GiB) zeroed before the first message, and a client over tcp
/// less than one. With `--check` every receive of the window has a slot of its own, as it
/// must to be checked.
#[test]
fn a_window_of_large_messages_maps_one_receive_buffer() {
    let mib = 1024;
    let (one, err) = peak_rss_kib(&["perf", "-l", "-t", "tag_bw", "-s", "32m", "-n", "4"]);
    // Client and server in one process: a 32 MiB send buffer, a 32 MiB receive buffer,
    // the library and the tool.
    assert!(one < 160 * mib, "peak RSS {one} KiB: {err}");
    // A client process over tcp sends from memory it never writes, as ucx_perftest's
    // does (its pages read as the kernel's zero page): less than one message.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
        .to_string();
    let mut srv = piped(&["perf", "-p", &port], TCP).spawn().expect("server");
    let mut lines = BufReader::new(srv.stdout.take().expect("piped")).lines();
    assert_eq!(
        lines.next().and_then(Result::ok).as_deref(),
        Some("Waiting for connection...")
    );
    let drain = std::thread::spawn(move || lines.map_while(Result::ok).count());
    let (client, err) = peak_rss_kib(&[
        "perf",
        "127.0.0.1",
        "-p",
        &port,
        "-t",
        "tag_bw",
        "-s",
        "32m",
        "-n",
        "4",
    ]);
    assert!(client < 24 * mib, "client peak RSS {client} KiB: {err}");
    assert!(srv.wait().expect("server").success());
    let _ = drain.join();
    let (checked, err) = peak_rss_kib(&[
        "perf", "-l", "-t", "tag_bw", "-s", "1m", "-n", "64", "-O", "32", "--check",
    ]);
    assert!(
        checked > 32 * mib,
        "peak RSS {checked} KiB with -check: {err}"
    );
}
