//! Measurement and ucx_perftest-shaped output.

use super::clock::Instant;
use std::io::Write;
use std::time::Duration;

use super::clock::ticks_to_ns;
use super::hist::TickHist;

use super::params::{MemKind, Params, TestKind};

/// How results are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// The full table with a row about once a second.
    Table,
    /// Header box, then one row of numbers (`-f`).
    FinalOnly,
    /// CSV (`-v`): the column names, then a row about once a second and the final one.
    Csv,
    /// CSV with `-f`: the column names and the final row only.
    CsvFinal,
    /// One JSON object (`--json`).
    Json,
    /// Nothing (the numbers are used by the caller).
    Silent,
}

impl Output {
    /// Whether the rows printed about once a second appear (ucx_perftest leaves them out
    /// with `-f`, CSV included).
    pub fn prints_progress(self) -> bool {
        matches!(self, Output::Table | Output::Csv)
    }
}

/// One reported row.
#[derive(Clone, Copy, Debug, Default)]
pub struct Row {
    /// Iterations so far.
    pub iters: u64,
    /// Warm-up iterations run before the measured ones, as the test loop counted them.
    pub warmup: u64,
    /// Percentile latency (usec).
    pub lat_pct: f64,
    /// Average latency since the previous row (usec).
    pub lat_avg: f64,
    /// Overall latency (usec).
    pub lat_overall: f64,
    /// Bandwidth since the previous row (MB/s, 2^20).
    pub bw_avg: f64,
    /// Overall bandwidth.
    pub bw_overall: f64,
    /// Message rate since the previous row.
    pub mr_avg: f64,
    /// Overall message rate.
    pub mr_overall: f64,
}

const RULE: &str = "+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+";
/// The rule above the column groups (latency, bandwidth, message rate), which spans each.
const GROUP_RULE: &str = "+--------------+--------------+------------------------------+---------------------+-----------------------+";
/// The rule above and below the box that describes a test (as wide as the table).
fn box_rule() -> String {
    format!("+{}+\n", "-".repeat(106))
}

/// What the header box shows for a memory type: the name, and `(host fallback)` when the
/// library gave host memory instead.
pub fn mem_label(kind: MemKind, actual: Option<courier::MemoryType>) -> String {
    match (kind, actual) {
        (MemKind::Host, _) | (_, None) => kind.name().to_string(),
        (_, Some(courier::MemoryType::Host)) => format!("{} (host fallback)", kind.name()),
        _ => kind.name().to_string(),
    }
}

/// The header box and the column headers, as ucx_perftest prints them; `mem` are the
/// Send memory and Recv memory rows. With `-f` (`FinalOnly`) the column headers are
/// those of the table, the first column named "Test" instead of "Stage", so that the one
/// row under them keeps the table's column positions.
pub fn header(p: &Params, percentile: f64, out: Output, mem: &[String; 2]) -> String {
    match out {
        Output::Json | Output::Silent => String::new(),
        Output::Csv | Output::CsvFinal => csv_header(percentile, false),
        Output::Table | Output::FinalOnly => {
            let mut s = test_box(p, mem);
            s.push_str(&column_header(p.test, percentile, out == Output::FinalOnly));
            s
        }
    }
}

/// What ucx_perftest's server prints for each test: the box that describes it, closed by
/// a rule (its client prints the results).
pub fn server_box(p: &Params, mem: &[String; 2]) -> String {
    let mut s = test_box(p, mem);
    s.push_str(&box_rule());
    s
}

