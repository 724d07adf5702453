//! `courier perf -T N`: the test in N client threads, as ucx_perftest runs it. These tests
//! look at the shape of the output (rows per thread, the aggregated final row, the header,
//! CSV and JSON) and at the server's side of it; no assertion looks at a timing value.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
mod common;
use common::{TCP, allowed_cpus, courier, fields as numbers, json_of, piped, text};

/// The table of a `-T` run: the header box and column headers as with one thread, then
/// only `[thread k]` rows (k < threads, eight numbers each) and one `Final:` row of four
/// numbers (iterations, latency, bandwidth, message rate). Returns the threads that
/// printed rows.
fn check_table(out: &str, threads: usize, iters: f64) -> Vec<usize> {
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("+---") && lines[0].len() == 108,
        "{out}"
    );
    assert!(
        lines[1].starts_with("| API:          protocol layer"),
        "{out}"
    );
    let stage = lines
        .iter()
        .position(|l| l.starts_with("|    Stage     | # iterations |"))
        .unwrap_or_else(|| panic!("no column header:\n{out}"));
    assert_eq!(
        out.matches("|    Stage     |").count(),
        1,
        "one header for all threads:\n{out}"
    );
    let last = lines[lines.len() - 1];
    assert!(last.starts_with("Final:    "), "{out}");
    let fin = numbers(last);
    assert_eq!(fin.len(), 4, "the aggregated row has four numbers: {last}");
    assert_eq!(fin[0], iters, "{last}");
    let mut seen = Vec::new();
    for l in &lines[stage + 2..lines.len() - 1] {
        let k: usize = l
            .strip_prefix("[thread ")
            .and_then(|r| r.split(']').next())
            .and_then(|k| k.parse().ok())
            .unwrap_or_else(|| panic!("not a thread row: {l}\n{out}"));
        assert!(k < threads, "{l}");
        assert_eq!(numbers(l).len(), 8, "[thread k] and eight numbers: {l}");
        if !seen.contains(&k) {
            seen.push(k);
        }
    }
    seen.sort();
    seen
}

/// Iterations of `-T 2 -t tag_bw` for about two seconds on this machine (a short run's
/// slowest thread's message rate, doubled): long enough for every thread to print rows of
/// its own, which come about once a second.
fn iterations_for_two_seconds() -> f64 {
    let o = courier(
        &[
            "perf", "-l", "-T", "2", "-t", "tag_bw", "-n", "3000", "-w", "10", "--json",
        ],
        TCP,
    );
    let v = json_of(&o, "run");
    let slowest = v["per_thread"]
        .as_array()
        .expect("per_thread")
        .iter()
        .filter_map(|t| t["msgrate_overall"].as_f64())
        .fold(f64::MAX, f64::min);
    (2.0 * slowest).clamp(3000.0, 200_000_000.0)
}

