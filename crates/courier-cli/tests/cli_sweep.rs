//! `courier perf --sweep` and `--local` as an OSU user and a script see them: the sweep's
//! output in OSU's shape (one section alone is what a script written for its OSU namesake
//! reads), `-t` picking sections, odd option values refused with exit 2, COURIER_TLS
//! honoured by `--local`, and a server process that dies failing the run. No assertion
//! looks at a timing value.

mod common;
use common::{TCP, courier, piped, text};

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

/// What a script written for OSU output does with one benchmark's output: skip the
/// comment lines, split every other line on white space into an integer size and its
/// numbers. Panics, as such a script would fail, on a line it cannot read (a blank one
/// included).
fn osu_rows(out: &str) -> Vec<(u64, Vec<f64>)> {
    out.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let mut f = l.split_whitespace();
            let size = f
                .next()
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no size in {l:?}:\n{out}"));
            let nums: Vec<f64> = f
                .map(|x| {
                    x.parse::<f64>()
                        .unwrap_or_else(|e| panic!("{e}: {x:?} in {l:?}"))
                })
                .collect();
            (size, nums)
        })
        .collect()
}

fn sweep(extra: &[&str], env: &[(&str, &str)]) -> String {
    let mut args = vec!["perf", "--local", "--sweep", "--quick"];
    args.extend_from_slice(extra);
    let o = courier(&args, env);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{args:?}: {out}{err}");
    out
}

/// `-t` with one OSU name: that section alone, in OSU's shape (a `# OSU` title, the column
/// header, then a size and its value per line, powers of 2 up to `--max-size`, nothing
/// else); the bandwidth section runs osu_bw's windows with an ack per window.
#[test]
fn one_section_is_what_an_osu_script_reads() {
    for (t, col, cols, test) in [
        ("osu_latency", "Latency (us)", 1, "tag_lat"),
        ("osu_bw", "Bandwidth (MB/s)", 1, "tag_win_bw"),
        ("bibw", "Bandwidth (MB/s)", 1, "tag_bibw"),
        ("osu_mbw_mr", "Messages/s", 2, "tag_win_bw"),
    ] {
        let out = sweep(&["-t", t, "--max-size", "64", "--pairs", "1"], TCP);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("# OSU-style "), "{t}: {out}");
        assert!(lines[0].contains(&format!("courier {test},")), "{t}: {out}");
        assert!(lines[0].ends_with("transport tcp)"), "{t}: {out}");
        let head = lines
            .iter()
            .find(|l| l.starts_with("# Size"))
            .unwrap_or_else(|| panic!("{t}: no column header:\n{out}"));
        assert!(head.ends_with(col), "{t}: {head}");
        assert_eq!(lines.iter().filter(|l| l.starts_with("# OSU")).count(), 1);
        let rows = osu_rows(&out);
        let sizes: Vec<u64> = rows.iter().map(|r| r.0).collect();
        assert_eq!(sizes, [1, 2, 4, 8, 16, 32, 64], "{t}: {out}");
        for (_, nums) in &rows {
            assert_eq!(nums.len(), cols, "{t}: {out}");
        }
    }
}

/// Every section by default (or as `-t` lists them, in the sweep's order), one blank line
/// between two sections and none after the last.
#[test]
fn sections_are_parted_by_one_blank_line() {
    let out = sweep(
        &["-t", "osu_bibw,latency", "--max-size", "4", "--pairs", "1"],
        TCP,
    );
    let parts: Vec<&str> = out.split("\n\n").collect();
    assert_eq!(parts.len(), 2, "{out}");
    assert!(parts[0].starts_with("# OSU-style Latency Test"), "{out}");
    assert!(
        parts[1].starts_with("# OSU-style Bi-Directional Bandwidth Test"),
        "{out}"
    );
    assert!(!out.ends_with("\n\n"), "{out:?}");
    for p in parts {
        assert_eq!(osu_rows(p).len(), 3, "{p}");
    }
    let all = sweep(&["--max-size", "2", "--pairs", "1"], TCP);
    assert_eq!(all.matches("# OSU-style ").count(), 4, "{all}");
    assert_eq!(all.matches("\n\n").count(), 3, "{all}");
    assert!(!all.ends_with("\n\n"), "{all:?}");
    assert!(
        all.contains("(courier tag_win_bw, 1 pairs, 2 processes, transport tcp)"),
        "{all}"
    );
}

