#!/usr/bin/env python3
"""Courier side-by-side benchmark: run plan, output parsing, aggregation, report and plots.

Python 3.11, standard library only.  Sub-commands:

  report.py plan [--quick]            print the run plan (one run description per line) for run.sh
  report.py build --work DIR --out DIR
                                      parse the runs listed in DIR/runs.tsv, write OUT/results/raw.json,
                                      OUT/RESULTS.md and OUT/results/*.svg
  report.py render --out DIR          re-render RESULTS.md and the plots from OUT/results/raw.json
  report.py ceilings FILE             print the ceilings tables (Markdown) from bench/ceilings.c's
                                      JSON lines in FILE
  report.py go FILE                   print the Go-against-native section (Markdown) from
                                      bindings/go/bench.sh's JSON lines in FILE
  report.py signal FILE               print the signaling-put section (Markdown) from
                                      bench/put_signal.sh's JSON lines in FILE
  report.py selftest                  check the parsers on canned outputs

Metric conventions (same as ucx_perftest's -f row):
  lat  = 50%ile latency in usec (one-way for ping-pong tests; per operation otherwise)
  bw   = overall bandwidth in MB/s where MB = 2^20 bytes
  mr   = overall message rate in msg/s
fi_pingpong prints decimal MB/s; it is converted to 2^20-byte MB/s here.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from xml.sax.saxutils import escape

KIB = 1024
MIB = 1024 * 1024

# ---------------------------------------------------------------------------------------------
# What to measure.  `metric` picks the number the ratio is computed on; `op` says which way is
# better; `fi` says whether a fi_pingpong run of the same size and transport is shown beside it.
# ---------------------------------------------------------------------------------------------
TARGETS = [
    dict(tls="shm", test="tag_lat", size=8, metric="lat", op="<=", target=0.8, fi=True),
    dict(tls="shm", test="tag_bw", size=8, metric="mr", op=">=", target=1.25, fi=False),
    dict(tls="shm", test="tag_bw", size=16 * MIB, metric="bw", op=">=", target=2.0, fi=True),
    dict(tls="shm", test="ucp_am_lat", size=8, metric="lat", op="<=", target=0.8, fi=False),
    dict(tls="shm", test="ucp_put_lat", size=8, metric="lat", op="<=", target=1.0, fi=False),
    dict(tls="shm", test="ucp_fadd", size=8, metric="lat", op="<=", target=1.0, fi=False),
    dict(tls="tcp", test="tag_lat", size=8, metric="lat", op="<=", target=1.0, fi=True),
    dict(tls="tcp", test="tag_bw", size=8, metric="mr", op=">=", target=3.0, fi=False),
    dict(tls="tcp", test="tag_bw", size=1 * MIB, metric="bw", op=">=", target=1.2, fi=True),
    dict(tls="tcp", test="ucp_put_bw", size=1 * MIB, metric="bw", op=">=", target=4.0, fi=False),
    dict(tls="tcp", test="ucp_get", size=1 * MIB, metric="bw", op=">=", target=4.0, fi=False),
    dict(tls="tcp", test="ucp_fadd", size=8, metric="lat", op="<=", target=0.8, fi=False),
]

# Iteration counts of the full run (BENCH_QUICK=1 divides them by 10).  Messages of up to 64 B
# on shm: 500k round trips, 2M streamed. Other small messages: 200k,
# except round-trip tests over TCP: 50k (a TCP round trip costs ~10x more, and on a loaded
# 2-core machine 200k TCP ping-pongs take 30-45 s each); 2000 for 1 MiB; 200 for 16 MiB.
# fi_pingpong is a reference column only and gets a quarter of them for large messages.
def target_iters(tls: str, size: int, tool: str = "", test: str = "pingpong") -> int:
    if size <= 64 * KIB:
        streaming = test.endswith("_bw")
        if tls == "shm" and size <= 64:
            # Tens of millions per second: fewer would time the first few milliseconds.
            return 2_000_000 if streaming else 500_000
        return 200_000 if tls == "shm" or streaming else 50_000
    n = 2_000 if size <= 1 * MIB else 200
    return n // 4 if tool == "fi" else n


def warmup_for(iters: int) -> int:
    return max(1, min(10_000, iters // 10))


SWEEP_SIZES = [4 ** k for k in range(13)]  # 1 B .. 16 MiB, powers of 4
SWEEP_TESTS = ["tag_lat", "tag_bw"]
SWEEP_TLS = ["shm", "tcp"]


def sweep_iters(tls: str, test: str, size: int) -> int:
    if test.endswith("_lat"):
        cap, volume, floor = 20_000, 256 << 20, 16  # up to 256 MiB moved each way
    else:
        cap, volume, floor = 100_000, 512 << 20, 32  # up to 512 MiB streamed
    if tls == "tcp":
        cap //= 2
    return max(floor, min(cap, volume // size))


WINDOWS = {"tag_bw": 32, "tag_sync_bw": 32, "ucp_put_bw": 32, "ucp_am_bw": 32}

METRIC_NAMES = {
    "lat": "50%ile latency (usec)",
    "bw": "overall bandwidth (MB/s)",
    "mr": "overall message rate (msg/s)",
}


def plan(quick: bool) -> list[str]:
    """Lines: kind tls test size iters warmup window tools(comma list)."""
    div = 10 if quick else 1
    lines = []
    fi_done = set()
    for t in TARGETS:
        n = max(10, target_iters(t["tls"], t["size"], "", t["test"]) // div)
        w = warmup_for(n)
        win = WINDOWS.get(t["test"], 1)
        lines.append(f"target {t['tls']} {t['test']} {t['size']} {n} {w} {win} courier,ucx")
        key = (t["tls"], t["size"])
        if t["fi"] and key not in fi_done:
            fi_done.add(key)
            nf = max(10, target_iters(t["tls"], t["size"], "fi") // div)
            lines.append(f"target {t['tls']} pingpong {t['size']} {nf} 0 1 fi")
    for tls in SWEEP_TLS:
        for test in SWEEP_TESTS:
            for size in SWEEP_SIZES:
                n = max(8, sweep_iters(tls, test, size) // div)
                w = max(1, min(1000, n // 10))
                lines.append(f"sweep {tls} {test} {size} {n} {w} {WINDOWS.get(test, 1)} courier,ucx")
    return lines


# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------
NUM = r"[-+]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|inf|nan)"
ROW8 = re.compile(r"^\s*(?:Final:|\[thread \d+\])?\s*((?:" + NUM + r"\s+){7}" + NUM + r")\s*$")
FIELDS8 = ["iterations", "lat_p50_us", "lat_avg_us", "lat_overall_us",
           "bw_avg_mbs", "bw_overall_mbs", "mr_avg", "mr_overall"]


def parse_row8(text: str) -> dict | None:
    """Last row of eight numbers (ucx_perftest / courier perf -f, optionally 'Final:'-labelled)."""
    found = None
    for line in text.splitlines():
        m = ROW8.match(line)
        if m:
            found = m.group(1)
    if found is None:
        return None
    vals = [float(x) for x in found.split()]
    # ucx_perftest prints "inf" for an average over an empty interval: keep JSON standard
    return {k: (v if math.isfinite(v) else None) for k, v in zip(FIELDS8, vals)}


def parse_courier_json(text: str) -> dict | None:
    obj = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                pass
    if obj is None:
        return None
    g = obj.get
    out = {
        "iterations": g("iterations"),
        "lat_p50_us": g("latency_percentile_us"),
        "lat_avg_us": g("latency_avg_us"),
        "lat_overall_us": g("latency_overall_us"),
        "bw_avg_mbs": g("bandwidth_avg_mbs"),
        "bw_overall_mbs": g("bandwidth_overall_mbs"),
        "mr_avg": g("msgrate_avg"),
        "mr_overall": g("msgrate_overall"),
    }
    if g("transport") is not None:
        out["courier_transport"] = g("transport")
    if g("window") is not None:
        out["window"] = g("window")
    return out


_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}


def _fi_count(tok: str) -> float:
    m = re.fullmatch(r"=?(" + NUM + r")([kmgKMG]?)", tok)
    if not m:
        return float("nan")
    return float(m.group(1)) * _SUFFIX[m.group(2).lower()]


def parse_fi(text: str) -> dict | None:
    """fi_pingpong: 'bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec' then one row."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.split()[:2] == ["bytes", "#sent"]:
            for row in lines[i + 1:]:
                f = row.split()
                if len(f) >= 8:
                    try:
                        mbs_dec = float(f[5])
                        usec = float(f[6])
                    except ValueError:
                        continue
                    return {
                        "iterations": _fi_count(f[1]),
                        "lat_p50_us": usec,  # fi_pingpong only has the mean; shown as latency
                        "lat_avg_us": usec,
                        "lat_overall_us": usec,
                        "bw_avg_mbs": mbs_dec * 1e6 / MIB,
                        "bw_overall_mbs": mbs_dec * 1e6 / MIB,
                        "mr_avg": 1e6 / usec if usec > 0 else None,
                        "mr_overall": 1e6 / usec if usec > 0 else None,
                        "fi_mbs_decimal": mbs_dec,
                        "fi_time": f[4],
                    }
    return None