/// The box that describes the test, without a rule under it (the column headers or the
/// server's closing rule follow).
fn test_box(p: &Params, mem: &[String; 2]) -> String {
    let mut s = String::new();
    let line = |k: &str, v: &str| format!("| {k:<14}{v:<90} |\n");
    s.push_str(&box_rule());
    s.push_str(&line("API:", "protocol layer"));
    s.push_str(&line("Test:", p.test.description()));
    // ucx_perftest's protocol-layer tests always show "(automatic)" here (UCP picks the
    // layout), an IOV message included, and the message size is the whole message: the
    // sum of its IOV segments. It prints no window row.
    s.push_str(&line("Data layout:", "(automatic)"));
    s.push_str(&line("Send memory:", &mem[0]));
    s.push_str(&line("Recv memory:", &mem[1]));
    s.push_str(&line("Message size:", &p.msg_size().to_string()));
    if p.test.is_am() {
        // ucx_perftest 1.13.1 prints this row 16 characters short of the box; here it is
        // as wide as the others.
        s.push_str(&format!("| {:<104} |\n", "AM header size: 0"));
    }
    s
}

/// The column headers of the table: "latency" or "overhead" per the test, and the first
/// column "Stage" (rows while running) or "Test" (`-f`: one row).
fn column_header(test: TestKind, percentile: f64, final_only: bool) -> String {
    let pct = pct_label(percentile);
    let mut s = String::new();
    s.push_str(GROUP_RULE);
    s.push('\n');
    s.push_str(&format!(
        "|              |              |       {:>8} (usec)        |   bandwidth (MB/s)  |  message rate (msg/s) |\n",
        test.lat_label()
    ));
    s.push_str(RULE);
    s.push('\n');
    s.push_str(&format!(
        "|    {:>5}     | # iterations |{:^10}| average | overall |  average |  overall |  average  |  overall  |\n",
        if final_only { "Test" } else { "Stage" },
        format!("{pct}%ile")
    ));
    s.push_str(RULE);
    s.push('\n');
    s
}

/// The CSV column names (`-v`), as ucx_perftest prints them; with `threads` (a `-T` run
/// of several threads) a first column says whose row it is: the thread's number, or
/// `final` for the aggregated row (`format_aggregate`).
pub fn csv_header(percentile: f64, threads: bool) -> String {
    format!(
        "{}iterations,{}_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n",
        if threads { "thread," } else { "" },
        pct_label(percentile)
    )
}

fn pct_label(p: f64) -> String {
    let s = format!("{p:.1}");
    if (s.parse::<f64>().unwrap_or(p) - p).abs() > 1e-9 {
        format!("{p}")
    } else {
        s
    }
}

/// A whole number, with thousands separators if asked (`-N`).
pub fn group(n: f64, thousands: bool) -> String {
    let s = format!("{:.0}", n);
    if !thousands {
        return s;
    }
    let (sign, digits) = if let Some(d) = s.strip_prefix('-') {
        ("-", d)
    } else {
        ("", s.as_str())
    };
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    format!("{sign}{out}")
}

/// One row as text (`label` = `[thread 0]`, `Final:`, or None for `-f`).
pub fn format_row(label: Option<&str>, r: &Row, out: Output, thousands: bool) -> String {
    match out {
        Output::Csv | Output::CsvFinal => format!(
            "{},{:.3},{:.3},{:.3},{:.2},{:.2},{:.0},{:.0}\n",
            r.iters,
            r.lat_pct,
            r.lat_avg,
            r.lat_overall,
            r.bw_avg,
            r.bw_overall,
            r.mr_avg,
            r.mr_overall
        ),
        _ => {
            // As ucx_perftest's row: each number after a space, so that one wider than its
            // column (a 64 MiB message's latency in usec) pushes the row right instead of
            // running into its neighbour.
            let nums = format!(
                " {:>13} {:>10.3} {:>9.3} {:>9.3} {:>11.2} {:>10.2} {:>11} {:>11}",
                group(r.iters as f64, thousands),
                r.lat_pct,
                r.lat_avg,
                r.lat_overall,
                r.bw_avg,
                r.bw_overall,
                group(r.mr_avg, thousands),
                group(r.mr_overall, thousands)
            );
            // Without a label (`-f`) the label's columns stay, blank: the numbers sit
            // under the column headers, where ucx_perftest puts them.
            format!("{:<14}{nums}\n", label.unwrap_or(""))
        }
    }
}