#[test]
fn loopback_threads_print_thread_rows_and_an_aggregated_final_row() {
    // A short run: maybe no per-thread rows (they come about once a second), the final row.
    let o = courier(
        &[
            "perf", "-l", "-T", "2", "-t", "tag_bw", "-n", "3000", "-w", "10",
        ],
        TCP,
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    check_table(&out, 2, 3000.0);
    assert!(err.contains("-T 2 implies -M multi"), "{err}");

    // Long enough (over a second, measured on the same path first) for every thread to
    // print rows of its own.
    let mut iters = iterations_for_two_seconds();
    for attempt in 0..4 {
        let n = format!("{}", iters as u64);
        let o = courier(
            &[
                "perf", "-l", "-T", "2", "-M", "multi", "-t", "tag_bw", "-n", &n, "-w", "10",
            ],
            TCP,
        );
        let (out, err) = text(&o);
        assert!(o.status.success(), "{out}{err}");
        assert!(!err.contains("implies"), "-M multi was given: {err}");
        if check_table(&out, 2, iters.floor()) == [0, 1] {
            return;
        }
        assert!(
            attempt < 3,
            "no rows from every thread after 4 runs:\n{out}"
        );
        // Too short: size the next run from this one's own message rate (the estimate
        // above came from a 3000-iteration run, which can be far slower than a long one),
        // for about two seconds, and at least three times as many iterations.
        let rate = out
            .lines()
            .last()
            .map(numbers)
            .and_then(|f| f.get(3).copied())
            .unwrap_or(0.0);
        iters = (iters * 3.0).max(rate * 2.0).min(200_000_000.0);
    }
}

/// The CSV of a `-T` run (`-v`): the header with a first column `thread`, then rows with
/// as many fields: a thread's (its number first, then eight numbers) and last the
/// aggregated row (`final`, the iterations, and the overall latency, bandwidth and message
/// rate in their columns, the others empty). Returns the number of lines and the threads
/// that printed rows.
fn check_csv_rows(out: &str, threads: usize, iters: &str) -> (usize, Vec<usize>) {
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "thread,iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr",
        "{out}"
    );
    let mut seen = Vec::new();
    for l in &lines[1..lines.len() - 1] {
        let f: Vec<&str> = l.split(',').collect();
        assert_eq!(
            f.len(),
            9,
            "a thread row has the header's columns: {l}\n{out}"
        );
        let k: usize = f[0]
            .parse()
            .unwrap_or_else(|_| panic!("not a thread number: {l}\n{out}"));
        assert!(k < threads, "{l}");
        assert!(f[1..].iter().all(|x| x.parse::<f64>().is_ok()), "{l}");
        if !seen.contains(&k) {
            seen.push(k);
        }
    }
    let last = lines[lines.len() - 1];
    let f: Vec<&str> = last.split(',').collect();
    assert_eq!(
        f.len(),
        9,
        "the final row has the header's columns: {last}\n{out}"
    );
    assert_eq!(f[0], "final", "{last}");
    assert_eq!(f[1], iters, "{last}");
    for (i, x) in f.iter().enumerate().skip(2) {
        // overall_lat, overall_bw, overall_mr hold numbers; the rest is empty.
        if [4, 6, 8].contains(&i) {
            assert!(x.parse::<f64>().is_ok(), "column {i}: {last}");
        } else {
            assert!(x.is_empty(), "column {i}: {last}");
        }
    }
    seen.sort();
    (lines.len(), seen)
}

fn check_csv(out: &str, threads: usize, iters: &str) -> usize {
    check_csv_rows(out, threads, iters).0
}

/// A `-T 2 -v` run long enough for rows of every thread (one comes about once a second,
/// so the run is sized from a short one's message rate): they are valid CSV rows.
#[test]
fn csv_rows_of_threads_have_the_headers_columns() {
    let mut iters = iterations_for_two_seconds();
    for attempt in 0..4 {
        let n = format!("{}", iters as u64);
        let o = courier(
            &[
                "perf", "-l", "-T", "2", "-t", "tag_bw", "-n", &n, "-w", "10", "-v",
            ],
            TCP,
        );
        let (out, err) = text(&o);
        assert!(o.status.success(), "{out}{err}");
        if check_csv_rows(&out, 2, &n).1 == [0, 1] {
            return;
        }
        assert!(
            attempt < 3,
            "no rows from every thread after 4 runs:\n{out}"
        );
        let rate = out
            .lines()
            .last()
            .and_then(|l| l.split(',').nth(8))
            .and_then(|x| x.parse::<f64>().ok())
            .unwrap_or(0.0);
        iters = (iters * 3.0).max(rate * 2.0).min(200_000_000.0);
    }
}