def tail(path: str, n: int = 600) -> str:
    try:
        with open(path, "r", errors="replace") as fh:
            data = fh.read()
    except OSError:
        return ""
    return data[-n:]


def read(path: str) -> str:
    try:
        with open(path, "r", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


RUN_COLS = ["id", "kind", "tool", "tls", "test", "size", "rep", "iters", "warmup", "window",
            "rc", "elapsed_s", "port", "cmd", "out", "err", "srv_out", "srv_err", "env",
            "probe_before", "probe_after"]

# Two runs are "at one speed" when the machine-speed probes taken before and after each of
# them (a cache-line ping-pong's one-way time) are within this factor of one another. The
# machine's slow stretches triple that time; its run-to-run spread at one speed is ~20%.
SPEED_TOL = 1.5


def _float(x: str) -> float | None:
    try:
        v = float(x)
    except ValueError:
        return None
    return v if math.isfinite(v) and v > 0 else None


def parse_runs(work: str) -> list[dict]:
    runs = []
    path = os.path.join(work, "runs.tsv")
    for line in read(path).splitlines():
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) < len(RUN_COLS):
            cols += [""] * (len(RUN_COLS) - len(cols))
        r = dict(zip(RUN_COLS, cols))
        for k in ("size", "rep", "iters", "warmup", "window", "rc", "port"):
            try:
                r[k] = int(r[k])
            except ValueError:
                r[k] = None
        try:
            r["elapsed_s"] = float(r["elapsed_s"])
        except ValueError:
            r["elapsed_s"] = None
        probes = [_float(r["probe_before"]), _float(r["probe_after"])]
        out, err = read(r["out"]), read(r["err"])
        srv_err = read(r["srv_err"])
        nums = None
        if r["tool"] == "courier":
            nums = parse_courier_json(out) or parse_row8(out)
        elif r["tool"] == "ucx":
            nums = parse_row8(out)
        elif r["tool"] == "fi":
            nums = parse_fi(out)
        rc = r["rc"]
        unsupported = (r["tool"] == "courier" and (rc == 2 or "not supported" in err.lower()))
        if rc in (124, 137):
            status = "timeout"
        elif unsupported:
            status = "unsupported"
        elif rc == 0 and nums:
            status = "ok"
        else:
            status = "failed"
        rec = {
            "id": r["id"], "kind": r["kind"], "tool": r["tool"], "transport": r["tls"],
            "test": r["test"], "size": r["size"], "rep": r["rep"], "iters": r["iters"],
            "warmup": r["warmup"], "window": r["window"], "rc": rc, "status": status,
            "elapsed_s": r["elapsed_s"], "port": r["port"], "env": r["env"], "cmd": r["cmd"],
            "numbers": nums if status == "ok" else None,
            "probe_us": probes,
        }
        if status != "ok":
            msg = (err.strip() or out.strip())[-400:]
            if srv_err.strip():
                msg += " | server: " + srv_err.strip()[-200:]
            rec["message"] = msg
        runs.append(rec)
    return runs


# ---------------------------------------------------------------------------------------------
# Machine / version facts
# ---------------------------------------------------------------------------------------------
def sh(cmd: list[str], first_line: bool = True) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as e:
        return f"unavailable ({type(e).__name__})"
    text = (p.stdout or p.stderr).strip()
    if not text:
        return "unavailable"
    return text.splitlines()[0] if first_line else text


def collect_meta(work: str) -> dict:
    meta = {}
    for line in read(os.path.join(work, "meta.tsv")).splitlines():
        if "\t" in line:
            k, v = line.split("\t", 1)
            meta[k] = v
    cpu = "unknown"
    for line in read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    meta.setdefault("nproc", sh(["nproc"]))
    meta["cpu_model"] = cpu
    meta["kernel"] = sh(["uname", "-r"])
    meta["os"] = next((l.split("=", 1)[1].strip('"') for l in read("/etc/os-release").splitlines()
                       if l.startswith("PRETTY_NAME=")), "unknown")
    meta["ucx_version"] = sh(["ucx_info", "-v"])
    fi = sh(["fi_info", "--version"], first_line=False)
    meta["fi_version"] = "; ".join(fi.splitlines()) if fi else fi
    courier = meta.get("courier_bin", "courier")
    meta["courier_version"] = sh([courier, "info", "-v"])
    return meta


# ---------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------
# Decimals ucx_perftest prints for each metric (latency usec "%.3f", bandwidth MB/s "%.2f",
# message rate "%.0f"). Every tool's value is compared at that precision: Courier's JSON has
# more digits, and comparing 0.02003 against the 0.020 UCX printed for the same two clock
# steps would call equal numbers unequal. raw.json keeps the full values.
PRINTED_DECIMALS = {"lat": 3, "bw": 2, "mr": 0}


def metric_value(nums: dict, metric: str) -> float | None:
    key = {"lat": "lat_p50_us", "bw": "bw_overall_mbs", "mr": "mr_overall"}[metric]
    v = nums.get(key)
    if v is None:
        return None
    v = float(v)
    return round(v, PRINTED_DECIMALS[metric]) if math.isfinite(v) else v


def select(runs, kind, tool, tls, test, size):
    return [r for r in runs if r["kind"] == kind and r["tool"] == tool and r["transport"] == tls
            and r["test"] == test and r["size"] == size]


def summarize(sel: list[dict], metric: str) -> dict:
    vals = [metric_value(r["numbers"], metric) for r in sel if r["status"] == "ok"]
    vals = [v for v in vals if v is not None and math.isfinite(v)]
    statuses = sorted({r["status"] for r in sel})
    out = {"n": len(vals), "runs": len(sel), "statuses": statuses, "values": vals}
    if vals:
        out["median"] = statistics.median(vals)
        out["min"] = min(vals)
        out["max"] = max(vals)
    return out


