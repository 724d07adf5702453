#!/usr/bin/env python3
"""Turn bench/shmem/run.sh's raw lines into the OpenSHMEM section of bench/RESULTS.md.

Raw line: IMPL NP TEST SIZE VALUE UNIT rc=RC crash=N
Medians over the rounds; ratio = Courier / OSHMEM; targets: latency <= 0.8, barrier <= 0.5,
bandwidth and rate >= 1.25; atomics on a global within 1.2x of the heap (Courier's own).
"""
import datetime
import os
import platform
import re
import statistics
import sys
from collections import defaultdict

BEGIN, END = "<!-- shmem:begin -->", "<!-- shmem:end -->"


def main(raw_path, results_path):
    vals = defaultdict(list)
    units = {}
    crashes = defaultdict(int)
    runs = defaultdict(int)
    order = []
    load_start = "?"
    for line in open(raw_path):
        p = line.split()
        if p[:2] == ["#", "load-start"]:
            load_start = " ".join(p[2:])
            continue
        if len(p) < 8:
            continue
        impl, np_, test, size, value, unit = p[:6]
        crash = int(p[7].split("=")[1] or 0)
        key = (int(np_), test, int(size))
        if key not in order:
            order.append(key)
        runs[impl] += 1
        crashes[impl] += crash > 0
        try:
            v = float(value)
        except ValueError:
            continue
        if v == v and v >= 0:
            vals[(key, impl)].append(v)
            units[key] = unit
    rows = []
    for key in order:
        np_, test, size = key
        c = vals.get((key, "courier"), [])
        o = vals.get((key, "oshmem"), [])
        mc = statistics.median(c) if c else None
        mo = statistics.median(o) if o else None
        unit = units.get(key, "?")
        ratio = mc / mo if mc and mo else None
        if test == "barrier":
            target, ok = "<= 0.5", ratio is not None and ratio <= 0.5
        elif unit == "us":
            target, ok = "<= 0.8", ratio is not None and ratio <= 0.8
        else:
            target, ok = ">= 1.25", ratio is not None and ratio >= 1.25
        mark = "PASS" if ok else ("n/a" if ratio is None else "MISS")
        rows.append((np_, test, size, unit, mc, mo, ratio, target, mark, len(c), len(o)))
    fmt = lambda v: "-" if v is None else (f"{v:.3f}" if v < 100 else f"{v:.0f}")
    out = [BEGIN, "## OpenSHMEM: Courier vs Open MPI's OSHMEM (same machine, same run)", ""]
    out.append(f"Run {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on {platform.node()} "
               f"({platform.processor() or platform.machine()}), `bench/shmem/run.sh`: `bench/shmem/shmem_bench.c` "
               "built with Courier's `oshcc` and with Open MPI 4.1.4's, run alternately, medians of the rounds. "
               "Point-to-point tests between PE 0 and PE 1; `fadd_heap`/`fadd_global` are contended (every PE "
               "but 0 fetch-adds PE 0's counter: total Mops/s); collectives use the active-set forms both have. "
               "Latency in us (lower is better), bandwidth MB/s and rates Mops/s (higher is better). "
               f"{os.cpu_count()} CPUs; load average {load_start} at the start, "
               f"{' '.join(open('/proc/loadavg').read().split()[:3])} at the end. Both launchers bind each PE to a CPU "
               "of its own while the PEs do not outnumber the CPUs (mpirun's default, and `oshrun`'s "
               "`--cpu-bind auto`); with more PEs than CPUs, where neither binds by default, the script binds "
               "both round robin (`oshrun --cpu-bind core`, `mpirun --bind-to core:overload-allowed`), and "
               "Courier's waits give the CPU away at every round.")
    out.append("")
    out.append(f"OSHMEM crashed at exit (segmentation fault in `shmem_finalize`) in {crashes['oshmem']} of "
               f"{runs['oshmem']} runs; the numbers it printed before are kept. Courier: {crashes['courier']} "
               f"crashes in {runs['courier']} runs.")
    out.append("")
    out.append("| PEs | test | size | unit | Courier | OSHMEM | Courier/OSHMEM | target | |")
    out.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for np_, test, size, unit, mc, mo, ratio, target, mark, nc, no in rows:
        out.append(f"| {np_} | {test} | {size} | {unit} | {fmt(mc)} | {fmt(mo)} | {fmt(ratio)} | {target} | {mark} |")
    out.append("")
    out.append("Atomics on a global against the heap (contended fetch-add, target: within 1.2x):")
    out.append("")
    out.append("| PEs | impl | heap Mops/s | global Mops/s | global/heap | |")
    out.append("| --- | --- | --- | --- | --- | --- |")
    nps = sorted({k[0] for k in order})
    for np_ in nps:
        for impl in ["courier", "oshmem"]:
            h = vals.get(((np_, "fadd_heap", 4), impl), [])
            g = vals.get(((np_, "fadd_global", 4), impl), [])
            if h and g:
                mh, mg = statistics.median(h), statistics.median(g)
                r = mg / mh if mh else None
                mark = "" if impl == "oshmem" else ("PASS" if r and r >= 1 / 1.2 else "MISS")
                out.append(f"| {np_} | {impl} | {fmt(mh)} | {fmt(mg)} | {fmt(r)} | {mark} |")
    out.append(END)
    section = "\n".join(out) + "\n"
    try:
        text = open(results_path).read()
    except FileNotFoundError:
        text = ""
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END) + "\n?", lambda _: section, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    open(results_path, "w").write(text)
    print(section)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