/// The result of a `-T` run, as ucx_perftest aggregates its threads: the iterations of
/// thread 0, the average of the threads' overall latencies, and the sums of their overall
/// bandwidths and message rates. (The "average" columns and the percentile have no
/// meaning across threads; ucx_perftest leaves them out of this row.)
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Aggregate {
    /// Iterations (of thread 0; every thread runs as many).
    pub iters: u64,
    /// Mean of the threads' overall latency (usec).
    pub lat_overall: f64,
    /// Sum of the threads' overall bandwidth (MB/s, 2^20).
    pub bw_overall: f64,
    /// Sum of the threads' overall message rate.
    pub mr_overall: f64,
}

impl Aggregate {
    /// Aggregate the final rows of the threads, thread 0 first.
    pub fn of(rows: &[Row]) -> Aggregate {
        let n = rows.len().max(1) as f64;
        Aggregate {
            iters: rows.first().map_or(0, |r| r.iters),
            lat_overall: rows.iter().map(|r| r.lat_overall).sum::<f64>() / n,
            bw_overall: rows.iter().map(|r| r.bw_overall).sum(),
            mr_overall: rows.iter().map(|r| r.mr_overall).sum(),
        }
    }
}

/// The final row of a `-T` run as ucx_perftest prints it for several threads: four
/// numbers (iterations, latency, bandwidth, message rate), labelled `Final:` in the table,
/// the label's columns blank with `-f`. In CSV (`-v`) it has the columns of the thread rows (`csv_header` with
/// threads): `final` in the thread column, the four numbers in the iterations and
/// "overall" columns, and the columns that have no meaning across threads (percentile,
/// averages) empty.
pub fn format_aggregate(a: &Aggregate, out: Output, thousands: bool) -> String {
    match out {
        Output::Csv | Output::CsvFinal => format!(
            "final,{},,,{:.3},,{:.2},,{:.0}\n",
            a.iters, a.lat_overall, a.bw_overall, a.mr_overall
        ),
        Output::Table | Output::FinalOnly => {
            let nums = format!(
                "{:>18} {:>29.3} {:>22.2} {:>23}",
                group(a.iters as f64, thousands),
                a.lat_overall,
                a.bw_overall,
                group(a.mr_overall, thousands)
            );
            let label = if out == Output::Table { "Final:" } else { "" };
            format!("{label:<10}{nums}\n")
        }
        Output::Json | Output::Silent => String::new(),
    }
}

/// The final result as one JSON object.
pub fn json(p: &Params, percentile: f64, r: &Row, transport: Option<&str>) -> serde_json::Value {
    serde_json::json!({
        "test": p.test.name(),
        "message_size": p.msg_size(),
        "iov": p.sizes,
        "window": p.window,
        "check": p.check,
        "iterations": r.iters,
        "warmup_iterations": r.warmup,
        "percentile": percentile,
        "latency_percentile_us": r.lat_pct,
        "latency_avg_us": r.lat_avg,
        "latency_overall_us": r.lat_overall,
        "bandwidth_avg_mbs": r.bw_avg,
        "bandwidth_overall_mbs": r.bw_overall,
        "msgrate_avg": r.mr_avg,
        "msgrate_overall": r.mr_overall,
        "transport": transport,
    })
}

/// Something that wants to see rows while the test runs (the `--local` live display).
pub type Watch<'a> = &'a mut dyn FnMut(&Row);

/// Collects per-iteration samples and prints rows about once a second.
pub struct Meter<'w> {
    /// Samples of the rows printed so far, and of the row being collected.
    all: TickHist,
    interval: TickHist,
    quantile: f64,
    /// Divide samples by this for the latency columns (2 for ping-pong).
    lat_div: f64,
    /// Messages per iteration for the rate columns.
    msgs_per_iter: f64,
    size: f64,
    start: Instant,
    last: Instant,
    /// When the next row is due.
    next: Instant,
    last_iters: u64,
    iters: u64,
    /// Warm-up iterations the loop ran before `begin`.
    warmup: u64,
    out: Output,
    thousands: bool,
    period: Duration,
    watch: Option<Watch<'w>>,
    /// The thread whose rows these are (`-T`: `Some(k)`, its rows are labelled in CSV too
    /// and its final row is left to the aggregate).
    thread: Option<usize>,
}

