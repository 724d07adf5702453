#!/usr/bin/env python3
"""Job start-up and footprint: `courier run` against Open MPI's `mpirun`, in one run.

  startup.py measure [--reps R] [--sizes 2,4,...] --out results/startup.jsonl
      builds nothing (bench/startup.sh does); runs, alternating launcher by launcher:
      - start-up: `courier run -n 4 job_scale barrier`, `mpirun -n 4 mpi_barrier` (MPI_Init,
        MPI_Barrier, MPI_Finalize) and `mpirun -n 4 job_scale barrier` (Courier's program
        under mpirun, through PMIx), wall time of each;
      - scale: `job_scale scale` for each N under courier run and mpirun: time from the
        launcher's start to the first barrier, memory, descriptors, sockets and endpoints
        per process after the barrier, after a ring (lazy) and after connecting to all (eager).
  startup.py render results/startup.jsonl    the RESULTS.md section (markdown)
  startup.py table results/startup.jsonl     the scale table for docs/scale.md
  startup.py selftest                        render a made-up run and check it (make test)
"""
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
COURIER = os.path.join(ROOT, "target/release/courier")
JOB = os.path.join(ROOT, "target/bench/job_scale")
MPI = os.path.join(ROOT, "target/bench/mpi_barrier")
MPIRUN = ["mpirun.openmpi", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none"]
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def launch(kind, n, prog):
    if kind == "courier run":
        return [COURIER, "run", "-n", str(n)] + prog
    return MPIRUN + ["-n", str(n)] + prog


def timed(cmd, env=ENV):
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    wall = time.perf_counter() - t
    return p.returncode, wall, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def measure(args):
    reps = int(args.get("--reps", "15"))
    sizes = [int(s) for s in args.get("--sizes", "2,4,8,16,32,64").split(",")]
    out = open(args["--out"], "w")
    cases = [
        ("courier run", "courier job", [JOB, "barrier"]),
        ("mpirun", "MPI program", [MPI]),
        ("mpirun", "courier job", [JOB, "barrier"]),
    ]
    for rep in range(reps):
        order = cases if rep % 2 == 0 else list(reversed(cases))
        for launcher, prog, cmd in order:
            rc, wall, o, e = timed(launch(launcher, 4, cmd))
            rec = {"section": "startup", "rep": rep, "launcher": launcher, "program": prog,
                   "n": 4, "rc": rc, "wall_s": wall}
            if rc != 0:
                rec["stderr"] = e[-2000:]
            out.write(json.dumps(rec) + "\n")
            out.flush()
    for n in sizes:
        for rep in range(3):
            for launcher in (["courier run", "mpirun"] if rep % 2 == 0 else ["mpirun", "courier run"]):
                env = dict(ENV, BENCH_T0=str(time.time_ns()))
                rc, wall, o, e = timed(launch(launcher, n, [JOB, "scale"]), env)
                ranks = []
                for line in o.splitlines():
                    try:
                        ranks.append(json.loads(line))
                    except ValueError:
                        pass
                rec = {"section": "scale", "rep": rep, "launcher": launcher, "n": n, "rc": rc,
                       "wall_s": wall, "ranks": ranks}
                if rc != 0 or len(ranks) != n:
                    rec["stderr"] = e[-2000:]
                out.write(json.dumps(rec) + "\n")
                out.flush()
    return 0


def load(path):
    with open(path) as fh:
        return [json.loads(l) for l in fh if l.strip()]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def render(path):
    recs = load(path)
    st = [r for r in recs if r["section"] == "startup"]
    groups = {}
    for r in st:
        groups.setdefault((r["launcher"], r["program"]), []).append(r)
    cr = [r["wall_s"] for r in groups.get(("courier run", "courier job"), []) if r["rc"] == 0]
    mp = [r["wall_s"] for r in groups.get(("mpirun", "MPI program"), []) if r["rc"] == 0]
    # Paired: each courier run against the mpirun run of the same repetition.
    pairs = {}
    for r in st:
        pairs.setdefault(r["rep"], {})[(r["launcher"], r["program"])] = r
    ratios = [p[("courier run", "courier job")]["wall_s"] / p[("mpirun", "MPI program")]["wall_s"]
              for p in pairs.values()
              if ("courier run", "courier job") in p and ("mpirun", "MPI program") in p]
    lines = ["## Job start-up (courier run against Open MPI's mpirun, same machine, same run)", ""]
    lines.append(f"`bench/startup.sh`: {len(pairs)} repetitions, launchers alternating; wall time of a "
                 "4-rank job that starts, passes one barrier and exits (`bench/job_scale.c barrier`; "
                 "for mpirun, `bench/mpi_barrier.c`: MPI_Init, MPI_Barrier, MPI_Finalize). "
                 "Target: courier run at most 0.3 × mpirun.")
    lines.append("")
    lines.append("| launcher | program | runs ok | median wall (ms) | min (ms) |")
    lines.append("| --- | --- | --- | --- | --- |")
    for (l, p), rs in sorted(groups.items()):
        ok = [r["wall_s"] for r in rs if r["rc"] == 0]
        lines.append(f"| {l} | {p} | {len(ok)}/{len(rs)} | {med(ok) * 1000:.1f} | "
                     f"{(min(ok) if ok else float('nan')) * 1000:.1f} |")
    ratio = med(cr) / med(mp) if cr and mp else float("nan")
    verdict = "PASS" if ratio <= 0.3 else "MISS"
    lines.append("")
    lines.append(f"Ratio of medians, courier run / mpirun (MPI program): **{ratio:.3f}** "
                 f"(paired median {med(ratios):.3f}) — {verdict} against 0.3.")
    loadavg = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else ["?"]
    lines.append(f"Machine: {os.cpu_count()} CPUs, load average {' '.join(loadavg)} when rendered. "
                 "Per-N start-up, memory and descriptors: `docs/scale.md`; raw runs: "
                 "`results/startup.jsonl`.")
    lines.append("")
    return "\n".join(lines)


def table(path):
    recs = [r for r in load(path) if r["section"] == "scale"]
    by = {}
    for r in recs:
        by.setdefault((r["n"], r["launcher"]), []).append(r)
    lines = ["| N | launcher | runs ok | wall (ms) | to first barrier (ms) | RSS KiB (barrier / lazy ring / all) "
             "| fds (barrier / ring / all) | sockets (barrier / ring / all) | endpoints (ring / all) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (n, l) in sorted(by):
        rs = by[(n, l)]
        ok = [r for r in rs if r["rc"] == 0 and len(r["ranks"]) == n]
        if not ok:
            lines.append(f"| {n} | {l} | 0/{len(rs)} | | | | | | |")
            continue
        wall = med([r["wall_s"] * 1000 for r in ok])
        tb = med([max(x["t_barrier_ms"] for x in r["ranks"]) for r in ok])
        def per(key, i):
            return med([med([x[key][i] for x in r["ranks"]]) for r in ok])
        rss = " / ".join(f"{per('rss_kib', i):.0f}" for i in range(3))
        fds = " / ".join(f"{per('fds', i):.0f}" for i in range(3))
        sk = " / ".join(f"{per('sockets', i):.0f}" for i in range(3))
        eps = " / ".join(f"{per('endpoints', i):.0f}" for i in (1, 2))
        lines.append(f"| {n} | {l} | {len(ok)}/{len(rs)} | {wall:.0f} | {tb:.0f} | {rss} | {fds} | {sk} | {eps} |")
    return "\n".join(lines)


def selftest():
    """Render a made-up run: two repetitions, courier run 10 and 30 ms, mpirun 100 and 200 ms."""
    import tempfile
    recs = []
    for rep, (c, m) in enumerate([(0.010, 0.100), (0.030, 0.200)]):
        recs.append({"section": "startup", "rep": rep, "launcher": "courier run",
                     "program": "courier job", "wall_s": c, "rc": 0})
        recs.append({"section": "startup", "rep": rep, "launcher": "mpirun",
                     "program": "MPI program", "wall_s": m, "rc": 0})
    recs.append({"section": "startup", "rep": 2, "launcher": "mpirun", "program": "MPI program",
                 "wall_s": 9.0, "rc": 1})
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as fh:
        fh.write("\n".join(json.dumps(r) for r in recs) + "\n")
    try:
        text = render(fh.name)
    finally:
        os.unlink(fh.name)
    want = ["| courier run | courier job | 2/2 | 20.0 | 10.0 |",
            "| mpirun | MPI program | 2/3 | 150.0 | 100.0 |",
            "**0.133** (paired median 0.125) — PASS against 0.3."]
    missing = [w for w in want if w not in text]
    for w in missing:
        print(f"startup.py selftest: expected in the rendering: {w}", file=sys.stderr)
    if missing:
        print(text, file=sys.stderr)
        return 1
    print("startup.py selftest: ok")
    return 0


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "measure":
        args = dict(zip(rest[::2], rest[1::2]))
        return measure(args)
    if cmd == "render":
        print(render(rest[0]))
        return 0
    if cmd == "table":
        print(table(rest[0]))
        return 0
    if cmd == "selftest":
        return selftest()
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