def fmt_num(v: float | None, metric: str) -> str:
    if v is None:
        return "—"
    if metric == "mr":
        return f"{v:,.0f}"
    if metric == "bw":
        return f"{v:,.1f}" if v >= 100 else f"{v:.2f}"
    return f"{v:.3f}" if v < 10 else f"{v:,.1f}"


def fmt_size(n: int) -> str:
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB} MiB"
    if n >= KIB and n % KIB == 0:
        return f"{n // KIB} KiB"
    return f"{n} B"


def fmt_size_short(n: int) -> str:
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB}M"
    if n >= KIB and n % KIB == 0:
        return f"{n // KIB}K"
    return str(n)


def cell(s: dict, metric: str) -> str:
    if "median" not in s:
        if not s["runs"]:
            return "not run"
        if "unsupported" in s["statuses"]:
            return "not supported yet"
        return "/".join(s["statuses"]) or "—"
    txt = fmt_num(s["median"], metric)
    if s["n"] > 1:
        txt += f" <sub>({fmt_num(s['min'], metric)}–{fmt_num(s['max'], metric)}, n={s['n']})</sub>"
    extra = [st for st in s["statuses"] if st != "ok"]
    if extra:
        txt += f" <sub>[{s['runs'] - s['n']} {'/'.join(extra)}]</sub>"
    return txt


def paired_ratios(cs: list[dict], us: list[dict], metric: str,
                  ref: float | None = None) -> list[tuple[float, bool, bool]]:
    """Courier / UCX for each repetition where both ran, whether the pair ran at one speed
    (`one_speed`), and whether at full speed (`at_full_speed`, against the probe `ref`).
    The two runs of a repetition are next to each other in time, so they mostly share the
    machine's state, where the two medians may not (a median of 9 reports whichever speed
    held more runs)."""
    def by_rep(sel):
        out = {}
        for r in sel:
            v = metric_value(r["numbers"], metric) if r["status"] == "ok" else None
            if v is not None and math.isfinite(v):
                out[r["rep"]] = (v, r)
        return out
    c, u = by_rep(cs), by_rep(us)
    return [(c[k][0] / u[k][0], one_speed(c[k][1], u[k][1]), at_full_speed(ref, c[k][1], u[k][1]))
            for k in sorted(c) if k in u and u[k][0]]


def probes_of(*runs: dict) -> list[float | None]:
    """The speed probes before and after each of these runs (None where none was taken)."""
    return [p for r in runs for p in (r.get("probe_us") or [None, None])]


def full_speed_ref(runs: list[dict]) -> float | None:
    """The probe value of the machine at full speed in this run: the 10th percentile of all
    probes (a few are faster still, when the two vCPUs share a core)."""
    ps = sorted(p for p in probes_of(*runs) if p is not None)
    return ps[len(ps) // 10] if ps else None


def probes_agree(ps: list[float | None]) -> bool:
    """Whether there are probes, every one was taken, and all are within SPEED_TOL of one
    another."""
    return bool(ps) and all(p is not None for p in ps) and max(ps) <= SPEED_TOL * min(ps)


def one_speed(*runs: dict) -> bool:
    """Whether every speed probe before and after these runs was taken, and all are within
    SPEED_TOL of one another."""
    return probes_agree(probes_of(*runs))


def judge(same: list[float], every: list[float], fallback: float | None) -> tuple[float | None, str]:
    """The value a section's verdict is taken on: the median of the one-speed comparisons
    when there are MIN_JUDGED_PAIRS of them, else of all, else `fallback` (the medians')."""
    if len(same) >= MIN_JUDGED_PAIRS:
        return statistics.median(same), "one-speed pairs"
    if len(every) >= MIN_JUDGED_PAIRS:
        return statistics.median(every), "all pairs"
    return fallback, "medians"


def at_full_speed(ref: float | None, *runs: dict) -> bool:
    """Whether every probe around these runs is within SPEED_TOL of full speed (`ref`)."""
    ps = probes_of(*runs)
    return ref is not None and bool(ps) and all(p is not None and p <= SPEED_TOL * ref for p in ps)


def median_n(v: list[float]) -> tuple[float | None, int]:
    return (statistics.median(v), len(v)) if v else (None, 0)


# Fewest pairs a verdict is taken from (see `target_rows`).
MIN_JUDGED_PAIRS = 3


def target_rows(runs: list[dict]) -> list[dict]:
    rows = []
    ref = full_speed_ref(runs)
    for t in TARGETS:
        cs = select(runs, "target", "courier", t["tls"], t["test"], t["size"])
        us = select(runs, "target", "ucx", t["tls"], t["test"], t["size"])
        c = summarize(cs, t["metric"])
        u = summarize(us, t["metric"])
        pairs = paired_ratios(cs, us, t["metric"], ref)
        paired = statistics.median([x for x, _, _ in pairs]) if pairs else None
        same = [x for x, one, _ in pairs if one]
        paired_same = statistics.median(same) if same else None
        by_speed = {"fast": median_n([x for x, one, full in pairs if one and full]),
                    "slow": median_n([x for x, one, full in pairs if one and not full])}
        f = (summarize(select(runs, "target", "fi", t["tls"], "pingpong", t["size"]), t["metric"])
             if t["fi"] else None)
        ratio = None
        if "median" in c and "median" in u and u["median"]:
            ratio = c["median"] / u["median"]
        # Judged on the pairs that ran at one speed when there are enough of them, else on
        # all pairs, else (no pair) on the ratio of medians.
        judged, judged_on = judge(same, [x for x, _, _ in pairs], ratio)
        if judged is not None:
            ok = judged <= t["target"] if t["op"] == "<=" else judged >= t["target"]
            verdict = "PASS" if ok else "MISS"
        elif "unsupported" in c["statuses"] and "median" not in c:
            verdict = "not supported yet"
        elif not u["runs"]:
            verdict = "no UCX"
        elif "median" not in u:
            verdict = "UCX failed"
        elif "median" not in c:
            verdict = "Courier failed"
        else:
            verdict = "—"
        rows.append(dict(t, courier=c, ucx=u, fi=f, ratio=ratio, paired=paired,
                         pairs=len(pairs), paired_same=paired_same, pairs_same=len(same),
                         judged=judged, judged_on=judged_on, verdict=verdict,
                         by_speed=by_speed))
    return rows


def probe_summary(runs: list[dict]) -> str:
    """One paragraph on the machine's speed during the run, from the probes."""
    ps = [p for p in probes_of(*runs) if p is not None]
    if not ps:
        return "No speed probes were taken in this run (no C compiler, or `BENCH_NO_PROBE=1`)."
    ps.sort()
    mid = statistics.median(ps)
    slow = sum(p > SPEED_TOL * mid for p in ps)
    fast = sum(p * SPEED_TOL < mid for p in ps)
    return (f"Speed probes (cache-line ping-pong between the two CPUs, one-way): {len(ps)} taken, "
            f"{ps[0]:.3f}–{ps[-1]:.3f} us, median {mid:.3f}; {slow} more than {SPEED_TOL}× the "
            f"median (the machine's slow stretches), {fast} less than the median / {SPEED_TOL}.")


def sweep_series(runs: list[dict]) -> dict:
    """{(tls, test, tool): [(size, median)]} with metric lat for *_lat and bw for *_bw."""
    series = {}
    for tls in SWEEP_TLS:
        for test in SWEEP_TESTS:
            metric = "lat" if test.endswith("_lat") else "bw"
            for tool in ("courier", "ucx"):
                pts = []
                for size in SWEEP_SIZES:
                    s = summarize(select(runs, "sweep", tool, tls, test, size), metric)
                    pts.append((size, s.get("median"), s))
                series[(tls, test, tool)] = pts
    return series


# ---------------------------------------------------------------------------------------------
# SVG plots (stdlib only): log2 x axis, log10 y axis, lines with markers, legend
# ---------------------------------------------------------------------------------------------
COLORS = {"courier": "#d62728", "ucx": "#1f77b4"}
LABELS = {"courier": "Courier", "ucx": "UCX ucx_perftest"}
MARKERS = {"courier": "circle", "ucx": "square"}


def _nice_ticks(lo: float, hi: float) -> list[float]:
    e0, e1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    mult = [1] if e1 - e0 > 3 else [1, 2, 5]
    ticks = []
    for e in range(e0, e1 + 1):
        for m in mult:
            v = m * 10.0 ** e
            if lo <= v <= hi:
                ticks.append(v)
    return ticks


def _fmt_tick(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:g}M"
    if v >= 1e4:
        return f"{v / 1e3:g}K"
    return f"{v:g}"


def svg_plot(path: str, title: str, ylabel: str, series: dict[str, list[tuple[int, float]]]) -> None:
    W, H = 760, 470
    L, R, T, B = 80, 30, 50, 60
    pw, ph = W - L - R, H - T - B
    xs = [s for pts in series.values() for s, v in pts if v]
    ys = [v for pts in series.values() for s, v in pts if v and v > 0]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="Helvetica, Arial, sans-serif" font-size="12">',
           f'<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="24" text-anchor="middle" font-size="16" font-weight="bold">'
           f'{escape(title)}</text>']
    if not ys:
        out.append(f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">no data</text></svg>')
        with open(path, "w") as fh:
            fh.write("\n".join(out) + "\n")
        return
    x_lo, x_hi = math.log2(min(xs)), math.log2(max(xs))
    if x_hi == x_lo:
        x_hi += 1
    y_lo = 10 ** math.floor(math.log10(min(ys)))
    y_hi = 10 ** math.ceil(math.log10(max(ys)))
    if y_hi <= y_lo:
        y_hi = y_lo * 10
    ly_lo, ly_hi = math.log10(y_lo), math.log10(y_hi)

    def px(x):
        return L + (math.log2(x) - x_lo) / (x_hi - x_lo) * pw

    def py(y):
        return T + ph - (math.log10(y) - ly_lo) / (ly_hi - ly_lo) * ph

    # grid and ticks
    for v in _nice_ticks(y_lo, y_hi):
        y = py(v)
        out.append(f'<line x1="{L}" y1="{y:.1f}" x2="{L + pw}" y2="{y:.1f}" stroke="#e0e0e0"/>')
        out.append(f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt_tick(v)}</text>')
    for s in sorted(set(xs)):
        x = px(s)
        out.append(f'<line x1="{x:.1f}" y1="{T}" x2="{x:.1f}" y2="{T + ph}" stroke="#eeeeee"/>')
        out.append(f'<text x="{x:.1f}" y="{T + ph + 16}" text-anchor="middle">{fmt_size_short(s)}</text>')
    out.append(f'<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="none" stroke="black"/>')
    out.append(f'<text x="{L + pw / 2}" y="{H - 16}" text-anchor="middle">message size (bytes, log scale)</text>')
    out.append(f'<text x="18" y="{T + ph / 2}" text-anchor="middle" '
               f'transform="rotate(-90 18 {T + ph / 2})">{escape(ylabel)} (log scale)</text>')
    # series
    for i, (tool, pts) in enumerate(series.items()):
        col = COLORS.get(tool, "#333333")
        good = [(s, v) for s, v in pts if v and v > 0]
        if len(good) > 1:
            d = " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in good)
            out.append(f'<polyline points="{d}" fill="none" stroke="{col}" stroke-width="2"/>')
        for s, v in good:
            if MARKERS.get(tool) == "square":
                out.append(f'<rect x="{px(s) - 3.5:.1f}" y="{py(v) - 3.5:.1f}" width="7" height="7" fill="{col}"/>')
            else:
                out.append(f'<circle cx="{px(s):.1f}" cy="{py(v):.1f}" r="3.5" fill="{col}"/>')
        # legend
        lx, ly = L + 14, T + 16 + i * 20
        out.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 26}" y2="{ly}" stroke="{col}" stroke-width="2"/>')
        out.append(f'<text x="{lx + 32}" y="{ly + 4}">{escape(LABELS.get(tool, tool))}</text>')
    out.append("</svg>")
    with open(path, "w") as fh:
        fh.write("\n".join(out) + "\n")