#[test]
fn final_only_csv_and_json_with_threads() {
    let o = courier(
        &[
            "perf", "-l", "-T", "3", "-t", "tag_lat", "-n", "200", "-w", "10", "-f",
        ],
        TCP,
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(out.starts_with("+---") && out.contains("| Test:         tag match latency"));
    // As ucx_perftest -f: the column headers (first column "Test"), no Final label.
    assert!(
        out.contains("|     Test     | # iterations |") && !out.contains("Final:"),
        "{out}"
    );
    let last = out.lines().last().unwrap_or_default();
    let n = numbers(last);
    assert_eq!(n.len(), 4, "{out}");
    assert_eq!(n[0], 200.0, "{out}");

    // Two threads' CSV, with every row and then with the final one only.
    let csv = |extra: &[&str]| {
        let mut args = vec![
            "perf",
            "-l",
            "-T",
            "2",
            "-t",
            "ucp_am_bw",
            "-n",
            "500",
            "-w",
            "10",
            "-v",
        ];
        args.extend_from_slice(extra);
        let o = courier(&args, TCP);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{out}{err}");
        out
    };
    check_csv(&csv(&[]), 2, "500");
    let out = csv(&["-f"]);
    let lines = check_csv(&out, 2, "500");
    assert_eq!(lines, 2, "-f: the header and the final row only:\n{out}");

    let o = courier(
        &[
            "perf",
            "-l",
            "-T",
            "2",
            "-t",
            "stream_lat",
            "-s",
            "1k",
            "-n",
            "200",
            "-w",
            "10",
            "--json",
            "--check",
        ],
        TCP,
    );
    let v = json_of(&o, "run");
    assert_eq!(v["test"], "stream_lat");
    assert_eq!(v["threads"], 2);
    assert_eq!(v["iterations"], 200);
    assert_eq!(v["transport"], "tcp");
    let per = v["per_thread"].as_array().expect("per_thread");
    assert_eq!(per.len(), 2);
    for (k, t) in per.iter().enumerate() {
        assert_eq!(t["thread"], k);
        assert_eq!(t["iterations"], 200);
        assert_eq!(t["message_size"], 1024);
    }
    let sum: f64 = per
        .iter()
        .filter_map(|t| t["msgrate_overall"].as_f64())
        .sum();
    let total = v["msgrate_overall"].as_f64().expect("msgrate_overall");
    assert!((sum - total).abs() <= 1e-6 * total.max(1.0), "{out}");
}

/// A server process (`--verbose`); returns it and its port.
fn server(env: &[(&str, &str)]) -> (Child, u16) {
    server_with(env, &[])
}

/// `server` with more options.
fn server_with(env: &[(&str, &str)], extra: &[&str]) -> (Child, u16) {
    let mut args = vec!["perf", "-p", "0", "--announce", "--verbose"];
    args.extend_from_slice(extra);
    let mut child = piped(&args, env).spawn().expect("start the server");
    let out = child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let port = rx
        .recv_timeout(Duration::from_secs(30))
        .ok()
        .and_then(|l| l.trim().strip_prefix("PORT ")?.parse().ok());
    match port {
        Some(p) => (child, p),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server did not announce its port");
        }
    }
}

