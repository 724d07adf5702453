#!/usr/bin/env python3
"""Render the EXS section of bench/RESULTS.md (and its SVG plots) from bench/exs/run.sh's
raw.jsonl. Python 3 standard library only.

    python3 bench/exs/report.py RAW.jsonl RESULTS.md OUTDIR
    python3 bench/exs/report.py selftest

The section lies between the markers below; the rest of RESULTS.md is left as it is (other
sections belong to other reports). Ratios are taken per repetition against the kernel TCP
run next to it in time (the kinds alternate), and their median is judged; the ratio of the
medians is shown beside it."""

import json
import math
import os
import platform
import statistics
import sys

BEGIN = "<!-- exs:begin (bench/exs/report.py writes this section) -->"
END = "<!-- exs:end -->"
KINDS = ["courier-shm", "courier-tcp", "kernel-tcp", "kernel-unix"]
COLORS = {"courier-shm": "#1f77b4", "courier-tcp": "#2ca02c", "kernel-tcp": "#d62728",
          "kernel-unix": "#9467bd", "1": "#8c564b", "4": "#1f77b4", "16": "#ff7f0e",
          "busy": "#1f77b4", "notify": "#d62728", "busy, pinned": "#2ca02c",
          "notify, pinned": "#ff7f0e"}


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return rows


def med(v):
    return statistics.median(v) if v else None


def fmt_size(n):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def cpu_ns_per_byte(r):
    cpu = r["snd_user"] + r["snd_sys"] + r["rcv_user"] + r["rcv_sys"]
    return cpu / (r["msgs"] * r["size"]) * 1e9


def cpu_pct(r):
    """CPU of both processes, in percent of one CPU over the run's wall time."""
    return (r["snd_user"] + r["snd_sys"] + r["rcv_user"] + r["rcv_sys"]) / r["secs"] * 100


def pick(rows, **kw):
    return [r for r in rows if all(r.get(k) == v for k, v in kw.items())]


def paired(rows, test, phase, metric, a, b, **kw):
    """Per repetition: metric(a) / metric(b); returns the list of ratios."""
    out = []
    reps = sorted({r["rep"] for r in rows if r.get("phase") == phase})
    for rep in reps:
        ra = pick(rows, test=test, phase=phase, rep=rep, over=a, **kw)
        rb = pick(rows, test=test, phase=phase, rep=rep, over=b, **kw)
        if ra and rb:
            va, vb = metric(ra[0]), metric(rb[0])
            if vb:
                out.append(va / vb)
    return out


def target_rows(rows, pinned=0):
    res = []
    gb = lambda r: r["gbps"]
    rtt = lambda r: r["rtt_median_us"]
    blast = dict(size=524288, outstanding=4, busy=0, pinned=pinned)
    # 1. shm throughput >= 3x kernel TCP, with less CPU per byte.
    p = paired(rows, "blast", "target", gb, "courier-shm", "kernel-tcp", **blast)
    c = paired(rows, "blast", "target", cpu_ns_per_byte, "courier-shm", "kernel-tcp", **blast)
    shm = [gb(r) for r in pick(rows, test="blast", phase="target", over="courier-shm", **blast)]
    ktcp = [gb(r) for r in pick(rows, test="blast", phase="target", over="kernel-tcp", **blast)]
    cshm = [cpu_ns_per_byte(r) for r in pick(rows, test="blast", phase="target", over="courier-shm", **blast)]
    cktcp = [cpu_ns_per_byte(r) for r in pick(rows, test="blast", phase="target", over="kernel-tcp", **blast)]
    ok = bool(p) and med(p) >= 3.0 and bool(c) and med(c) < 1.0
    where = ", each process on its own CPU" if pinned else ""
    res.append((f"blast 512 KiB x 4{where}, shm / kernel TCP", "throughput >= 3x, CPU/byte < 1x",
                f"{med(shm):.2f} / {med(ktcp):.2f} GB/s" if shm and ktcp else "-",
                f"{med(p):.2f}x, CPU/byte {med(c):.2f}x" if p and c else "-",
                f"{med(shm)/med(ktcp):.2f}x, CPU/byte {med(cshm)/med(cktcp):.2f}x" if shm and ktcp else "-",
                len(p), "MET" if ok else "MISSED"))
    if pinned:
        return res
    # 2. ping-pong busy-polling RTT <= 0.3x kernel TCP.
    pp = dict(size=8, busy=1, pinned=0)
    p = paired(rows, "pingpong", "target", rtt, "courier-shm", "kernel-tcp", **pp)
    a = [rtt(r) for r in pick(rows, test="pingpong", phase="target", over="courier-shm", **pp)]
    b = [rtt(r) for r in pick(rows, test="pingpong", phase="target", over="kernel-tcp", **pp)]
    res.append(("ping-pong 8 B, busy-polling, shm / kernel TCP", "round trip <= 0.3x",
                f"{med(a):.2f} / {med(b):.2f} us" if a and b else "-",
                f"{med(p):.3f}x" if p else "-", f"{med(a)/med(b):.3f}x" if a and b else "-",
                len(p), "MET" if p and med(p) <= 0.3 else "MISSED"))
    # 3. Courier tcp throughput >= 0.9x kernel sockets.
    p = paired(rows, "blast", "target", gb, "courier-tcp", "kernel-tcp", **blast)
    a = [gb(r) for r in pick(rows, test="blast", phase="target", over="courier-tcp", **blast)]
    res.append(("blast 512 KiB x 4, Courier tcp / kernel TCP", "throughput >= 0.9x",
                f"{med(a):.2f} / {med(ktcp):.2f} GB/s" if a and ktcp else "-",
                f"{med(p):.2f}x" if p else "-", f"{med(a)/med(ktcp):.2f}x" if a and ktcp else "-",
                len(p), "MET" if p and med(p) >= 0.9 else "MISSED"))
    return res