/// Odd values of the sweep's and the suite's options: exit 2, a message naming the option,
/// nothing on stdout, nothing started.
#[test]
fn odd_option_values_are_usage_errors() {
    for (args, want) in [
        (
            &["--local", "--sweep", "--pairs", "65"][..],
            "--pairs 65: at most 64",
        ),
        (&["--local", "--sweep", "--pairs", "0"], "--pairs 0"),
        (&["--local", "--sweep", "--pairs", "x"], "'--pairs <PAIRS>'"),
        (&["--local", "--sweep", "--max-size", "0"], "--max-size 0"),
        (
            &["--local", "--sweep", "--max-size", "4g"],
            "--max-size 4g: at most",
        ),
        (
            &["--local", "--sweep", "--max-size", "1.5k"],
            "bad size \"1.5k\"",
        ),
        (
            &["--local", "--sweep", "-t", "osu_put"],
            "-t osu_put: with --sweep",
        ),
        (
            &["--local", "--sweep", "-t", "bw,,bibw"],
            "separated by commas",
        ),
        (
            &["--local", "--sweep", "-n", "10"],
            "-n cannot be used with --sweep",
        ),
        (
            &["--sweep", "127.0.0.1", "--pairs", "2"],
            "--pairs 2: the multi-pair test runs with --local only",
        ),
        (
            &["--sweep", "127.0.0.1", "-t", "mbw_mr"],
            "-t osu_mbw_mr: the multi-pair test runs with --local only",
        ),
        (
            &["--local", "-n", "18446744073709551615", "-w", "5"],
            "iterations plus warm-up exceed",
        ),
    ] {
        let mut v = vec!["perf"];
        v.extend_from_slice(args);
        let o = courier(&v, &[]);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {out}{err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
    }
}

/// `--local` runs only the transports COURIER_TLS allows and says so; `self` alone (which
/// connects no two processes) and a bad value are usage errors, for `--sweep` too.
#[test]
fn local_honours_courier_tls() {
    let o = courier(&["perf", "--local", "-t", "ucp_am_lat", "-n", "200"], TCP);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(out.contains("only tcp: COURIER_TLS excludes shm"), "{out}");
    let rows: Vec<&str> = out.lines().filter(|l| l.contains(" iters ")).collect();
    assert_eq!(rows.len(), 1, "{out}");
    assert!(rows[0].starts_with("tcp  ucp_am_lat"), "{out}");
    assert!(!out.contains("shm "), "{out}");
    for tls in ["self", "nope"] {
        for mode in [
            &["--local", "-t", "ucp_am_lat"][..],
            &["--local", "--sweep"],
        ] {
            let mut args = vec!["perf"];
            args.extend_from_slice(mode);
            let o = courier(&args, &[("COURIER_TLS", tls)]);
            let (out, err) = text(&o);
            assert_eq!(o.status.code(), Some(2), "{tls} {mode:?}: {out}{err}");
            assert!(err.contains("COURIER_TLS="), "{err}");
            assert!(out.is_empty(), "{tls} {mode:?}: {out}");
        }
    }
}

/// The pid of a child process of `pid` (the `--local` server), once it has one.
fn child_of(pid: u32, within: Duration) -> Option<u32> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        let path = format!("/proc/{pid}/task/{pid}/children");
        if let Some(c) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
        {
            return Some(c);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// A server process killed during the second of two `--local` rows: the first row stands,
/// the second says the peer died (naming its pid), "1 of 2 tests passed" follows, and the
/// run exits 1 with "1 of 2 tests failed", not 0 and not hung.
#[test]
fn a_killed_server_fails_the_local_run() {
    let mut c = piped(
        &[
            "perf",
            "--local",
            "-t",
            "ucp_put_lat,ucp_am_lat",
            "-n",
            "100000",
        ],
        TCP,
    )
    .spawn()
    .expect("spawn courier");
    // The run ends by itself well before this guard kills it (a hang).
    let guard = c.id();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if finished.recv_timeout(Duration::from_secs(300)).is_err() {
            let _ = std::process::Command::new("kill")
                .args(["-9", &guard.to_string()])
                .status();
        }
    });
    let mut lines = BufReader::new(c.stdout.take().expect("stdout")).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    assert!(first.starts_with("courier perf --local:"), "{first}");
    let server = child_of(c.id(), Duration::from_secs(10)).expect("a server process");
    // A row's line comes when it is done (in the suite's order: ucp_am_lat, then
    // ucp_put_lat); the same server then runs the second, 100000 round trips over tcp,
    // far longer than the kill takes.
    let mut out: Vec<String> = Vec::new();
    for l in lines.by_ref().map_while(Result::ok) {
        let row = l.starts_with("tcp  ");
        out.push(l);
        if row {
            break;
        }
    }
    let killed = std::process::Command::new("kill")
        .args(["-9", &server.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    out.extend(lines.map_while(Result::ok));
    let status = c.wait().expect("wait");
    let _ = done.send(());
    watchdog.join().expect("watchdog");
    let mut err = String::new();
    if let Some(mut e) = c.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    let out = out.join("\n");
    assert_eq!(status.code(), Some(1), "{out}\n{err}");
    let first_row = out.lines().find(|l| l.starts_with("tcp  ucp_am_lat"));
    assert!(
        first_row.is_some_and(|l| l.contains("iters") && !l.contains("pid")),
        "the first row should stand:\n{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("tcp  ucp_put_lat") && l.contains(&format!("pid {server}"))),
        "{out}"
    );
    assert_eq!(out.lines().last(), Some("1 of 2 tests passed"), "{out}");
    assert!(err.contains("courier: error: 1 of 2 tests failed"), "{err}");
}