/// Wait for `c` to exit within `limit` (killing it and failing if it does not); returns
/// its status and stderr.
fn finish(mut c: Child, limit: Duration) -> (std::process::ExitStatus, String) {
    let t = Instant::now();
    loop {
        if let Some(st) = c.try_wait().expect("try_wait") {
            let mut err = String::new();
            if let Some(mut e) = c.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return (st, err);
        }
        if t.elapsed() > limit {
            let _ = c.kill();
            let _ = c.wait();
            panic!("the process did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_server_process_answers_every_thread_of_a_client_process() {
    for env in [TCP, &[][..]] {
        let (srv, port) = server(env);
        let port_s = port.to_string();
        let o = courier(
            &[
                "perf",
                "127.0.0.1",
                "-p",
                &port_s,
                "-T",
                "3",
                "-t",
                "tag_bw",
                "-n",
                "2000",
                "-w",
                "10",
            ],
            env,
        );
        let (out, err) = text(&o);
        let (st, serr) = finish(srv, Duration::from_secs(30));
        assert!(o.status.success(), "{env:?}: {out}{err}\nserver: {serr}");
        check_table(&out, 3, 2000.0);
        assert!(st.success(), "{env:?}: server: {serr}");
        assert!(serr.contains("client runs 3 threads"), "{serr}");
        assert_eq!(serr.matches("running tag_bw ").count(), 3, "{serr}");
        assert_eq!(serr.matches("connected: ").count(), 3, "{serr}");
    }
}

#[test]
fn a_killed_server_ends_every_thread_with_an_error_naming_it() {
    let (mut srv, port) = server(&[]);
    let port_s = port.to_string();
    let client = piped(
        &[
            "perf",
            "127.0.0.1",
            "-p",
            &port_s,
            "-T",
            "2",
            "-t",
            "tag_bw",
            "-n",
            "1000000000000",
            "-f",
        ],
        &[],
    )
    .stdout(Stdio::null())
    .spawn()
    .expect("start the client");
    std::thread::sleep(Duration::from_millis(1500));
    let _ = srv.kill();
    let _ = srv.wait();
    let (st, err) = finish(client, Duration::from_secs(15));
    assert!(!st.success(), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("courier: error:"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains("thread "), "{line}");
    assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
}

#[test]
fn threads_are_refused_where_they_cannot_run() {
    let cases: &[(&[&str], &str)] = &[
        (&["-l", "-t", "ucp_put_bw"], "one-sided"),
        (&["-l", "-t", "tag_lat", "-M", "single"], "-M multi"),
        (&["--local"], "--local"),
        (&["-t", "tag_lat"], "option of the client"),
    ];
    for (extra, want) in cases {
        let mut args = vec!["perf", "-T", "2", "-n", "10"];
        args.extend_from_slice(extra);
        let o = courier(&args, TCP);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {err}");
        assert!(
            err.contains("-T 2") && err.contains(want),
            "{extra:?}: {err}"
        );
    }
    let o = courier(&["perf", "-l", "-t", "tag_lat", "-T", "1000"], TCP);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("expected 1 to 256 threads"));
}

/// The CPUs each thread of a `--json` run found itself on, client and server side.
fn thread_cpus(v: &serde_json::Value) -> Vec<(serde_json::Value, serde_json::Value)> {
    v["per_thread"]
        .as_array()
        .expect("per_thread")
        .iter()
        .map(|t| (t["client"]["cpus"].clone(), t["server"]["cpus"].clone()))
        .collect()
}

/// `-T` with `-c`: each thread is pinned to its own CPU of the list, as each finds it
/// (sched_getaffinity in the thread, both sides). In one process (`-l`) client and server
/// threads alternate in the list; a server process pins its threads by its own `-c`.
#[test]
fn threads_are_pinned_to_the_cpus_of_the_list_in_turn() {
    let cpus = allowed_cpus();
    let (c0, c1) = (cpus[0], *cpus.get(1).unwrap_or(&cpus[0]));
    let one = |c: usize| serde_json::json!([c]);
    let list = format!("{c0},{c1}");
    let o = courier(
        &[
            "perf", "-l", "-T", "3", "-c", &list, "-t", "tag_lat", "-n", "200", "-w", "10",
            "--json",
        ],
        TCP,
    );
    let v = json_of(&o, "loopback run");
    // Pair k on the 2k-th and 2k+1-th of two CPUs: every client thread on c0, every
    // server thread on c1.
    assert_eq!(thread_cpus(&v), vec![(one(c0), one(c1)); 3], "{v}");

    let (srv, port) = server_with(TCP, &["-c", &format!("{c1},{c0}")]);
    let args = format!("perf 127.0.0.1 -p {port} -T 3 -c {list} -t tag_lat -n 200 -w 10 --json");
    let o = courier(&args.split_whitespace().collect::<Vec<_>>(), TCP);
    let (st, serr) = finish(srv, Duration::from_secs(30));
    let v = json_of(&o, "client run");
    assert!(st.success(), "server: {serr}");
    // Thread k on the k-th CPU of its own process's list, wrapping.
    assert_eq!(
        thread_cpus(&v),
        vec![(one(c0), one(c1)), (one(c1), one(c0)), (one(c0), one(c1))],
        "{v}"
    );
}