# ----- SVG -------------------------------------------------------------------------------

def svg_plot(path, title, ylabel, series, logy=False):
    """series: {name: [(x_bytes, y), ...]}; x on a log2 axis."""
    W, H, L, R, T, B = 720, 400, 70, 170, 40, 50
    pts = [(x, y) for s in series.values() for x, y in s if y is not None and y > 0]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{(L + W - R) / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>']
    if not pts:
        out.append(f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">no data</text></svg>')
        with open(path, "w") as f:
            f.write("\n".join(out))
        return
    xs = [math.log2(x) for x, _ in pts]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x1 = x0 + 1
    ys = [y for _, y in pts]
    if logy:
        y0, y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
        if y1 == y0:
            y1 += 1
    else:
        y0, y1 = 0.0, max(ys) * 1.1
    fx = lambda x: L + (math.log2(x) - x0) / (x1 - x0) * (W - L - R)
    fy = (lambda y: T + (1 - (math.log10(y) - y0) / (y1 - y0)) * (H - T - B)) if logy else \
         (lambda y: T + (1 - (y - y0) / (y1 - y0)) * (H - T - B))
    out.append(f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>')
    out.append(f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>')
    for e in range(int(x0), int(x1) + 1, 2):
        x = L + (e - x0) / (x1 - x0) * (W - L - R)
        out.append(f'<line x1="{x}" y1="{H - B}" x2="{x}" y2="{H - B + 4}" stroke="black"/>')
        out.append(f'<text x="{x}" y="{H - B + 16}" text-anchor="middle">{fmt_size(1 << e)}</text>')
    if logy:
        ticks = [10 ** e for e in range(y0, y1 + 1)]
    else:
        step = 10 ** math.floor(math.log10(y1 / 5)) if y1 > 0 else 1
        for m in (1, 2, 5, 10):
            if y1 / (step * m) <= 6:
                step *= m
                break
        ticks = [i * step for i in range(int(y1 / step) + 1)]
    for t in ticks:
        y = fy(t)
        out.append(f'<line x1="{L - 4}" y1="{y}" x2="{W - R}" y2="{y}" stroke="#ddd"/>')
        out.append(f'<text x="{L - 6}" y="{y + 4}" text-anchor="end">{t:g}</text>')
    out.append(f'<text x="16" y="{(T + H - B) / 2}" transform="rotate(-90 16 {(T + H - B) / 2})" text-anchor="middle">{ylabel}</text>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">message size</text>')
    for i, (name, s) in enumerate(series.items()):
        s = sorted((x, y) for x, y in s if y is not None and y > 0)
        color = COLORS.get(name, ["#17becf", "#bcbd22", "#7f7f7f"][i % 3])
        if s:
            d = " ".join(f"{fx(x):.1f},{fy(y):.1f}" for x, y in s)
            out.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2"/>')
            for x, y in s:
                out.append(f'<circle cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="3" fill="{color}"/>')
        ly = T + 10 + i * 18
        out.append(f'<line x1="{W - R + 10}" y1="{ly}" x2="{W - R + 30}" y2="{ly}" stroke="{color}" stroke-width="2"/>')
        out.append(f'<text x="{W - R + 35}" y="{ly + 4}">{name}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))


# ----- the section -----------------------------------------------------------------------

def machine():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = "?"
    try:
        with open("/proc/loadavg") as f:
            load = " ".join(f.read().split()[:3])
    except OSError:
        pass
    return f"{os.cpu_count()} x {cpu}, Linux {platform.release()}, load average {load} when rendered"


def render(rows, outdir):
    sweep = [r for r in rows if r.get("phase") == "sweep"]
    L = [BEGIN, "", "## Extended Sockets (EXS): exs-blast and exs-pingpong", "",
         "`bash bench/exs/run.sh` (EXS_QUICK=1 for a short run). One binary each, the same "
         "calls over Courier's shared memory (`courier-shm`), Courier's tcp (`courier-tcp`, "
         "COURIER_TLS=tcp), kernel TCP loopback (`kernel-tcp`) and kernel Unix stream sockets "
         "(`kernel-unix`): only the socket call differs (exs_socket or socket(2)). SOCK_STREAM, "
         "receives with MSG_WAITALL, two processes. Blast: the receiver keeps O receives posted, "
         "the sender O sends; wait-for-notify (the completion thread). CPU: user + system of both "
         "processes (getrusage), every thread. Kinds alternate run by run; numbers are medians; "
         "a target's ratio is the median of the per-repetition ratios against the kernel TCP run "
         "next to it (the ratio of the medians beside it).", "",
         f"Machine: {machine()}. A shared 2-CPU VM: other work runs beside these numbers.", "",
         "### Targets", "",
         "| target | goal | medians | paired ratio | ratio of medians | pairs | |",
         "| --- | --- | --- | --- | --- | --- | --- |"]
    for t in target_rows(rows) + target_rows(rows, pinned=1):
        L.append("| " + " | ".join(str(x) for x in t) + " |")
    L += ["", "Why, and what limits each:", "",
          "- Blast over shared memory: both processes register their buffers, and a "
          "registration of 64 KiB or more in memory of its own (here a large `malloc`) moves "
          "into a shared segment in place (`COURIER_EXS_SHARE_MIN`), which the peer maps. A "
          "receive is advertised (address, length, key of its registered buffer). A send that "
          "fills a whole advertised receive, from 256 KiB (`EXS_F_SPLIT_MIN`), goes by "
          "Courier's split rendezvous: the receiver copies the first half out of the sender's "
          "buffer while the sender copies the second into the receiver's, each with plain "
          "loads and stores through its mapping of the other's segment, then the receiver sets "
          "the receive's signal word itself; smaller ones are one put-with-signal (the sender's "
          "copy, then a store to the signal word whose doorbell wakes the receiver). Kernel TCP "
          "loopback copies every byte twice (into and out of socket buffers) and runs the TCP "
          "stack per segment. Without the move (`COURIER_EXS_SHARE_MIN=off`, or memory that "
          "may not move: the brk heap, a stack) each copy goes through the kernel "
          "(`process_vm_readv`/`writev`: pages pinned on every call), which held this row at "
          "1.65-1.77x of kernel TCP in the last round.",
          "- Ping-pong: an 8-byte message goes eagerly through the shared-memory FIFO (no "
          "advertisement needed) and the waiting thread busy-polls; kernel TCP pays a send and "
          "a receive system call and the loopback stack per message. Pinned runs put each "
          "process (and its completion thread) on its own CPU; unpinned ones share the two CPUs "
          "with whatever else runs, which the medians show.",
          "- Courier tcp against kernel sockets: both move the bytes through the kernel's TCP; "
          "Courier adds its framing, the advertisement messages and their round trips; large "
          "writes leave from the caller's buffer and are placed by the receiver straight into "
          "the advertised buffer.", ""]
    L += ["", "### Blast (wait-for-notify): GB/s, and CPU ns per byte moved (both processes)", ""]
    sizes = sorted({r["size"] for r in sweep if r["test"] == "blast"})
    counts = sorted({r["outstanding"] for r in sweep if r["test"] == "blast"})
    kinds = [k for k in KINDS if any(r["over"] == k for r in sweep)]
    if sizes:
        L.append("| size | O | " + " | ".join(kinds) + " | shm / kernel TCP | Courier tcp / kernel TCP |")
        L.append("| --- | --- | " + " | ".join("---" for _ in kinds) + " | --- | --- |")
        for s in sizes:
            for o in counts:
                cells = []
                g = {}
                for k in kinds:
                    rs = pick(sweep, test="blast", size=s, outstanding=o, over=k)
                    if rs:
                        g[k] = med([r["gbps"] for r in rs])
                        cells.append(f"{g[k]:.2f} ({med([cpu_ns_per_byte(r) for r in rs]):.2f})")
                    else:
                        cells.append("-")
                rat = lambda a, b: f"{g[a] / g[b]:.2f}x" if a in g and b in g and g[b] else "-"
                L.append(f"| {fmt_size(s)} | {o} | " + " | ".join(cells) +
                         f" | {rat('courier-shm', 'kernel-tcp')} | {rat('courier-tcp', 'kernel-tcp')} |")
        L += ["", "CPU usage of the blast (percent of one CPU, both processes, user + system):", ""]
        L.append("| size | O | " + " | ".join(kinds) + " |")
        L.append("| --- | --- | " + " | ".join("---" for _ in kinds) + " |")
        for s in sizes:
            for o in counts:
                cells = []
                for k in kinds:
                    rs = pick(sweep, test="blast", size=s, outstanding=o, over=k)
                    if rs:
                        u = med([(r["snd_user"] + r["rcv_user"]) / r["secs"] * 100 for r in rs])
                        y = med([(r["snd_sys"] + r["rcv_sys"]) / r["secs"] * 100 for r in rs])
                        cells.append(f"{u:.0f} user + {y:.0f} sys")
                    else:
                        cells.append("-")
                L.append(f"| {fmt_size(s)} | {o} | " + " | ".join(cells) + " |")
        o4 = 4 if 4 in counts else counts[0]
        svg_plot(os.path.join(outdir, "exs_blast.svg"), f"exs-blast throughput, {o4} outstanding", "GB/s",
                 {k: [(s, med([r["gbps"] for r in pick(sweep, test="blast", size=s, outstanding=o4, over=k)] or [0]))
                      for s in sizes] for k in kinds})
        svg_plot(os.path.join(outdir, "exs_blast_cpu.svg"), f"exs-blast CPU per byte, {o4} outstanding",
                 "CPU ns per byte (both processes)",
                 {k: [(s, med([cpu_ns_per_byte(r) for r in pick(sweep, test="blast", size=s, outstanding=o4, over=k)] or [0]))
                      for s in sizes] for k in kinds}, logy=True)
        svg_plot(os.path.join(outdir, "exs_blast_outstanding.svg"), "exs-blast over Courier shm by messages outstanding",
                 "GB/s", {str(o): [(s, med([r["gbps"] for r in pick(sweep, test="blast", size=s, outstanding=o, over="courier-shm")] or [0]))
                                   for s in sizes] for o in counts})
    L += ["", "### Ping-pong: round trip (median, us), and CPU of both processes (% of one CPU)", ""]
    psizes = sorted({r["size"] for r in sweep if r["test"] == "pingpong"})
    if psizes:
        modes = [("busy", 1, 0), ("notify", 0, 0), ("busy, pinned", 1, 1), ("notify, pinned", 0, 1)]
        L.append("| size | mode | " + " | ".join(kinds) + " | shm / kernel TCP |")
        L.append("| --- | --- | " + " | ".join("---" for _ in kinds) + " | --- |")
        for s in psizes:
            for name, b, p in modes:
                cells, v = [], {}
                for k in kinds:
                    rs = pick(sweep, test="pingpong", size=s, busy=b, pinned=p, over=k)
                    if rs:
                        v[k] = med([r["rtt_median_us"] for r in rs])
                        c = med([(r["cli_cpu"] + r["srv_cpu"]) * 100 for r in rs])
                        cells.append(f"{v[k]:.2f} ({c:.0f}%)")
                    else:
                        cells.append("-")
                ratio = f"{v['courier-shm'] / v['kernel-tcp']:.3f}x" if "courier-shm" in v and "kernel-tcp" in v else "-"
                L.append(f"| {fmt_size(s)} | {name} | " + " | ".join(cells) + f" | {ratio} |")
        svg_plot(os.path.join(outdir, "exs_pingpong.svg"), "exs-pingpong round trip, busy-polling", "us (median)",
                 {k: [(s, med([r["rtt_median_us"] for r in pick(sweep, test="pingpong", size=s, busy=1, pinned=0, over=k)] or [0]))
                      for s in psizes] for k in kinds}, logy=True)
        svg_plot(os.path.join(outdir, "exs_pingpong_modes.svg"), "exs-pingpong over Courier shm: busy/notify, pinned",
                 "us (median)",
                 {name: [(s, med([r["rtt_median_us"] for r in pick(sweep, test="pingpong", size=s, busy=b, pinned=p, over="courier-shm")] or [0]))
                         for s in psizes] for name, b, p in modes}, logy=True)
    L += ["", "![exs-blast throughput](exs/results/exs_blast.svg)", "",
          "![exs-blast CPU per byte](exs/results/exs_blast_cpu.svg)", "",
          "![exs-blast by outstanding](exs/results/exs_blast_outstanding.svg)", "",
          "![exs-pingpong](exs/results/exs_pingpong.svg)", "",
          "![exs-pingpong modes](exs/results/exs_pingpong_modes.svg)", "", END]
    return "\n".join(L) + "\n"


def splice(doc, section):
    if BEGIN in doc and END in doc:
        a = doc.index(BEGIN)
        b = doc.index(END) + len(END)
        rest = doc[b:]
        if rest.startswith("\n"):
            rest = rest[1:]
        return doc[:a] + section + rest
    return doc.rstrip("\n") + "\n\n" + section


def selftest():
    rows = []
    for rep in (1, 2, 3):
        for k, g, rtt in (("kernel-tcp", 2.0, 30.0), ("courier-shm", 7.0, 6.0), ("courier-tcp", 1.9, 32.0)):
            rows.append({"rep": rep, "phase": "target", "test": "blast", "over": k, "busy": 0, "pinned": 0,
                         "size": 524288, "outstanding": 4, "msgs": 100, "secs": 0.1, "gbps": g,
                         "snd_user": 0.01, "snd_sys": 0.02 if k != "courier-shm" else 0.01,
                         "rcv_user": 0.0, "rcv_sys": 0.02 if k != "courier-shm" else 0.0})
            rows.append({"rep": rep, "phase": "target", "test": "pingpong", "over": k, "busy": 1, "pinned": 0,
                         "size": 8, "iters": 100, "rtt_median_us": rtt, "rtt_mean_us": rtt,
                         "cli_cpu": 1, "srv_cpu": 1})
    assert target_rows(rows, pinned=1)[0][3] == "-", target_rows(rows, pinned=1)
    t = target_rows(rows)
    assert t[0][-1] == "MET" and t[0][3].startswith("3.50x"), t[0]
    assert t[1][-1] == "MET" and t[1][3] == "0.200x", t[1]
    assert t[2][-1] == "MET" and t[2][3] == "0.95x", t[2]
    doc = "# R\n\nother\n"
    once = splice(doc, BEGIN + "\nA\n" + END + "\n")
    twice = splice(once, BEGIN + "\nB\n" + END + "\n")
    assert twice.count(BEGIN) == 1 and "B" in twice and "A\n" not in twice and twice.startswith("# R"), twice
    print("report.py selftest: OK")


def main(argv):
    if len(argv) == 2 and argv[1] == "selftest":
        selftest()
        return 0
    if len(argv) != 4:
        print(__doc__)
        return 2
    rows = load(argv[1])
    os.makedirs(argv[3], exist_ok=True)
    section = render(rows, argv[3])
    with open(argv[2]) as f:
        doc = f.read()
    with open(argv[2], "w") as f:
        f.write(splice(doc, section))
    print(f"report: {len(rows)} runs; EXS section of {argv[2]} written")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
