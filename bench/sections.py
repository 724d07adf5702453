"""The sections of RESULTS.md rendered from one file of JSON lines each (bench/report.py's
`ceilings`, `go` and `signal` commands): what the machine allows with no library, the Go
bindings against native, and the signaling put. Judged as the targets are (report.py)."""

from __future__ import annotations

import json
import statistics

from report import MIN_JUDGED_PAIRS, judge, one_speed, probes_agree

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


def render_large(lines: list[str]) -> str:
    """The large-message section from bench/large.py's JSON lines: each command's wall time,
    Courier against ucx_perftest (judged as the targets are, on the repetitions' own ratios:
    at most LARGE_TARGET), and the peak RSS of both processes of both tools."""
    runs: dict[str, dict[str, dict[int, dict]]] = {}
    order: list[str] = []
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if not isinstance(d, dict) or "command" not in d:
            continue
        if d["command"] not in runs:
            order.append(d["command"])
        runs.setdefault(d["command"], {}).setdefault(d["tool"], {})[d["rep"]] = d
    out = ["", "## Large messages: wall time and memory (issue 31's commands, tcp)", ""]
    out.append("What a ucx_perftest user first types for large messages, over tcp "
               "(`COURIER_TLS=tcp` / `UCX_TLS=tcp`, same options for both tools, server and "
               "client pinned as above; `bench/large.py`): the client's wall time from its start "
               "to its exit (set-up, warm-up, measured iterations, teardown), and the peak "
               "resident memory (RSS, from the kernel's accounting of each finished process) of "
               "client and server. Courier and ucx_perftest alternate run by run; the ratio is "
               f"judged as the targets are, against at most {LARGE_TARGET}.")
    out += ["", "| command | Courier wall (s) | UCX wall (s) | paired ratio (n) | judged on | target "
            "| result | Courier RSS client / server (MiB) | UCX RSS client / server (MiB) |",
            "|---|---|---|---|---|---|---|---|---|"]

    def med(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    for cmd in order:
        c, u = runs[cmd].get("courier", {}), runs[cmd].get("ucx", {})
        ok = lambda r: r.get("rc") == 0
        cw = med([r["wall_s"] for r in c.values() if ok(r)])
        uw = med([r["wall_s"] for r in u.values() if ok(r)])
        pairs = [(c[k]["wall_s"] / u[k]["wall_s"], probes_agree(c[k]["probe_us"] + u[k]["probe_us"]))
                 for k in sorted(c) if k in u and ok(c[k]) and ok(u[k]) and u[k]["wall_s"]]
        same = [x for x, one in pairs if one]
        judged, on = judge(same, [x for x, _ in pairs], cw / uw if cw and uw else None)
        n = {"one-speed pairs": len(same), "all pairs": len(pairs)}.get(on, 0)
        verdict = "—" if judged is None else ("PASS" if judged <= LARGE_TARGET else "MISS")
        failed = [r for r in list(c.values()) + list(u.values()) if not ok(r)]
        if any(not ok(r) for r in c.values()):
            verdict = "MISS"  # a Courier run that failed or ran out of time is not at parity

        def mib(runs_, key):
            v = med([r[key] for r in runs_.values() if ok(r)])
            return f"{v / 1024:.0f}" if v is not None else "—"

        fmt = lambda v: f"{v:.2f}" if v is not None else "—"
        out.append(f"| `{c.get(1, u.get(1, {})).get('options', cmd)}` | {fmt(cw)} | {fmt(uw)} | "
                   f"{fmt(judged)} ({n}) | {on} | <= {LARGE_TARGET} | {verdict}"
                   f"{f' ({len(failed)} runs failed or timed out)' if failed else ''} | "
                   f"{mib(c, 'client_rss_kib')} / {mib(c, 'server_rss_kib')} | "
                   f"{mib(u, 'client_rss_kib')} / {mib(u, 'server_rss_kib')} |")
    return "\n".join(out) + "\n"


# The most a command may take against ucx_perftest (issue 31: within 1.5 times its wall time).
LARGE_TARGET = 1.5
