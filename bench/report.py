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
  report.py large FILE                print the large-message section (Markdown) from
                                      bench/large.py's JSON lines in FILE
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
    # A remote fetch-and-add is one round trip: judged against the physical limit, the busy-
    # polling kernel ping-pong of bench/ceilings.c measured next to each run (`vs`), not
    # against UCX (whose round trip is above that floor).
    dict(tls="tcp", test="ucp_fadd", size=8, metric="lat", op="<=", target=1.1, fi=False,
         vs="floor"),
]

# The reference a `vs="floor"` row is judged against: a run of this test by the "floor" tool
# (`ceilings pingpong`, the 8-byte TCP loopback round trip, its median).
FLOOR_TEST = "tcp_pingpong"

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


SWEEP_SIZES = [4 ** k for k in range(13)] + [32 * MIB, 64 * MIB]  # 1 B .. 16 MiB by 4, 32, 64 MiB
SWEEP_TESTS = ["tag_lat", "tag_bw"]
SWEEP_TLS = ["shm", "tcp"]


def sweep_iters(tls: str, test: str, size: int) -> int:
    """Iterations of a sweep point: enough that each run lasts long enough to be judged
    (tens of milliseconds at least), not so many that the sweep takes hours. Messages of up
    to 64 B get the targets' counts: at tens of millions a second, 100k of them took a few
    milliseconds, which one scheduler tick could halve."""
    if test.endswith("_lat"):
        cap, volume, floor = 20_000, 256 << 20, 16  # up to 256 MiB moved each way
        if size <= 64:
            cap = 200_000 if tls == "shm" else 20_000
    else:
        cap, volume, floor = 100_000, 512 << 20, 32  # up to 512 MiB streamed
        if size <= 64:
            cap = 2_000_000 if tls == "shm" else 200_000
    if tls == "tcp" and size > 64:
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
        if t.get("vs") == "floor":
            # Right after Courier's and UCX's runs of each repetition, so that each pairs
            # with the floor measured next to it in time.
            lines.append(f"target {t['tls']} {FLOOR_TEST} {t['size']} 0 0 1 floor")
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


def parse_floor(text: str) -> dict | None:
    """`ceilings pingpong`: {"what": "tcp_pingpong", "rtt_us": ...}; the round trip is the
    latency a fetch-and-add (one round trip) is judged against."""
    for line in reversed(text.splitlines()):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and d.get("what") == FLOOR_TEST and d.get("rtt_us"):
            return {"lat_p50_us": float(d["rtt_us"]), "oneway_us": d.get("oneway_us")}
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
            "probe_before", "probe_after", "load1"]

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
        elif r["tool"] == "floor":
            nums = parse_floor(out)
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
            "load1": _float(r["load1"]),
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


def compare(cs: list[dict], us: list[dict], metric: str, op: str, target: float,
            ref: float | None) -> dict:
    """Courier's runs `cs` against the reference runs `us` (UCX's, or the floor's): their
    summaries, the ratio of medians, the repetitions' own ratios (all, and those at one
    speed), and the verdict on `op target`. Judged on the pairs that ran at one speed when
    there are MIN_JUDGED_PAIRS of them, else on all pairs, else (no pair) on the ratio of
    medians."""
    c = summarize(cs, metric)
    u = summarize(us, metric)
    pairs = paired_ratios(cs, us, metric, ref)
    same = [x for x, one, _ in pairs if one]
    ratio = None
    if "median" in c and "median" in u and u["median"]:
        ratio = c["median"] / u["median"]
    judged, judged_on = judge(same, [x for x, _, _ in pairs], ratio)
    if judged is not None:
        ok = judged <= target if op == "<=" else judged >= target
        verdict = "PASS" if ok else "MISS"
    elif "unsupported" in c["statuses"] and "median" not in c:
        verdict = "not supported yet"
    elif not u["runs"]:
        verdict = "no reference"
    elif "median" not in u:
        verdict = "reference failed"
    elif "median" not in c:
        verdict = "Courier failed"
    else:
        verdict = "—"
    return dict(courier=c, ref=u, ratio=ratio,
                paired=statistics.median([x for x, _, _ in pairs]) if pairs else None,
                pairs=len(pairs), paired_same=statistics.median(same) if same else None,
                pairs_same=len(same), judged=judged, judged_on=judged_on, verdict=verdict,
                by_speed={"fast": median_n([x for x, one, full in pairs if one and full]),
                          "slow": median_n([x for x, one, full in pairs if one and not full])})


