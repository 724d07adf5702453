//! `courier perf --sweep`: OSU-style sweeps over message sizes (powers of two).
//!
//! Each section measures what its OSU namesake does: `osu_latency` (one-way latency of
//! ping-pongs, one message at a time), `osu_bw` (a window of messages, then one ack from
//! the receiver per window), `osu_bibw` (windows both ways at once) and `osu_mbw_mr`
//! (`--pairs` pairs running `osu_bw`'s windows at once). The output has OSU's shape:
//! comment lines start with `#`, each row is the size and its numbers separated by white
//! space, and a blank line separates two sections (`-t` picks sections; one section alone
//! is exactly what a script written for its OSU namesake reads).

use std::net::SocketAddr;
use std::sync::{Arc, Barrier, mpsc};
use std::time::{Duration, Instant};

use super::engine::{self, Link};
use super::local::{ChildServer, human_size};
use super::params::{self, MemKind, Params, TestKind, parse_size};
use super::report::{Output, Row};
use super::{PerfArgs, Settings, make_worker, run_test};
use crate::error::{CliError, CliResult};

/// The most pairs of `--pairs`: each is a server process and a client thread here.
pub const MAX_PAIRS: usize = 64;

/// The largest `--max-size`: the counts of a point shrink with its size down to a floor
/// (16 messages), so bigger messages would make a sweep that runs for hours, and each
/// side maps a window of them.
const MAX_SWEEP_SIZE: usize = 1 << 30;

/// A section of the sweep, named after the OSU benchmark it stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Section {
    Latency,
    Bw,
    Bibw,
    MbwMr,
}

const SECTIONS: [Section; 4] = [Section::Latency, Section::Bw, Section::Bibw, Section::MbwMr];

impl Section {
    /// The OSU benchmark's name (`-t` takes it with or without `osu_`).
    fn osu_name(self) -> &'static str {
        match self {
            Section::Latency => "osu_latency",
            Section::Bw => "osu_bw",
            Section::Bibw => "osu_bibw",
            Section::MbwMr => "osu_mbw_mr",
        }
    }

    fn parse(name: &str) -> Option<Section> {
        SECTIONS
            .into_iter()
            .find(|s| s.osu_name() == name || s.osu_name().strip_prefix("osu_") == Some(name))
    }

    /// The test each point runs, the section's title and its column header.
    fn test(self) -> (TestKind, &'static str, &'static str) {
        match self {
            Section::Latency => (TestKind::TagLat, "Latency Test", "Latency (us)"),
            Section::Bw => (TestKind::TagWinBw, "Bandwidth Test", "Bandwidth (MB/s)"),
            Section::Bibw => (
                TestKind::TagBibw,
                "Bi-Directional Bandwidth Test",
                "Bandwidth (MB/s)",
            ),
            Section::MbwMr => (
                TestKind::TagWinBw,
                "Multiple Bandwidth / Message Rate Test",
                "MB/s",
            ),
        }
    }
}

fn sizes(max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = 1usize;
    while s <= max.max(1) {
        v.push(s);
        s *= 2;
    }
    v
}

/// Messages of a window of the bandwidth tests: 64, as in OSU, up to 1 MiB; above, as
/// many as make 64 MiB in flight (at least 2): 4 at 16 MiB.
fn window(size: usize) -> usize {
    ((64usize << 20) / size.max(1)).clamp(2, 64)
}

