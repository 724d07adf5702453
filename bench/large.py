#!/usr/bin/env python3
"""Large messages as a ucx_perftest user first types them (issue 31's table): each command's
wall time and both processes' peak resident memory, Courier against ucx_perftest, the two
alternating run by run.

  python3 bench/large.py [REPS]        one JSON line per run on stdout

Environment: COURIER (the courier binary; default target/release/courier), SERVER_CPU,
CLIENT_CPU (0 and 1), PROBE (bench/ceilings.c built: each run is bracketed by its speed
probe), LARGE_TIMEOUT (seconds a client may run, 120). Both tools run over tcp
(COURIER_TLS=tcp, UCX_TLS=tcp), the server pinned to SERVER_CPU, the client to CLIENT_CPU.
The wall time is the client's, from its start to its exit (set-up, warm-up, the measured
iterations and the teardown); the peak RSS of each process comes from the kernel's
accounting of the finished process (wait4), so no `time` command is needed.
`report.py large FILE` renders the section from these lines.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Issue 31's table: (what, ucx_perftest's options). Sizes in bytes, as ucx_perftest takes them.
COMMANDS = [
    ("64 MiB, -n 10", ["-t", "tag_bw", "-s", str(64 << 20), "-n", "10"]),
    ("32 MiB, -n 10", ["-t", "tag_bw", "-s", str(32 << 20), "-n", "10"]),
    ("16 MiB, -n 10", ["-t", "tag_bw", "-s", str(16 << 20), "-n", "10"]),
    ("64 MiB, -n 10 -w 1", ["-t", "tag_bw", "-s", str(64 << 20), "-n", "10", "-w", "1"]),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    """Whether something listens on `port` (a connect would be taken for the client by
    ucx_perftest's server: the kernel's table of listening sockets is read instead)."""
    try:
        with open("/proc/net/tcp") as fh:
            rows = fh.read().splitlines()[1:]
    except OSError:
        return False
    want = f":{port:04X}"
    return any(r.split()[1].endswith(want) and r.split()[3] == "0A" for r in rows)


def probe() -> float | None:
    p = os.environ.get("PROBE")
    if not p:
        return None
    try:
        out = subprocess.run([p, "cacheline", "20000"], capture_output=True, text=True,
                             timeout=10).stdout
        return float(json.loads(out.strip().splitlines()[-1])["oneway_us"])
    except (OSError, ValueError, KeyError, IndexError, subprocess.SubprocessError):
        return None


def wait_rss(proc: subprocess.Popen, limit: float) -> tuple[int | None, int | None]:
    """Wait for `proc` (at most `limit` seconds, then kill it): (exit code, peak RSS KiB)."""
    end = time.monotonic() + limit
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_maxrss
        if time.monotonic() > end:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            return None, usage.ru_maxrss
        time.sleep(0.01)


def run(tool: str, opts: list[str], courier: str, cpus: tuple[str, str], limit: float) -> dict:
    port = free_port()
    env = dict(os.environ)
    if tool == "ucx":
        env["UCX_TLS"] = "tcp"
        srv = ["ucx_perftest", "-p", str(port)]
        cli = ["ucx_perftest", "127.0.0.1", "-p", str(port)] + opts
    else:
        env["COURIER_TLS"] = "tcp"
        srv = [courier, "perf", "-p", str(port)]
        cli = [courier, "perf", "127.0.0.1", "-p", str(port)] + opts
    before = probe()
    s = subprocess.Popen(["taskset", "-c", cpus[0]] + srv, env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not listening(port) and s.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    t0 = time.monotonic()
    c = subprocess.Popen(["taskset", "-c", cpus[1]] + cli, env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    # The client's output is a few kilobytes: it fits the pipe until the client exits.
    rc, crss = wait_rss(c, limit)
    wall = time.monotonic() - t0
    out = c.stdout.read() if c.stdout else ""
    src, srss = wait_rss(s, 30 if rc is not None else 2)
    after = probe()
    return {"tool": tool, "rc": rc, "server_rc": src, "wall_s": round(wall, 3),
            "client_rss_kib": crss, "server_rss_kib": srss, "probe_us": [before, after],
            "load1": float(open("/proc/loadavg").read().split()[0]),
            "final": (out.strip().splitlines() or [""])[-1]}


def main(argv: list[str]) -> int:
    reps = int(argv[0]) if argv else 3
    courier = os.environ.get("COURIER", os.path.join(ROOT, "target", "release", "courier"))
    cpus = (os.environ.get("SERVER_CPU", "0"), os.environ.get("CLIENT_CPU", "1"))
    limit = float(os.environ.get("LARGE_TIMEOUT", "120"))
    tools = ["courier", "ucx"]
    i = 0
    for what, opts in COMMANDS:
        for rep in range(1, reps + 1):
            i += 1
            for tool in (tools if i % 2 else tools[::-1]):
                r = run(tool, opts, courier, cpus, limit)
                r.update(command=what, options=" ".join(opts), rep=rep)
                print(json.dumps(r), flush=True)
                print(f"[large] {what} r{rep} {tool}: {r['wall_s']} s, rc {r['rc']}, RSS "
                      f"{r['client_rss_kib']} / {r['server_rss_kib']} KiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