# ---------------------------------------------------------------------------------------------
# RESULTS.md
# ---------------------------------------------------------------------------------------------
def render(doc: dict, outdir: str) -> None:
    runs, meta = doc["runs"], doc["meta"]
    resdir = os.path.join(outdir, "results")
    os.makedirs(resdir, exist_ok=True)
    rows = target_rows(runs)
    series = sweep_series(runs)
    have_ucx = meta.get("have_ucx", "1") == "1"
    have_fi = meta.get("have_fi", "1") == "1"

    plots = []
    for tls in SWEEP_TLS:
        for test, name, ylabel in (("tag_lat", "latency", "50%ile one-way latency (usec)"),
                                   ("tag_bw", "bandwidth", "bandwidth (MB/s, 2^20 B)")):
            data = {tool: [(s, v) for s, v, _ in series[(tls, test, tool)]] for tool in ("courier", "ucx")}
            if not any(v for pts in data.values() for _, v in pts):
                continue
            fname = f"{name}_{tls}.svg"
            svg_plot(os.path.join(resdir, fname), f"{test} {name} vs message size — {tls}", ylabel, data)
            plots.append((fname, f"{test} {name}, {tls}"))

    L = []
    L.append("# Courier vs UCX — side-by-side benchmarks\n")
    L.append("Generated by `make bench` (`bench/run.sh` → `bench/report.py`). "
             "Raw runs: [`results/raw.json`](results/raw.json).\n")
    L.append(f"- Date: {meta.get('date_start', '?')} → {meta.get('date_end', '?')} "
             f"(wall time {meta.get('duration', '?')})")
    L.append(f"- Machine: {meta.get('nproc', '?')} CPUs, {meta.get('cpu_model', '?')}; "
             f"kernel {meta.get('kernel', '?')}; {meta.get('os', '?')}; load average "
             f"{meta.get('loadavg_start', '?')} at the start, {meta.get('loadavg_end', '?')} at the end")
    L.append(f"- Courier: `{meta.get('courier_version', '?')}`")
    L.append(f"- UCX: `{meta.get('ucx_version', '?')}`" + ("" if have_ucx else " — **not available**"))
    L.append(f"- libfabric: `{meta.get('fi_version', '?')}`" + ("" if have_fi else " — **not available**"))
    L.append(f"- Settings: {meta.get('reps', '?')} repetitions per target test "
             f"(`BENCH_REPS`), sweeps {meta.get('sweep_reps', '?')} repetition(s) per point, "
             f"quick mode {'on' if meta.get('quick') == '1' else 'off'} (`BENCH_QUICK`); "
             f"server pinned to CPU {meta.get('server_cpu', '?')}, client to CPU "
             f"{meta.get('client_cpu', '?')} (`taskset`); Courier and ucx_perftest alternate run by run.")
    L.append("- Transports: **shm** = both defaults (Courier without `COURIER_TLS`, UCX without "
             "`UCX_TLS`; UCX picks its own shared-memory/CMA lanes); **tcp** = `COURIER_TLS=tcp` vs "
             "`UCX_TLS=tcp`. fi_pingpong uses `-p shm -e rdm` / `-p tcp -e rdm -d lo`.")
    if meta.get("install_note"):
        L.append(f"- Install: {meta['install_note']}")
    if not have_ucx:
        L.append("\n> **UCX (`ucx_perftest`) could not be installed on this machine; only Courier "
                 "numbers are shown and no ratios are computed.**")
    L.append("")

    m = re.search(r"\d+\.\d+(?:\.\d+)?", meta.get("ucx_version", ""))
    L.append(f"## Targets (Courier / UCX {m.group(0) if m else ''}, same machine, same run)\n")
    L.append("Medians over repetitions, with (min–max, n) below. Latency rows use the 50%ile latency "
             "(usec; `*_lat` are one-way, RTT/2; `ucp_fadd` is per operation); bandwidth rows the "
             "overall bandwidth (MB/s, 2^20 B); message-rate rows the overall message rate (msg/s). "
             "Every value is taken at the precision ucx_perftest prints (3 decimals of usec, 2 of "
             "MB/s, whole msg/s), Courier's JSON included, so equal clock readings compare equal "
             "(`results/raw.json` keeps the full values). "
             "Ratio = Courier / UCX: lower is better for latency, higher for bandwidth and message rate. "
             "fi_pingpong is a ping-pong (its usec/xfer is one-way; its bandwidth is ping-pong bandwidth, "
             "not a windowed stream), shown for reference only. *Paired* is the median of the "
             "repetitions' own ratios (each of a Courier run and the UCX run next to it in time): "
             "where it and the ratio of medians differ much, the machine changed speed during the "
             "run (see the analysis below). *One speed* is that median over the pairs whose four "
             "speed probes (a cache-line ping-pong between the two CPUs, before and after each "
             f"run) lie within a factor {SPEED_TOL} of one another, so that both tools ran on the "
             "same machine. **The result is judged on the one-speed pairs** when there are at "
             f"least {MIN_JUDGED_PAIRS}, else on all pairs, else on the ratio of medians; the "
             "value judged is in the Result column.\n")
    L.append("| Transport | Test | Size | Metric | Courier | UCX | fi_pingpong | Ratio | Paired | One speed | Target | Result |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        fi = cell(r["fi"], r["metric"]) if r["fi"] is not None else "—"
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "—"
        paired = f"{r['paired']:.2f} <sub>(n={r['pairs']})</sub>" if r.get("paired") is not None else "—"
        same = (f"{r['paired_same']:.2f} <sub>(n={r['pairs_same']})</sub>"
                if r.get("paired_same") is not None else "—")
        verdict = f"**{r['verdict']}**" if r["verdict"] in ("PASS", "MISS") else r["verdict"]
        if r["verdict"] in ("PASS", "MISS") and r.get("judged") is not None:
            verdict += f" <sub>({r['judged']:.2f}, {r['judged_on']})</sub>"
        L.append(f"| {r['tls']} | {r['test']} | {fmt_size(r['size'])} | {METRIC_NAMES[r['metric']]} | "
                 f"{cell(r['courier'], r['metric'])} | {cell(r['ucx'], r['metric'])} | {fi} | {ratio} | {paired} | "
                 f"{same} | {r['op']} {r['target']} | {verdict} |")
    n_pass = sum(r["verdict"] == "PASS" for r in rows)
    n_miss = sum(r["verdict"] == "MISS" for r in rows)
    n_uns = sum(r["verdict"] == "not supported yet" for r in rows)
    L.append(f"\n{n_pass} PASS, {n_miss} MISS, {n_uns} not supported yet by Courier, "
             f"{len(rows) - n_pass - n_miss - n_uns} other.\n")
    L.append(probe_summary(runs) + "\n")
    if full_speed_ref(runs) is not None:
        L.append("The one-speed pairs by the machine's speed (shown, not judged): *full speed* "
                 f"has all four probes within {SPEED_TOL}× of the run's full-speed probe (its "
                 "10th percentile); the rest ran in a slow stretch.\n")
        L.append("| Transport | Test | Size | Full speed | Slow stretch |")
        L.append("|---|---|---|---|---|")
        for r in rows:
            cells = []
            for k in ("fast", "slow"):
                v, n = r["by_speed"][k]
                cells.append(f"{v:.2f} <sub>(n={n})</sub>" if v is not None else "—")
            L.append(f"| {r['tls']} | {r['test']} | {fmt_size(r['size'])} | {cells[0]} | {cells[1]} |")
        L.append("")

    # transports Courier actually used
    used = {}
    for r in runs:
        if r["tool"] == "courier" and r["numbers"] and r["numbers"].get("courier_transport"):
            used.setdefault(r["transport"], set()).add(r["numbers"]["courier_transport"])
    if used:
        L.append("Transport Courier reported using: " +
                 "; ".join(f"{k} runs → {', '.join(sorted(v))}" for k, v in sorted(used.items())) + ".\n")

    L.append("## Size sweeps (OSU style)\n")
    L.append("`tag_lat` (50%ile one-way latency, usec) and `tag_bw` (overall bandwidth, MB/s, window 32) "
             "for message sizes 1 B .. 16 MiB in powers of 4; iterations shrink with size. "
             "Median over the sweep repetitions.\n")
    for tls in SWEEP_TLS:
        L.append(f"### {tls}\n")
        L.append("| Size | Courier lat (us) | UCX lat (us) | lat ratio | Courier bw (MB/s) | UCX bw (MB/s) | bw ratio |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|")
        for i, size in enumerate(SWEEP_SIZES):
            cl = series[(tls, "tag_lat", "courier")][i]
            ul = series[(tls, "tag_lat", "ucx")][i]
            cb = series[(tls, "tag_bw", "courier")][i]
            ub = series[(tls, "tag_bw", "ucx")][i]

            def v(p, m):
                return fmt_num(p[1], m) if p[1] is not None else ("—" if not p[2]["runs"] else "/".join(p[2]["statuses"]))

            lr = f"{cl[1] / ul[1]:.2f}" if cl[1] and ul[1] else "—"
            br = f"{cb[1] / ub[1]:.2f}" if cb[1] and ub[1] else "—"
            L.append(f"| {fmt_size(size)} | {v(cl, 'lat')} | {v(ul, 'lat')} | {lr} | "
                     f"{v(cb, 'bw')} | {v(ub, 'bw')} | {br} |")
        L.append("")
    if plots:
        L.append("## Plots\n")
        for fname, cap in plots:
            L.append(f"![{cap}](results/{fname})\n")

    bad = [r for r in runs if r["status"] not in ("ok", "unsupported")]
    uns = sorted({(r["transport"], r["test"]) for r in runs if r["status"] == "unsupported"})
    L.append("## Run log\n")
    L.append(f"{len(runs)} runs: {sum(r['status'] == 'ok' for r in runs)} ok, "
             f"{sum(r['status'] == 'unsupported' for r in runs)} not supported by Courier yet "
             f"({', '.join(f'{a}/{b}' for a, b in uns) or 'none'}), "
             f"{sum(r['status'] == 'failed' for r in runs)} failed, "
             f"{sum(r['status'] == 'timeout' for r in runs)} timed out.\n")
    if bad:
        L.append("| Tool | Transport | Test | Size | Rep | Status | rc | Message |")
        L.append("|---|---|---|---|---|---|---|---|")
        for r in bad[:60]:
            msg = (r.get("message") or "").replace("|", "\\|").replace("\n", " ")[-200:]
            L.append(f"| {r['tool']} | {r['transport']} | {r['test']} | {fmt_size(r['size'] or 0)} | "
                     f"{r['rep']} | {r['status']} | {r['rc']} | {msg} |")
        if len(bad) > 60:
            L.append(f"\n… and {len(bad) - 60} more (see raw.json).")
        L.append("")
    L.append("Caveats: the machine is small and shared, so single numbers are noisy; the medians and "
             "the min–max spread are what to read. UCX's \"default\" shared-memory transport is whatever "
             "UCX 1.13.1 selects with `UCX_TLS` unset.")
    with open(os.path.join(outdir, "RESULTS.md"), "w") as fh:
        fh.write("\n".join(L) + "\n")


# ---------------------------------------------------------------------------------------------
# Ceilings: what the machine allows with no library (bench/ceilings.c)
# ---------------------------------------------------------------------------------------------
CEILING_ROWS = {
    "tcp_stream x1 system": "TCP loopback stream, 1 connection, the system's congestion control",
    "tcp_stream x1 reno": "TCP loopback stream, 1 connection, reno",
    "tcp_stream x2 system": "TCP loopback stream, 2 connections, the system's congestion control",
    "tcp_stream x2 reno": "TCP loopback stream, 2 connections, reno",
    "memcpy_1proc": "memcpy of 16 MiB, one process",
    "cma_read": "process_vm_readv (CMA) of 16 MiB from another process",
    "memcpy_split_2proc": "16 MiB copied through shared memory, half by each of two processes",
}


def render_ceilings(lines: list[str]) -> str:
    """The ceilings tables from bench/ceilings.c's JSON lines (one per measurement)."""
    bw: dict[str, list[float]] = {}
    rtts: dict[str, list[float]] = {"tcp_pingpong": [], "shm_pingpong": [], "shm_pingpong_gap": []}
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if d.get("what") in rtts:
            if d.get("rtt_us") is not None:
                rtts[d["what"]].append(d["rtt_us"])
            continue
        if d.get("mbs") is None:
            continue
        key = d["what"]
        if key == "tcp_stream":
            key = f"tcp_stream x{d['conns']} {d.get('cc', 'system')}"
        bw.setdefault(key, []).append(d["mbs"])
    out = ["", "## Ceilings of this machine (no library, `bench/ceilings.c`)", ""]
    out.append("What the kernel and the memory allow, measured in the same run: the targets are judged "
               "against these. TCP runs busy-poll non-blocking sockets on both sides, as the libraries do.")
    out.append("")
    out += ["| measurement | MB/s (median, MB = 2^20 B) | runs |", "|---|---|---|"]
    for k, label in CEILING_ROWS.items():
        if k in bw:
            v = bw[k]
            out.append(f"| {label} | {statistics.median(v):.0f} | {', '.join(f'{x:.0f}' for x in v)} |")
    if any(rtts.values()):
        out += ["", "| measurement | round trip (us, median) | one-way (us) | runs (round trip) |",
                "|---|---|---|---|"]
    rtt_rows = [
        ("tcp_pingpong", "TCP loopback ping-pong, 8 B, one connection", 2),
        ("shm_pingpong", "shared-memory ping-pong, 8 B, two cache lines, bare loads (mean of 2M)", 3),
        ("shm_pingpong_gap", "the same, a gap between two looks (Courier's `poll_gap`)", 3),
    ]
    for key, label, digits in rtt_rows:
        if rtts[key]:
            m = statistics.median(rtts[key])
            out.append(f"| {label} | {m:.{digits}f} | {m / 2:.{digits}f} | "
                       f"{', '.join(f'{x:.{digits}f}' for x in rtts[key])} |")
    return "\n".join(out) + "\n"


def render_go(lines: list[str]) -> str:
    """The Go-against-native section from bindings/go/bench.sh's JSON lines (NATIVE=1): each
    point is judged as `target_rows` judges Courier against UCX, on the median of the
    repetitions whose four speed probes agree (Go / native bandwidth, Go - native latency)
    when there are MIN_JUDGED_PAIRS of them, else on all repetitions, else on the medians."""
    rows: dict[int, dict] = {}
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue
        rows.setdefault(int(d.get("size", 0)), {})[d.get("impl")] = d
    out = ["", "## Go bindings against native (active messages, same machine, same run)", ""]
    out.append("Medians of the repetitions, and each repetition's own comparison (a Go run and "
               "the native run next to it in time): over all repetitions, and over those whose "
               "four speed probes agree (*one speed*). The result is judged on the one-speed "
               f"repetitions when there are {MIN_JUDGED_PAIRS}, else on all, else on the medians.")
    out += ["", "| size | metric | Go | native | medians | paired, all | paired, one speed (n) "
            "| judged on | target | result |", "|---|---|---|---|---|---|---|---|---|---|"]
    for size in sorted(rows):
        g, n = rows[size].get("go"), rows[size].get("native")
        if not g or not n:
            continue
        lat = size <= 64
        key = "latency_us" if lat else "bandwidth_mbs"
        gm, nm = g.get(key), n.get(key)
        if gm is None or not nm:
            continue
        cmp = (lambda a, b: a - b) if lat else (lambda a, b: a / b)
        gv, nv = n.get("go_values") or [], n.get("native_values") or []
        probes = n.get("probes") or []
        allp, same = [], []
        for i, (a, b) in enumerate(zip(gv, nv)):
            if a is None or not b:
                continue
            c = cmp(a, b)
            allp.append(c)
            if probes_agree(probes[i] if i < len(probes) else []):
                same.append(c)
        med = cmp(gm, nm)
        judged, on = judge(same, allp, med)
        if lat:
            f = lambda v: f"{v:+.3f} us"
            ok = judged <= 0.3
            head = f"| {size} B | one-way latency (us) | {gm:.3f} | {nm:.3f} |"
            target = "<= +0.3 us"
        else:
            f = lambda v: f"{v:.3f}"
            ok = judged >= 0.95
            head = f"| {size >> 20} MiB | bandwidth (MB/s) | {gm:.0f} | {nm:.0f} |"
            target = ">= 0.95"
        one = f"{f(statistics.median(same))} ({len(same)})" if same else "—"
        every = f(statistics.median(allp)) if allp else "—"
        out.append(f"{head} {f(med)} | {every} | {one} | {on} | {target} | {'PASS' if ok else 'MISS'} |")
    return "\n".join(out) + "\n"


SIGNAL_TESTS = ("ucp_put_lat", "put_signal_lat", "put_flush_signal_lat")
# Issue 3's targets: put_signal_lat / ucp_put_lat and put_signal_lat / put_flush_signal_lat.
SIGNAL_TARGETS = (("ucp_put_lat", 1.10), ("put_flush_signal_lat", 0.50))


def render_signal(lines: list[str]) -> str:
    """The signaling-put section from bench/put_signal.sh's JSON lines. Each ratio is judged
    on the averages (the 50%ile moves in clock steps of an eighth of a put): the median of
    the repetitions' own ratios over those whose probes agree when there are
    MIN_JUDGED_PAIRS, else over all, else the ratio of the medians."""
    runs: dict[tuple[str, str], dict[int, dict]] = {}
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and d.get("test") in SIGNAL_TESTS:
            runs.setdefault((d.get("tls", "shm"), d["test"]), {})[d.get("rep", 0)] = d

    def values(tls, test, key):
        return [d[key] for d in runs.get((tls, test), {}).values() if d.get(key) is not None]

    def med(tls, test, key):
        v = values(tls, test, key)
        return statistics.median(v) if v else None

    out = ["", "## Signaling put (Courier only, same run)", ""]
    out.append("One-way latency of 8 B (usec): the median over the repetitions of each run's 50%ile "
               "and of its average. `put_flush_signal_lat` is a put, a flush and a separate atomic "
               "swap of the signal, as open OpenSHMEM implementations do it. Issue 3's targets are "
               "for shared memory, where a same-host peer's stores are direct and a flush is a "
               "fence; over tcp a flush waits for the target's answer.")
    out += ["", "| transport | test | 50%ile | average | runs (average) |", "|---|---|---|---|---|"]
    for tls in ("shm", "tcp"):
        for t in SIGNAL_TESTS:
            p50, avg = med(tls, t, "latency_us"), med(tls, t, "latency_avg_us")
            if p50 is None and avg is None:
                continue
            fmt = lambda v: "—" if v is None else f"{v:.3f}"
            out.append(f"| {tls} | {t} | {fmt(p50)} | {fmt(avg)} | "
                       f"{', '.join(f'{x:.4f}' for x in values(tls, t, 'latency_avg_us'))} |")
    out.append("")
    out.append("The ratios are of the averages, judged on the repetitions' own ratios (the runs "
               "of a repetition are next to each other in time) over those whose four speed "
               f"probes agree when there are {MIN_JUDGED_PAIRS}, else over all, else on the "
               "medians; the ratio of the 50%iles' medians is shown beside them.")
    out += ["", "| transport | ratio | paired, one speed (n) | paired, all | medians | 50%iles | "
            "judged on | target | result |", "|---|---|---|---|---|---|---|---|---|"]
    for tls in ("shm", "tcp"):
        sig = runs.get((tls, "put_signal_lat"), {})
        for base, target in SIGNAL_TARGETS:
            other = runs.get((tls, base), {})
            allp, same = [], []
            for rep, a in sig.items():
                b = other.get(rep)
                if not b or a.get("latency_avg_us") is None or not b.get("latency_avg_us"):
                    continue
                r = a["latency_avg_us"] / b["latency_avg_us"]
                allp.append(r)
                if one_speed(a, b):
                    same.append(r)
            ms, mb = med(tls, "put_signal_lat", "latency_avg_us"), med(tls, base, "latency_avg_us")
            ps50, pb50 = med(tls, "put_signal_lat", "latency_us"), med(tls, base, "latency_us")
            medians = ms / mb if ms is not None and mb else None
            judged, on = judge(same, allp, medians)
            if judged is None:
                continue
            fmt = lambda v: "—" if v is None else f"{v:.2f}"
            tail = "" if tls == "shm" else " (for reference)"
            out.append(
                f"| {tls} | put_signal_lat / {base} | "
                f"{fmt(statistics.median(same)) + f' ({len(same)})' if same else '—'} | "
                f"{fmt(statistics.median(allp)) if allp else '—'} | {fmt(medians)} | "
                f"{fmt(ps50 / pb50 if ps50 is not None and pb50 else None)} | {on} | "
                f"<= {target:.2f}{tail} | {'PASS' if judged <= target else 'MISS'} |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# Self test of the parsers
# ---------------------------------------------------------------------------------------------
def selftest() -> None:
    ucx = """+----+
|     Test     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |
+--------------+
                       20000      0.256     0.380     0.380       20.05      20.05     2628463     2628463
"""
    r = parse_row8(ucx)
    assert r and r["iterations"] == 20000 and r["lat_p50_us"] == 0.256 and r["mr_overall"] == 2628463, r
    r = parse_row8("Final:                300000      4.903     4.962     5.109       12.30      11.95      201543      195742\n")
    assert r and r["bw_overall_mbs"] == 11.95, r
    r = parse_row8("        64  22549.883       inf 74645.532        0.00     214.35           0          13\n")
    assert r and r["lat_p50_us"] == 22549.883 and r["lat_avg_us"] is None, r
    cj = '{"bandwidth_avg_mbs":9.0,"bandwidth_overall_mbs":9.1,"iterations":20000,"latency_avg_us":0.8,' \
         '"latency_overall_us":0.8,"latency_percentile_us":0.647,"msgrate_avg":1.0,"msgrate_overall":2.0,' \
         '"transport":"shm","window":1}'
    r = parse_courier_json("noise\n" + cj + "\n")
    assert r and r["lat_p50_us"] == 0.647 and r["courier_transport"] == "shm", r
    # Compared at the precision ucx_perftest prints: two clock steps read 0.02003 in
    # Courier's JSON and 0.020 in UCX's row are the same number.
    assert metric_value({"lat_p50_us": 0.02003}, "lat") == metric_value({"lat_p50_us": 0.020}, "lat")
    assert metric_value({"lat_p50_us": 0.0206}, "lat") == 0.021
    assert metric_value({"mr_overall": 21902450.4}, "mr") == 21902450
    assert metric_value({"bw_overall_mbs": 11.954}, "bw") == 11.95
    assert metric_value({"lat_p50_us": None}, "lat") is None
    fi = """bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec
1m      100     =100     200m        0.12s   1750.24     599.10       0.00
"""
    r = parse_fi(fi)
    assert r and r["lat_p50_us"] == 599.10 and abs(r["bw_overall_mbs"] - 1750.24e6 / MIB) < 1e-6, r
    assert r["iterations"] == 100
    assert parse_fi("bytes   #sent\n") is None
    assert len(plan(False)) > 0 and len(plan(True)) == len(plan(False))
    c = render_ceilings([
        '{"what": "tcp_stream", "conns": 1, "cc": "reno", "mbs": 9000}',
        '{"what": "tcp_stream", "conns": 1, "mbs": 4000}',
        '{"what": "tcp_pingpong", "conns": 1, "rtt_us": 7.0, "oneway_us": 3.5}',
        '{"what": "shm_pingpong", "conns": 0, "rtt_us": 0.125, "oneway_us": 0.0625}',
        '{"what": "shm_pingpong_gap", "conns": 0, "rtt_us": 0.0569, "oneway_us": 0.0284}',
        "not json",
    ])
    assert "two cache lines, bare loads (mean of 2M) | 0.125 | 0.062 |" in c, c
    assert "a gap between two looks (Courier's `poll_gap`) | 0.057 | 0.028 | 0.057 |" in c, c
    assert "| TCP loopback stream, 1 connection, reno | 9000 | 9000 |" in c, c
    assert "the system's congestion control | 4000 |" in c, c
    assert "| TCP loopback ping-pong, 8 B, one connection | 7.00 | 3.50 |" in c, c

    def run(tool, rep, lat, status="ok", probes=(0.05, 0.05)):
        return {"tool": tool, "rep": rep, "status": status, "numbers": {"lat_p50_us": lat},
                "probe_us": list(probes)}
    cs = [run("courier", 1, 0.13), run("courier", 2, 0.33), run("courier", 3, 0.14, "failed")]
    us = [run("ucx", 1, 0.26), run("ucx", 2, 0.30, probes=(0.05, 0.2)), run("ucx", 3, 0.15)]
    pr = paired_ratios(cs, us, "lat")
    assert [(round(x, 3), ok) for x, ok, _ in pr] == [(0.5, True), (1.1, False)], pr
    assert not one_speed(run("ucx", 1, 0.1, probes=(None, 0.05)))
    assert one_speed(run("ucx", 1, 0.1, probes=(0.05, 0.07)), run("courier", 1, 0.1))

    # The verdict: on the one-speed pairs when there are 3, whatever the medians say. Here
    # three of Courier's five runs fell in a slow stretch and one of UCX's: the ratio of
    # medians is 1.9, but in every pair that ran at one speed Courier is at 0.5.
    fast, slow = (0.05, 0.05), (0.2, 0.2)
    def target_runs(tool, lats, speeds):
        return [dict(run(tool, i + 1, lat, probes=sp), kind="target", transport="shm",
                     test="tag_lat", size=8) for i, (lat, sp) in enumerate(zip(lats, speeds))]
    runs = (target_runs("courier", [0.1, 0.1, 0.4, 0.4, 0.4], [fast, fast, slow, slow, slow])
            + target_runs("ucx", [0.2, 0.2, 0.8, 0.21, 0.21], [fast, fast, slow, fast, fast]))
    row = next(r for r in target_rows(runs) if r["test"] == "tag_lat" and r["tls"] == "shm")
    assert row["pairs"] == 5 and row["pairs_same"] == 3, row
    assert round(row["ratio"], 2) == 1.9 and round(row["judged"], 3) == 0.5, row
    assert row["judged_on"] == "one-speed pairs" and row["verdict"] == "PASS", row
    split = row["by_speed"]
    assert split["fast"] == (0.5, 2) and split["slow"] == (0.5, 1), split
    # Without probes: judged on all pairs.
    for r in runs:
        r["probe_us"] = [None, None]
    row = next(r for r in target_rows(runs) if r["test"] == "tag_lat" and r["tls"] == "shm")
    assert row["pairs_same"] == 0 and row["judged_on"] == "all pairs", row

    # The Go section: judged on the repetitions at one speed (the second ran in a slow
    # stretch, and its ratio is the odd one out); latency as Go - native.
    def go_lines(size, gv, nv, probes, lat):
        key = "latency_us" if lat else "bandwidth_mbs"
        gm, nm = statistics.median(gv), statistics.median(nv)
        return [json.dumps({"impl": "go", "size": size, key: gm}),
                json.dumps({"impl": "native", "size": size, key: nm, "go_values": gv,
                            "native_values": nv, "probes": probes})]
    f4, s4, mixed = [0.05] * 4, [0.2] * 4, [0.05, 0.05, 0.2, 0.2]
    go = render_go(go_lines(4 * MIB, [96.0, 60.0, 99.0, 98.0], [100.0, 100.0, 100.0, 100.0],
                            [f4, mixed, f4, s4], False)
                   + go_lines(8, [0.25, 0.30, 0.26], [0.08, 0.09, 0.08], [f4, f4, [None] * 4], True)
                   + ["not json"])
    assert "| 4 MiB | bandwidth (MB/s) | 97 | 100 | 0.970 | 0.970 | 0.980 (3) | one-speed pairs | >= 0.95 | PASS |" in go, go
    assert "| 8 B | one-way latency (us) | 0.260 | 0.080 | +0.180 us | +0.180 us | +0.190 us (2) | all pairs | <= +0.3 us | PASS |" in go, go
    miss = render_go(go_lines(MIB, [90.0, 99.0], [100.0, 100.0], [], False))
    assert "| 0.945 | 0.945 | — | medians | >= 0.95 | MISS |" in miss, miss

    # The signaling put: judged on the averages of the repetitions at one speed. The 50%iles
    # (one clock step apart) say 1.14; the averages of the one-speed repetitions say 1.05;
    # repetition 3 ran in a slow stretch.
    def sig(tls, test, rep, p50, avg, probes=(0.05, 0.05)):
        return json.dumps({"tls": tls, "test": test, "rep": rep, "latency_us": p50,
                           "latency_avg_us": avg, "probe_us": list(probes)})
    lines = []
    for rep, (pa, sa, fa, pr) in enumerate([(0.040, 0.042, 0.090, (0.05, 0.05)),
                                            (0.041, 0.043, 0.088, (0.05, 0.06)),
                                            (0.120, 0.100, 0.250, (0.2, 0.05)),
                                            (0.040, 0.042, 0.091, (0.05, 0.05))], 1):
        lines += [sig("shm", "ucp_put_lat", rep, 0.035, pa, pr),
                  sig("shm", "put_signal_lat", rep, 0.040, sa, pr),
                  sig("shm", "put_flush_signal_lat", rep, 0.085, fa, pr)]
    lines += [sig("tcp", "ucp_put_lat", 1, 3.4, 3.4), sig("tcp", "put_signal_lat", 1, 4.9, 4.9),
              sig("tcp", "put_flush_signal_lat", 1, 22.0, 22.4), "not json", "[1]"]
    sg = render_signal(lines)
    assert "| shm | put_signal_lat / ucp_put_lat | 1.05 (3) | 1.05 | 1.05 | 1.14 | one-speed pairs | <= 1.10 | PASS |" in sg, sg
    assert "| shm | put_signal_lat / put_flush_signal_lat | 0.47 (3) | 0.46 | 0.47 | 0.47 | one-speed pairs | <= 0.50 | PASS |" in sg, sg
    assert "| tcp | put_signal_lat / ucp_put_lat | 1.44 (1) | 1.44 | 1.44 | 1.44 | medians | <= 1.10 (for reference) | MISS |" in sg, sg
    assert "| shm | ucp_put_lat | 0.035 | 0.041 | 0.0400, 0.0410, 0.1200, 0.0400 |" in sg, sg
    print("selftest ok")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cmd, args = argv[0], argv[1:]

    def opt(name, default=None):
        if name in args:
            i = args.index(name)
            return args[i + 1] if i + 1 < len(args) else default
        return default

    if cmd == "plan":
        print("\n".join(plan("--quick" in args)))
        return 0
    if cmd == "selftest":
        selftest()
        return 0
    # The sections rendered from one file of JSON lines.
    renderers = {"signal": render_signal, "go": render_go, "ceilings": render_ceilings}
    if cmd in renderers:
        if not args:
            print(f"{cmd} needs FILE", file=sys.stderr)
            return 2
        with open(args[0]) as fh:
            sys.stdout.write(renderers[cmd](fh.readlines()))
        return 0
    outdir = opt("--out", os.path.dirname(os.path.abspath(__file__)))
    raw = os.path.join(outdir, "results", "raw.json")
    if cmd == "build":
        work = opt("--work")
        if not work:
            print("build needs --work DIR", file=sys.stderr)
            return 2
        runs = parse_runs(work)
        meta = collect_meta(work)
        meta["generated"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        doc = {"schema": 1, "meta": meta, "targets": TARGETS, "runs": runs}
        os.makedirs(os.path.dirname(raw), exist_ok=True)
        with open(raw, "w") as fh:
            json.dump(doc, fh, indent=1)
        render(doc, outdir)
        print(f"wrote {raw} ({len(runs)} runs), {os.path.join(outdir, 'RESULTS.md')}")
        return 0
    if cmd == "render":
        with open(raw) as fh:
            doc = json.load(fh)
        render(doc, outdir)
        print(f"wrote {os.path.join(outdir, 'RESULTS.md')}")
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