def target_rows(runs: list[dict]) -> list[dict]:
    rows = []
    ref = full_speed_ref(runs)
    for t in TARGETS:
        cs = select(runs, "target", "courier", t["tls"], t["test"], t["size"])
        us = select(runs, "target", "ucx", t["tls"], t["test"], t["size"])
        floor = t.get("vs") == "floor"
        against = select(runs, "target", "floor", t["tls"], FLOOR_TEST, t["size"]) if floor else us
        cmp = compare(cs, against, t["metric"], t["op"], t["target"], ref)
        if cmp["verdict"] == "no reference":
            cmp["verdict"] = "no floor measured" if floor else "no UCX"
        elif cmp["verdict"] == "reference failed":
            cmp["verdict"] = "floor failed" if floor else "UCX failed"
        f = (summarize(select(runs, "target", "fi", t["tls"], "pingpong", t["size"]), t["metric"])
             if t["fi"] else None)
        rows.append(dict(t, ucx=summarize(us, t["metric"]), fi=f,
                         floor=cmp["ref"] if floor else None, **cmp))
    return rows


# A sweep point is at parity when Courier's latency is at most UCX's and its bandwidth at
# least UCX's, judged as the targets are.
SWEEP_PARITY = {"lat": ("<=", 1.0), "bw": (">=", 1.0)}


def sweep_rows(runs: list[dict]) -> dict:
    """{(tls, test, size): compare(...)} for every sweep point, Courier against UCX."""
    ref = full_speed_ref(runs)
    out = {}
    for tls in SWEEP_TLS:
        for test in SWEEP_TESTS:
            metric = "lat" if test.endswith("_lat") else "bw"
            op, target = SWEEP_PARITY[metric]
            for size in SWEEP_SIZES:
                out[(tls, test, size)] = compare(
                    select(runs, "sweep", "courier", tls, test, size),
                    select(runs, "sweep", "ucx", tls, test, size), metric, op, target, ref)
    return out