/// The windows used over `list`, for the section headers: `64 (1 B .. 1 MiB), 32 (2 MiB)`.
fn window_note(list: &[usize]) -> String {
    let mut groups: Vec<(usize, usize, usize)> = Vec::new();
    for &size in list {
        let w = window(size);
        match groups.last_mut() {
            Some((gw, _, last)) if *gw == w => *last = size,
            _ => groups.push((w, size, size)),
        }
    }
    groups
        .iter()
        .map(|&(w, first, last)| {
            if first == last {
                format!("{w} ({})", human_size(first))
            } else {
                format!("{w} ({} .. {})", human_size(first), human_size(last))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Latency sweep point: (iterations, warm-up).
fn lat_iters(size: usize) -> (u64, u64) {
    if size <= 8192 {
        (10_000, 1_000)
    } else {
        let n = ((32u64 << 20) / size as u64).clamp(10, 1000);
        (n, (n / 10).max(1))
    }
}

/// Bandwidth sweep point: (messages, warm-up); 512 MiB a point from 8 KiB up, at least
/// 16 messages (so 16 MiB moves 32).
fn bw_msgs(size: usize) -> (u64, u64) {
    let n = ((512u64 << 20) / size.max(1) as u64).clamp(16, 100_000);
    (n, (n / 10).max(4))
}

/// Bandwidth sweep point in windows (osu_bw's loop): (windows, warm-up windows), the
/// messages of `bw_msgs` (at least 2 windows).
fn bw_rounds(size: usize) -> (u64, u64) {
    let w = window(size) as u64;
    let (n, warm) = bw_msgs(size);
    ((n / w).max(2), (warm / w).max(1))
}

/// Windows of each pair at one point of the multi-pair test: a quarter of the bandwidth
/// sweep's, at least 2.
fn mbw_rounds(size: usize, quick: bool) -> u64 {
    (params(TestKind::TagWinBw, size, quick).iters / 4).max(2)
}

fn bibw_rounds(size: usize) -> (u64, u64) {
    let n = ((256u64 << 20) / (size * window(size)) as u64).clamp(2, 200);
    (n, (n / 10).max(1))
}

fn params(test: TestKind, size: usize, quick: bool) -> Params {
    let ((iters, warmup), window) = match test {
        TestKind::TagLat => (lat_iters(size), 1),
        TestKind::TagBibw => (bibw_rounds(size), window(size)),
        TestKind::TagWinBw => (bw_rounds(size), window(size)),
        _ => (bw_msgs(size), window(size)),
    };
    let (iters, warmup) = if quick {
        ((iters / 10).max(2), (warmup / 10).max(1))
    } else {
        (iters, warmup)
    };
    Params {
        test,
        sizes: vec![size],
        iters,
        warmup,
        window,
        check: false,
        mem: [MemKind::Host; 2],
    }
}

/// OSU reports MB/s as 10^6 bytes per second.
fn osu_mbs(r: &Row, size: usize) -> f64 {
    r.mr_overall * size as f64 / 1e6
}

/// Print one section (`Latency`, `Bw` or `Bibw`) over `link`.
fn section(link: &Link, s: &Settings, quick: bool, sec: Section, list: &[usize]) -> CliResult<()> {
    let (test, title, col) = sec.test();
    println!(
        "# OSU-style {title} (courier {}, transport {})",
        test.name(),
        link.ep.transport().unwrap_or("?")
    );
    if test != TestKind::TagLat {
        println!("# [ window size: {} ]", window_note(list));
    }
    println!("# Size{col:>26}");
    let quiet = Settings {
        out: Output::Silent,
        ..s.clone()
    };
    for &size in list {
        let p = params(test, size, quick);
        let r = run_test(link, &p, &quiet, None)?;
        // A space always parts the fields, however wide a value: scripts split on it.
        match test {
            TestKind::TagLat => println!("{size:<10} {:>19.2}", r.lat_overall),
            _ => println!("{size:<10} {:>19.2}", osu_mbs(&r, size)),
        }
    }
    Ok(())
}

/// Options the sweeps do not use (each point's size, counts and output are the sweep's
/// own), by clap id, with how to name them.
const NOT_WITH_SWEEP: [(&str, &str); 15] = [
    ("size", "-s"),
    ("iters", "-n"),
    ("warmup", "-w"),
    ("outstanding", "-O"),
    ("mem", "-m"),
    ("layout", "-D"),
    ("final_only", "-f"),
    ("csv", "-v"),
    ("json", "--json"),
    ("thousands", "-N"),
    ("percentile", "-R"),
    ("check", "--check"),
    ("loopback", "-l"),
    ("verbose", "--verbose"),
    ("announce", "--announce"),
];

/// The sections `-t` names (a comma list of OSU names, with or without `osu_`), in the
/// sweep's order; every one without it.
fn pick_sections(a: &PerfArgs) -> CliResult<Vec<Section>> {
    let Some(list) = a.test.as_deref().filter(|_| a.given("test")) else {
        return Ok(SECTIONS.to_vec());
    };
    let names = || {
        SECTIONS
            .iter()
            .map(|s| s.osu_name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut want = Vec::new();
    for name in list.split(',').map(str::trim) {
        if name.is_empty() {
            return Err(CliError::usage(format!(
                "-t {list:?}: expected OSU benchmark names separated by commas ({})",
                names()
            )));
        }
        let sec = Section::parse(&name.to_ascii_lowercase()).ok_or_else(|| {
            CliError::usage(format!(
                "-t {name}: with --sweep, -t names OSU benchmarks: {} (osu_ may be left out)",
                names()
            ))
        })?;
        want.push(sec);
    }
    Ok(SECTIONS.into_iter().filter(|s| want.contains(s)).collect())
}

/// Refuse the options `--sweep` would ignore (with `--local`, also a server to use) and
/// odd values; the sections to run and the largest size.
fn check_args(a: &PerfArgs) -> CliResult<(Vec<Section>, usize)> {
    let honoured = "--sweep takes -t, --max-size, --pairs, -c and -M, and HOST and -p \
                    without --local";
    for (id, flag) in NOT_WITH_SWEEP {
        if a.given(id) {
            return Err(CliError::usage(format!(
                "{flag} cannot be used with --sweep: its points set their own sizes, counts \
                 and output ({honoured})"
            )));
        }
    }
    let max = parse_size(&a.max_size)?;
    if max == 0 {
        return Err(CliError::usage(format!(
            "--max-size {}: the sweep starts at 1 byte, so the largest size must be at least 1",
            a.max_size
        )));
    }
    if max > MAX_SWEEP_SIZE {
        return Err(CliError::usage(format!(
            "--max-size {}: at most {} (1g)",
            a.max_size, MAX_SWEEP_SIZE
        )));
    }
    let sections = pick_sections(a)?;
    if a.local {
        for (id, flag) in [("host", "HOST"), ("port", "-p")] {
            if a.given(id) {
                return Err(CliError::usage(format!(
                    "{flag} cannot be used with --local --sweep: it starts its own servers \
                     ({honoured})"
                )));
            }
        }
    } else {
        if a.given("pairs") {
            return Err(CliError::usage(format!(
                "--pairs {}: the multi-pair test runs with --local only (one server process \
                 per pair)",
                a.pairs
            )));
        }
        if a.given("test") && sections.contains(&Section::MbwMr) {
            return Err(CliError::usage(
                "-t osu_mbw_mr: the multi-pair test runs with --local only (one server \
                 process per pair)",
            ));
        }
    }
    Ok((sections, max))
}

/// Run the sweeps against `server`, or (None) against a server process started here.
pub fn run(a: &PerfArgs, s: &Settings, server: Option<SocketAddr>) -> CliResult<()> {
    let (sections, max) = check_args(a)?;
    super::local::two_process_transports()?;
    let list = sizes(max);
    if server.is_none() {
        s.note_one_cpu();
    }
    s.pin_client()?;
    // A blank line between two sections, none after the last: one section alone has
    // OSU's shape.
    let mut printed = 0;
    let mut gap = || {
        if printed > 0 {
            println!();
        }
        printed += 1;
    };
    let one_link: Vec<Section> = sections
        .iter()
        .copied()
        .filter(|&sec| sec != Section::MbwMr)
        .collect();
    if !one_link.is_empty() {
        let (child, link) = match server {
            Some(addr) => {
                let w = make_worker(s.mode, None)?;
                (
                    None,
                    engine::connect(&w, addr, &addr.to_string(), s.peer_timeout)?,
                )
            }
            None => {
                let c = ChildServer::spawn(None, s)?;
                let l = c.connect(None, s.mode)?;
                (Some(c), l)
            }
        };
        for sec in one_link {
            gap();
            section(&link, s, a.quick, sec, &list)?;
        }
        engine::client_finish(link);
        if let Some(c) = child {
            c.finish(Duration::from_secs(5))?;
        }
    }
    if sections.contains(&Section::MbwMr) {
        gap();
        if server.is_none() {
            multi_pair(a.pairs, &list, a.quick, s)?;
        } else {
            println!(
                "# {}: needs --local (one server process per pair)",
                Section::MbwMr.test().1
            );
        }
    }
    Ok(())
}

/// `--pairs`' default: one pair for every two CPUs this process may run on (a server
/// process and a client thread each poll without pause), at least one.
pub fn default_pairs() -> usize {
    params::affinity().map_or(1, |c| (c.len() / 2).clamp(1, MAX_PAIRS))
}

/// What one pair measured at one point of the multi-pair test: its messages, over how
/// long, ending when.
#[derive(Clone, Copy, Debug)]
struct Span {
    msgs: f64,
    secs: f64,
    end: Instant,
}

impl Span {
    /// The span of a row of `p`, a window test, that ended at `end`.
    fn of(r: &Row, p: &Params, end: Instant) -> Span {
        let msgs = r.iters as f64 * p.window.max(1) as f64;
        let secs = if r.mr_overall > 0.0 {
            msgs / r.mr_overall
        } else {
            0.0
        };
        Span { msgs, secs, end }
    }
}

/// osu_mbw_mr: `pairs` client threads, each with its own worker and server process,
/// running osu_bw's windows at once; the messages of all pairs over the time from the
/// first pair's start to the last one's end (as osu_mbw_mr divides by its one window, so
/// that a pair that ran while the others were still warming up adds no rate it did not
/// share). The pairs share the CPUs: no side is pinned, whatever `-c` says.
fn multi_pair(pairs: usize, list: &[usize], quick: bool, s: &Settings) -> CliResult<()> {
    let list = list.to_vec();
    let (test, title, _) = Section::MbwMr.test();
    // Each window waits for the receiver's ack, so a pair whose processes wait for a CPU
    // waits a scheduler time slice a window: the rate then measures the scheduler.
    if let Ok(cpus) = params::affinity()
        && 2 * pairs > cpus.len()
    {
        eprintln!(
            "courier perf: note: --pairs {pairs} runs {} polling processes and threads on \
                 {} CPUs: they take turns, so the multi-pair rate shows the scheduler's time \
                 slices rather than Courier (--pairs {} fits)",
            2 * pairs,
            cpus.len(),
            default_pairs()
        );
    }
    let free = Settings {
        out: Output::Silent,
        thousands: false,
        percentile: 50.0,
        cpus: vec![],
        start_cpus: s.start_cpus.clone(),
        mode: courier::ThreadMode::Single,
        peer_timeout: s.peer_timeout,
        threads: 1,
        local_server: true,
    };
    let servers = (0..pairs)
        .map(|_| ChildServer::spawn(None, &free))
        .collect::<CliResult<Vec<_>>>()?;
    let barrier = Arc::new(Barrier::new(pairs));
    let (tx, rx) = mpsc::channel::<(usize, CliResult<Span>)>();
    // Each pair's transport once it is connected (None: it could not connect).
    let (ready_tx, ready_rx) = mpsc::channel::<Option<&'static str>>();
    let mut handles = Vec::new();
    for srv in &servers {
        let port = srv.port;
        let (barrier, tx, ready_tx, list) =
            (barrier.clone(), tx.clone(), ready_tx.clone(), list.clone());
        let quiet = free.clone();
        handles.push(std::thread::spawn(move || {
            let go = || -> CliResult<Link> {
                if !quiet.start_cpus.is_empty() {
                    params::set_affinity(&quiet.start_cpus)?;
                }
                let w = make_worker(courier::ThreadMode::Single, None)?;
                engine::connect(
                    &w,
                    SocketAddr::from(([127, 0, 0, 1], port)),
                    &format!("127.0.0.1:{port}"),
                    quiet.peer_timeout,
                )
            };
            let link = go();
            let _ = ready_tx.send(link.as_ref().ok().and_then(|l| l.ep.transport()));
            drop(ready_tx);
            for (i, &size) in list.iter().enumerate() {
                barrier.wait();
                let r = match &link {
                    Ok(l) => {
                        let mut p = params(test, size, quick);
                        p.iters = mbw_rounds(size, quick);
                        run_test(l, &p, &quiet, None).map(|r| Span::of(&r, &p, Instant::now()))
                    }
                    Err(e) => Err(CliError::run(e.msg.clone())),
                };
                let _ = tx.send((i, r));
            }
            if let Ok(l) = link {
                engine::client_finish(l);
            }
        }));
    }
    drop(tx);
    drop(ready_tx);
    let mut used: Vec<&str> = Vec::new();
    for t in ready_rx.iter().take(pairs) {
        let t = t.unwrap_or("?");
        if !used.contains(&t) {
            used.push(t);
        }
    }
    println!(
        "# OSU-style {title} (courier {}, {pairs} pairs, {} processes, transport {})",
        test.name(),
        pairs * 2,
        used.join(",")
    );
    println!(
        "# [ pairs: {pairs} ] [ window size: {} ]",
        window_note(&list)
    );
    println!("# Size{:>20}{:>18}", "MB/s", "Messages/s");
    let mut rows: Vec<Vec<Span>> = vec![Vec::new(); list.len()];
    let mut failure = None;
    let mut printed = 0;
    for (i, r) in rx {
        match r {
            Ok(row) => rows[i].push(row),
            Err(e) => failure = Some(e),
        }
        while printed < list.len() && rows[printed].len() == pairs {
            let size = list[printed];
            let mr = aggregate_rate(&rows[printed]);
            println!("{size:<10} {:>13.2} {:>17.2}", mr * size as f64 / 1e6, mr);
            printed += 1;
        }
    }
    for h in handles {
        let _ = h.join();
    }
    for s in servers {
        let _ = s.finish(Duration::from_secs(5));
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Messages per second of pairs that each measured a span: all their messages over the
/// time from the earliest start to the latest end.
fn aggregate_rate(spans: &[Span]) -> f64 {
    let spans: Vec<(Instant, Instant, f64)> = spans
        .iter()
        .filter(|s| s.secs > 0.0)
        .filter_map(|s| {
            let took = Duration::try_from_secs_f64(s.secs).ok()?;
            Some((s.end.checked_sub(took).unwrap_or(s.end), s.end, s.msgs))
        })
        .collect();
    let (Some(first), Some(last)) = (
        spans.iter().map(|s| s.0).min(),
        spans.iter().map(|s| s.1).max(),
    ) else {
        return 0.0;
    };
    let secs = (last - first).as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    spans.iter().map(|s| s.2).sum::<f64>() / secs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two pairs that ran one after the other share no time: together they send at the
    /// rate of one, not the sum of their rates; pairs that ran together add up.
    #[test]
    fn multi_pair_rate_is_over_the_shared_span() {
        // 10 windows of 100 messages in 1 s.
        let row = Row {
            iters: 10,
            mr_overall: 1000.0,
            ..Row::default()
        };
        let mut p = params(TestKind::TagWinBw, 8, true);
        p.window = 100;
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let span = |end| Span::of(&row, &p, end);
        assert_eq!(span(t0).msgs, 1000.0);
        // The second pair after the first.
        let apart = [span(t0 + s), span(t0 + 2 * s)];
        assert!((aggregate_rate(&apart) - 1000.0).abs() < 1e-6);
        let together = [span(t0 + s), span(t0 + s)];
        assert!((aggregate_rate(&together) - 2000.0).abs() < 1e-6);
        assert_eq!(aggregate_rate(&[]), 0.0);
        // A rate so small its span has no duration is left out, not a panic.
        let slow = Row {
            mr_overall: 1e-300,
            ..row
        };
        assert_eq!(aggregate_rate(&[Span::of(&slow, &p, t0)]), 0.0);
    }

    #[test]
    fn sweep_sizes_and_counts() {
        assert_eq!(sizes(16), vec![1, 2, 4, 8, 16]);
        assert_eq!(sizes(16 << 20).len(), 25);
        assert_eq!(window(8), 64);
        assert_eq!(window(16 << 20), 4);
        assert!(lat_iters(16 << 20).0 >= 10);
    }

    fn args(v: &[&str]) -> PerfArgs {
        use clap::{CommandFactory, FromArgMatches};
        #[derive(clap::Parser)]
        struct Cmd {
            #[command(flatten)]
            a: PerfArgs,
        }
        let m = Cmd::command().get_matches_from(std::iter::once("perf").chain(v.iter().copied()));
        let mut a = Cmd::from_arg_matches(&m).expect("parsed").a;
        a.given = super::super::given_ids(&m);
        a
    }

    #[test]
    fn options_the_sweep_ignores_are_refused() {
        for v in [
            &[
                "--local",
                "--sweep",
                "--max-size",
                "1m",
                "--pairs",
                "1",
                "--quick",
            ][..],
            &["--local", "--sweep", "-c", "0", "-M", "multi"],
            &["--sweep", "10.0.0.1", "-p", "4000"],
            &["--local", "--sweep", "--max-size", "1g", "--pairs", "64"],
        ] {
            assert!(check_args(&args(v)).is_ok(), "{v:?}");
        }
        use Section::*;
        for (t, want) in [
            ("osu_latency", vec![Latency]),
            ("bw,osu_latency", vec![Latency, Bw]),
            ("OSU_BIBW, mbw_mr", vec![Bibw, MbwMr]),
        ] {
            let v = ["--local", "--sweep", "-t", t];
            assert_eq!(check_args(&args(&v)).unwrap().0, want, "{t}");
        }
        assert_eq!(
            check_args(&args(&["--sweep", "h", "-t", "osu_bw"]))
                .unwrap()
                .0,
            vec![Bw]
        );
        for (v, want) in [
            (
                &["--local", "--sweep", "-n", "10"][..],
                "-n cannot be used with --sweep",
            ),
            (
                &["--sweep", "h", "-s", "8"],
                "-s cannot be used with --sweep",
            ),
            (&["--local", "--sweep", "--json"], "--json cannot be used"),
            (
                &["--local", "--sweep", "-t", "tag_lat"],
                "-t tag_lat: with --sweep, -t names OSU benchmarks",
            ),
            (&["--local", "--sweep", "-t", "bw,"], "separated by commas"),
            (
                &["--sweep", "h", "-t", "osu_mbw_mr"],
                "-t osu_mbw_mr: the multi-pair test runs with --local only",
            ),
            (
                &["--sweep", "h", "--pairs", "2"],
                "--pairs 2: the multi-pair test runs with --local only",
            ),
            (
                &["--local", "--sweep", "--max-size", "2g"],
                "--max-size 2g: at most 1073741824",
            ),
            (
                &["--local", "--sweep", "h"],
                "HOST cannot be used with --local --sweep",
            ),
            (
                &["--local", "--sweep", "-p", "1"],
                "-p cannot be used with --local --sweep",
            ),
        ] {
            let e = check_args(&args(v)).unwrap_err();
            assert_eq!(e.code, 2, "{v:?}");
            assert!(e.msg.contains(want), "{v:?}: {}", e.msg);
        }
    }

    #[test]
    fn headers_name_the_window_of_every_size() {
        assert_eq!(
            window_note(&sizes(16 << 20)),
            "64 (1 B .. 1 MiB), 32 (2 MiB), 16 (4 MiB), 8 (8 MiB), 4 (16 MiB)"
        );
        assert_eq!(window_note(&sizes(64)), "64 (1 B .. 64 B)");
        assert_eq!(window_note(&[1]), "64 (1 B)");
    }

    /// Bytes one sweep point moves (measured and warm-up, both ways for latency and
    /// bi-directional tests; `pairs` pairs for the multi-pair test).
    fn volume(test: TestKind, size: usize, pairs: u64) -> u64 {
        let p = params(test, size, false);
        let w = p.window as u64;
        let size = size as u64;
        match test {
            TestKind::TagLat => p.total() * size * 2,
            TestKind::TagBibw => p.total() * w * size * 2,
            _ if pairs > 0 => (mbw_rounds(size as usize, false) + p.warmup) * w * size * pairs,
            _ => p.total() * w * size,
        }
    }

    /// The sweep goes to 16 MiB, every section included, and the large sizes move no more
    /// than the middle ones: the counts shrink as the size grows.
    #[test]
    fn the_sweep_reaches_16_mib_and_stays_short() {
        let list = sizes(16 << 20);
        assert_eq!(list.last(), Some(&(16 << 20)));
        let mut total = 0;
        for (test, pairs) in [
            (TestKind::TagLat, 0),
            (TestKind::TagWinBw, 0),
            (TestKind::TagBibw, 0),
            (TestKind::TagWinBw, 2),
        ] {
            for &size in &list {
                let v = volume(test, size, pairs);
                assert!(
                    v <= 1200 << 20,
                    "{} {size} B{}: {} MiB",
                    test.name(),
                    if pairs > 0 { " (pairs)" } else { "" },
                    v >> 20
                );
                total += v;
            }
            // Past 1 MiB the message counts shrink as the size grows.
            let msgs = |size: usize| {
                let p = params(test, size, false);
                match (test, pairs) {
                    (TestKind::TagLat, _) => p.iters,
                    (_, 0) => p.iters * p.window as u64,
                    _ => mbw_rounds(size, false) * p.window as u64,
                }
            };
            assert!(msgs(16 << 20) < msgs(1 << 20), "{}", test.name());
        }
        // 20.8 GiB: a few seconds over shared memory. (Before the multi-pair test went past
        // 4 MiB the sweep moved 20.9 GiB: the smaller floor of the bandwidth test pays for
        // the 8 and 16 MiB points.)
        assert!(
            total < 22 << 30,
            "the whole sweep moves {} MiB",
            total >> 20
        );
    }
}