impl<'w> Meter<'w> {
    /// A meter for `p`.
    pub fn new(
        p: &Params,
        percentile: f64,
        out: Output,
        thousands: bool,
        watch: Option<Watch<'w>>,
    ) -> Meter<'w> {
        let (lat_div, msgs_per_iter) = match p.test {
            t if t.is_pingpong() => (2.0, 2.0),
            TestKind::TagBibw => (p.window as f64 * 2.0, p.window as f64 * 2.0),
            TestKind::TagWinBw => (p.window as f64, p.window as f64),
            _ => (1.0, 1.0),
        };
        let now = Instant::now();
        Meter {
            all: TickHist::default(),
            interval: TickHist::default(),
            quantile: (percentile / 100.0).clamp(0.0, 1.0),
            lat_div,
            msgs_per_iter,
            size: p.msg_size() as f64,
            start: now,
            last: now,
            next: now + Duration::from_secs(1),
            last_iters: 0,
            iters: 0,
            warmup: 0,
            out,
            thousands,
            period: Duration::from_secs(1),
            watch,
            thread: None,
        }
    }

    /// The meter of thread `k` of a `-T` run: its rows say `[thread k]` (CSV rows have `k`
    /// in a first column of their own), and `finish` prints nothing (one aggregated row
    /// follows).
    pub fn for_thread(mut self, k: usize) -> Self {
        self.thread = Some(k);
        self
    }

    /// Start measuring at `now`, after `warmup` warm-up iterations (the loop's own count,
    /// reported in the row).
    pub fn begin(&mut self, now: Instant, warmup: u64) {
        self.warmup = warmup;
        self.start = now;
        self.last = now;
        self.next = now + self.period;
    }

    /// One measured iteration that began at `began` and ended at `now`.
    #[inline]
    pub fn record(&mut self, now: Instant, began: Instant) {
        self.interval.record(now.ticks_since(began));
        self.iters += 1;
        if now >= self.next {
            self.report(now);
        }
    }

    fn row(&self, now: Instant, h: &TickHist) -> Row {
        let dt = now.duration_since(self.last).as_secs_f64().max(1e-12);
        let total = now.duration_since(self.start).as_secs_f64().max(1e-12);
        let di = (self.iters - self.last_iters) as f64;
        let ti = self.iters as f64;
        let mr_avg = di * self.msgs_per_iter / dt;
        let mr_overall = ti * self.msgs_per_iter / total;
        let per = |t: f64, n: f64| {
            if n > 0.0 {
                t * 1e6 / n / self.lat_div
            } else {
                0.0
            }
        };
        Row {
            iters: self.iters,
            warmup: self.warmup,
            lat_pct: ticks_to_ns(h.quantile(self.quantile)) / 1000.0 / self.lat_div,
            lat_avg: per(dt, di),
            lat_overall: per(total, ti),
            bw_avg: mr_avg * self.size / (1u64 << 20) as f64,
            bw_overall: mr_overall * self.size / (1u64 << 20) as f64,
            mr_avg,
            mr_overall,
        }
    }

    /// A row printed while the test runs: `[thread k]` and the numbers in the table; in
    /// CSV the numbers, after the thread's number in a column of its own for a thread of
    /// a `-T` run (`csv_header` with threads).
    fn progress_text(&self, r: &Row) -> String {
        let label = format!("[thread {}]", self.thread.unwrap_or(0));
        let mut text = format_row(Some(&label), r, self.out, self.thousands);
        if let Some(k) = self.thread
            && self.out == Output::Csv
        {
            text.insert_str(0, &format!("{k},"));
        }
        text
    }

    fn report(&mut self, now: Instant) {
        let r = self.row(now, &self.interval);
        if self.out.prints_progress() {
            let text = self.progress_text(&r);
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(text.as_bytes());
            let _ = o.flush();
        }
        if let Some(w) = self.watch.as_mut() {
            w(&r);
        }
        self.all.merge(&self.interval);
        self.interval.reset();
        self.last = now;
        self.next = now + self.period;
        self.last_iters = self.iters;
    }

    /// The final row (over the whole measured run), printed per the output mode.
    pub fn finish(&mut self, now: Instant) -> Row {
        // "average" of the final row covers the time since the previous row.
        self.all.merge(&self.interval);
        self.interval.reset();
        let mut r = self.row(now, &self.all);
        if self.iters == self.last_iters {
            r.lat_avg = r.lat_overall;
            r.bw_avg = r.bw_overall;
            r.mr_avg = r.mr_overall;
        }
        let text = match self.out {
            _ if self.thread.is_some() => String::new(),
            Output::Table => format_row(Some("Final:"), &r, self.out, self.thousands),
            Output::Csv | Output::CsvFinal | Output::FinalOnly => {
                format_row(None, &r, self.out, self.thousands)
            }
            Output::Json | Output::Silent => String::new(),
        };
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(text.as_bytes());
        let _ = o.flush();
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Params {
        Params {
            test: TestKind::TagLat,
            sizes: vec![64],
            iters: 10,
            warmup: 0,
            window: 1,
            check: false,
            mem: [MemKind::Host; 2],
        }
    }

    fn host2() -> [String; 2] {
        ["host".to_string(), "host".to_string()]
    }

    #[test]
    fn memory_rows() {
        let mem = [
            mem_label(MemKind::Nic, Some(courier::MemoryType::Host)),
            mem_label(MemKind::Host, Some(courier::MemoryType::Host)),
        ];
        let h = header(&params(), 50.0, Output::FinalOnly, &mem);
        assert!(h.contains("| Send memory:  nic (host fallback) "), "{h}");
        assert!(h.contains("| Recv memory:  host "), "{h}");
        assert!(h.lines().all(|l| l.len() == 108), "{h}");
    }

    #[test]
    fn iov_header_shows_the_total_size_and_no_window() {
        let mut p = params();
        p.test = TestKind::TagBw;
        p.sizes = vec![64, 64];
        p.window = 32;
        for out in [Output::Table, Output::FinalOnly] {
            let h = header(&p, 50.0, out, &host2());
            assert!(h.contains("| Message size: 128 "), "{h}");
            assert!(h.contains("| Data layout:  (automatic) "), "{h}");
            assert!(!h.contains("Window"), "{h}");
            assert!(!h.contains("64,64"), "{h}");
            assert!(h.lines().all(|l| l.len() == 108), "{h}");
        }
    }

    #[test]
    fn final_only_csv_prints_no_progress_rows() {
        assert!(Output::Table.prints_progress());
        assert!(Output::Csv.prints_progress());
        for out in [
            Output::CsvFinal,
            Output::FinalOnly,
            Output::Json,
            Output::Silent,
        ] {
            assert!(!out.prints_progress(), "{out:?}");
        }
        assert!(
            header(&params(), 50.0, Output::CsvFinal, &host2())
                .starts_with("iterations,50.0_percentile_lat,avg_lat")
        );
        let r = Row {
            iters: 10,
            ..Row::default()
        };
        assert_eq!(
            format_row(None, &r, Output::CsvFinal, false),
            "10,0.000,0.000,0.000,0.00,0.00,0,0\n"
        );
    }

    #[test]
    fn the_aggregate_of_threads_is_ucx_perftests() {
        let row = |iters, lat, bw, mr| Row {
            iters,
            lat_overall: lat,
            bw_overall: bw,
            mr_overall: mr,
            ..Row::default()
        };
        let a = Aggregate::of(&[
            row(1000, 2.0, 10.0, 100000.0),
            row(1000, 4.0, 30.0, 300000.0),
        ]);
        assert_eq!(
            a,
            Aggregate {
                iters: 1000,
                lat_overall: 3.0,
                bw_overall: 40.0,
                mr_overall: 400000.0
            }
        );
        let t = format_aggregate(&a, Output::Table, false);
        assert_eq!(
            t,
            format!(
                "Final:    {:>18} {:>29} {:>22} {:>23}\n",
                "1000", "3.000", "40.00", "400000"
            )
        );
        // The iterations end where the table's iterations column ends.
        let r = format_row(
            Some("Final:"),
            &row(1000, 0.0, 0.0, 0.0),
            Output::Table,
            false,
        );
        assert_eq!(t.find("1000"), r.find("1000"));
        // With -f the label's columns stay, blank (ucx_perftest's "%10s" of no name).
        assert_eq!(
            format_aggregate(&a, Output::FinalOnly, true),
            format!(
                "{:10}{:>18} {:>29} {:>22} {:>23}\n",
                "", "1,000", "3.000", "40.00", "400,000"
            )
        );
        assert_eq!(
            format_aggregate(&a, Output::CsvFinal, false),
            "final,1000,,,3.000,,40.00,,400000\n"
        );
        // As many columns as the header of a run with threads.
        assert_eq!(
            format_aggregate(&a, Output::Csv, false).split(',').count(),
            csv_header(50.0, true).split(',').count()
        );
    }

    /// With `-T`, CSV rows have the columns of the header: the thread, then the numbers;
    /// one thread's rows are the header's eight columns.
    #[test]
    fn csv_rows_have_the_columns_of_their_header() {
        let r = Row {
            iters: 10,
            ..Row::default()
        };
        let p = params();
        let m = Meter::new(&p, 50.0, Output::Csv, false, None).for_thread(1);
        let row = m.progress_text(&r);
        assert_eq!(row, "1,10,0.000,0.000,0.000,0.00,0.00,0,0\n");
        let cols = |l: &str| l.trim_end().split(',').count();
        assert_eq!(cols(&row), cols(&csv_header(50.0, true)));
        let agg = format_aggregate(&Aggregate::of(&[r]), Output::Csv, false);
        assert_eq!(cols(&agg), cols(&csv_header(50.0, true)));
        let m = Meter::new(&p, 50.0, Output::Csv, false, None);
        let row = m.progress_text(&r);
        assert_eq!(row, "10,0.000,0.000,0.000,0.00,0.00,0,0\n");
        assert_eq!(
            csv_header(50.0, false),
            "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n"
        );
        assert_eq!(cols(&row), cols(&csv_header(50.0, false)));
    }

    /// The protocol-layer atomics as ucx_perftest 1.13.1 describes them in the box (its
    /// help's shorter "latency / rate" is that of the transport-layer tests).
    #[test]
    fn atomic_descriptions_read_like_ucx_perftest() {
        assert_eq!(
            TestKind::Fadd.description(),
            "atomic fetch-and-add latency / bandwidth / rate"
        );
        assert_eq!(
            TestKind::Swap.description(),
            "atomic swap latency / bandwidth / rate"
        );
        assert_eq!(
            TestKind::Cswap.description(),
            "atomic compare-and-swap latency / bandwidth / rate"
        );
    }

    /// Streaming tests head their first column group "overhead", the others "latency";
    /// the active-message tests have an "AM header size" row; `-f` keeps the column
    /// headers (first column "Test") and puts its one row under them; the server's box is
    /// closed by a rule.
    #[test]
    fn column_headers_per_test_and_output() {
        let mut p = params();
        for (t, label) in [
            (TestKind::TagLat, "latency"),
            (TestKind::TagBw, "overhead"),
            (TestKind::TagSyncBw, "overhead"),
            (TestKind::AmBw, "overhead"),
            (TestKind::StreamBw, "overhead"),
            (TestKind::PutBw, "overhead"),
            (TestKind::Add, "overhead"),
            (TestKind::Get, "latency"),
            (TestKind::Fadd, "latency"),
            (TestKind::StreamLat, "latency"),
        ] {
            p.test = t;
            let h = header(&p, 50.0, Output::Table, &host2());
            let want = format!("|       {label:>8} (usec)        |");
            assert!(h.contains(&want), "{t:?}: {h}");
            assert!(h.lines().all(|l| l.len() == 108), "{h}");
            assert_eq!(h.contains("| AM header size: 0 "), t.is_am(), "{h}");
        }
        p.test = TestKind::AmLat;
        let h = header(&p, 50.0, Output::FinalOnly, &host2());
        let lines: Vec<&str> = h.lines().collect();
        assert_eq!(lines.len(), 13, "{h}");
        assert!(lines.iter().all(|l| l.len() == 108), "{h}");
        assert_eq!(lines[7], format!("| AM header size: 0{} |", " ".repeat(87)));
        assert_eq!(lines[8], GROUP_RULE);
        assert!(
            lines[11].starts_with("|     Test     | # iterations |"),
            "{h}"
        );
        assert!(
            header(&p, 50.0, Output::Table, &host2()).contains("|    Stage     | # iterations |")
        );
        let b = server_box(&p, &host2());
        assert!(b.starts_with(&h[..h.find(GROUP_RULE).unwrap_or(0)]), "{b}");
        assert_eq!(
            b.lines().last(),
            Some(format!("+{}+", "-".repeat(106)).as_str())
        );
        // The -f row: where the table's Final row has its numbers.
        let r = Row {
            iters: 20000,
            lat_pct: 0.04,
            ..Row::default()
        };
        let f = format_row(None, &r, Output::FinalOnly, false);
        let t = format_row(Some("Final:"), &r, Output::Table, false);
        assert_eq!(f, t.replacen("Final:", "      ", 1));
        assert_eq!(&f[..28], "                       20000");
    }

    #[test]
    fn table_shape_matches_ucx_perftest() {
        let h = header(&params(), 50.0, Output::Table, &host2());
        let lines: Vec<&str> = h.lines().collect();
        assert_eq!(lines[0].len(), 108);
        assert!(lines.iter().all(|l| l.len() == 108), "{h}");
        assert_eq!(
            lines[1],
            format!("| API:          protocol layer{} |", " ".repeat(76))
        );
        assert!(h.contains("| 50.0%ile |"));
        // Under the message size, the rule spans the column groups.
        assert_eq!(lines[7], GROUP_RULE);
        assert_eq!(lines[9], RULE);
        let r = Row {
            iters: 300000,
            lat_pct: 4.903,
            lat_avg: 4.962,
            lat_overall: 5.109,
            bw_avg: 12.30,
            bw_overall: 11.95,
            mr_avg: 201543.0,
            mr_overall: 195742.0,
            ..Row::default()
        };
        assert_eq!(
            format_row(Some("Final:"), &r, Output::Table, false),
            "Final:                300000      4.903     4.962     5.109       12.30      11.95      201543      195742\n"
        );
        let r = Row {
            iters: 96737,
            lat_pct: 4.908,
            lat_avg: 5.165,
            lat_overall: 5.165,
            bw_avg: 11.82,
            bw_overall: 11.82,
            mr_avg: 193615.0,
            mr_overall: 193615.0,
            ..Row::default()
        };
        assert_eq!(
            format_row(Some("[thread 0]"), &r, Output::Table, false),
            "[thread 0]             96737      4.908     5.165     5.165       11.82      11.82      193615      193615\n"
        );
        // A number wider than its column keeps a space before it, as in ucx_perftest's
        // row for 10 × 64 MiB over tcp: `Final:  10  8.373 128773.999 128773.999 ...`.
        let r = Row {
            iters: 10,
            lat_pct: 0.821,
            lat_avg: 219792.915,
            lat_overall: 219792.915,
            bw_avg: 291.18,
            bw_overall: 291.18,
            mr_avg: 5.0,
            mr_overall: 5.0,
            ..Row::default()
        };
        assert_eq!(
            format_row(Some("Final:"), &r, Output::Table, false),
            "Final:                    10      0.821 219792.915 219792.915      291.18     291.18           5           5\n"
        );
        assert_eq!(group(1234567.0, true), "1,234,567");
        assert_eq!(group(123.0, true), "123");
        assert!(
            header(&params(), 99.9, Output::Csv, &host2())
                .starts_with("iterations,99.9_percentile_lat,avg_lat")
        );
    }
}