def load_summary(runs: list[dict]) -> str:
    """One sentence on how busy the machine was: the 1-minute load average at each run's
    start (runnable tasks, on this machine's CPUs, other engineers' work included)."""
    loads = sorted(r["load1"] for r in runs if r.get("load1") is not None)
    if not loads:
        return ""
    q = lambda f: loads[min(len(loads) - 1, int(f * len(loads)))]
    return (f"Machine load: the 1-minute load average at the start of each of {len(loads)} runs "
            f"was {statistics.median(loads):.1f} in the median (10th–90th percentile "
            f"{q(0.1):.1f}–{q(0.9):.1f}, max {loads[-1]:.1f}); a load above the CPU count means "
            "processes waited for a CPU, which is what the speed probes and the one-speed "
            "pairs guard against.")


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
# RESULTS.md
# ---------------------------------------------------------------------------------------------
def render(doc: dict, outdir: str) -> None:
    import svg
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
            svg.svg_plot(os.path.join(resdir, fname), f"{test} {name} vs message size — {tls}", ylabel, data)
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
             "value judged is in the Result column. A row whose target says *× floor* is judged "
             "against the physical limit instead of UCX: tcp `ucp_fadd` (one round trip per "
             "operation) against the busy-polling 8-byte TCP loopback round trip of "
             "`bench/ceilings.c`, run right after Courier and UCX in each repetition (its "
             "median round trip is in the Reference column; UCX is shown, not judged).\n")
    L.append("| Transport | Test | Size | Metric | Courier | UCX | Reference (fi_pingpong, or the floor) | Ratio | Paired | One speed | Target | Result |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        fi = cell(r["fi"], r["metric"]) if r["fi"] is not None else "—"
        if r.get("floor") is not None:
            fi = cell(r["floor"], r["metric"]) + " (kernel round trip)"
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "—"
        paired = f"{r['paired']:.2f} <sub>(n={r['pairs']})</sub>" if r.get("paired") is not None else "—"
        same = (f"{r['paired_same']:.2f} <sub>(n={r['pairs_same']})</sub>"
                if r.get("paired_same") is not None else "—")
        verdict = f"**{r['verdict']}**" if r["verdict"] in ("PASS", "MISS") else r["verdict"]
        if r["verdict"] in ("PASS", "MISS") and r.get("judged") is not None:
            verdict += f" <sub>({r['judged']:.2f}, {r['judged_on']})</sub>"
        L.append(f"| {r['tls']} | {r['test']} | {fmt_size(r['size'])} | {METRIC_NAMES[r['metric']]} | "
                 f"{cell(r['courier'], r['metric'])} | {cell(r['ucx'], r['metric'])} | {fi} | {ratio} | {paired} | "
                 f"{same} | {r['op']} {r['target']}{' × floor' if r.get('vs') == 'floor' else ''} | {verdict} |")
    n_pass = sum(r["verdict"] == "PASS" for r in rows)
    n_miss = sum(r["verdict"] == "MISS" for r in rows)
    n_uns = sum(r["verdict"] == "not supported yet" for r in rows)
    L.append(f"\n{n_pass} PASS, {n_miss} MISS, {n_uns} not supported yet by Courier, "
             f"{len(rows) - n_pass - n_miss - n_uns} other.\n")
    L.append(probe_summary(runs) + "\n")
    if load_summary(runs):
        L.append(load_summary(runs) + "\n")
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
             "for message sizes 1 B .. 16 MiB in powers of 4, then 32 and 64 MiB; iterations shrink "
             f"with size. Medians over the sweep's {meta.get('sweep_reps', '?')} repetitions; "
             "Courier and UCX alternate at every point. Each point is judged as the targets are, "
             "on the repetitions' own ratios (one-speed pairs when there are "
             f"{MIN_JUDGED_PAIRS}, else all pairs, else the medians), against parity: latency "
             "ratio at most 1.0, bandwidth ratio at least 1.0. The ratio shown is the one judged, "
             "with the pairs it was taken on.\n")
    sweep = sweep_rows(runs)
    for tls in SWEEP_TLS:
        L.append(f"### {tls}\n")
        L.append("| Size | Courier lat (us) | UCX lat (us) | lat ratio | | Courier bw (MB/s) | UCX bw (MB/s) | bw ratio | |")
        L.append("|---:|---:|---:|---:|---|---:|---:|---:|---|")
        for size in SWEEP_SIZES:
            cells = []
            for test, metric in (("tag_lat", "lat"), ("tag_bw", "bw")):
                p = sweep[(tls, test, size)]

                def v(s, m=metric):
                    if "median" in s:
                        return fmt_num(s["median"], m)
                    return "—" if not s["runs"] else "/".join(s["statuses"])

                judged = "—"
                if p["judged"] is not None:
                    n = {"one-speed pairs": p["pairs_same"], "all pairs": p["pairs"]}.get(p["judged_on"])
                    judged = f"{p['judged']:.3f}" + (f" <sub>(n={n})</sub>" if n else " <sub>(medians)</sub>")
                verdict = {"no reference": "no UCX"}.get(p["verdict"], p["verdict"])
                if not p["courier"]["runs"] and not p["ref"]["runs"]:
                    verdict = "not run"
                cells += [v(p["courier"]), v(p["ref"]), judged, verdict]
            L.append(f"| {fmt_size(size)} | " + " | ".join(cells) + " |")
        L.append("")
    judged = [p for p in sweep.values() if p["verdict"] in ("PASS", "MISS")]
    misses = [(k, p) for k, p in sweep.items() if p["verdict"] == "MISS"]
    L.append(f"{sum(p['verdict'] == 'PASS' for p in judged)} of {len(sweep)} sweep points at parity "
             f"with UCX, {len(misses)} behind" +
             (": " + ", ".join(f"{tls} {test} {fmt_size(size)} ({p['judged']:.3f})"
                               for (tls, test, size), p in misses) if misses else "") +
             (f", {len(sweep) - len(judged)} not judged" if len(judged) < len(sweep) else "") + ".\n")
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
        import report_selftest
        report_selftest.selftest()
        return 0
    # The sections rendered from one file of JSON lines.
    import sections
    renderers = {"signal": sections.render_signal, "go": sections.render_go,
                 "ceilings": sections.render_ceilings, "large": sections.render_large}
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
