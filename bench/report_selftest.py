"""`python3 bench/report.py selftest`: the parsers and the judging of bench/report.py and
bench/sections.py against canned outputs."""

from __future__ import annotations

import json
import statistics

from report import (FLOOR_TEST, MIB, SWEEP_SIZES, load_summary, metric_value, one_speed,
                    paired_ratios, parse_courier_json, parse_fi, parse_floor, parse_row8, plan,
                    sweep_rows, target_rows)
from sections import render_ceilings, render_go, render_large, render_signal


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

    # tcp ucp_fadd is judged against the kernel's round trip measured next to it (the
    # floor), not against UCX: 8.4 us against an 8.9 us floor is 0.94 <= 1.1 whatever UCX did.
    assert parse_floor('noise\n{"what": "tcp_pingpong", "conns": 1, "rtt_us": 8.890, '
                       '"oneway_us": 4.445}\n') == {"lat_p50_us": 8.89, "oneway_us": 4.445}
    assert parse_floor('{"what": "shm_pingpong", "rtt_us": 0.1}') is None
    assert any(l.split()[:3] == ["target", "tcp", FLOOR_TEST] and l.endswith(" floor")
               for l in plan(False))
    def fadd_runs(tool, test, lats):
        return [dict(run(tool, i + 1, lat), kind="target", transport="tcp", test=test, size=8)
                for i, lat in enumerate(lats)]
    runs = (fadd_runs("courier", "ucp_fadd", [8.4, 8.3, 8.5]) + fadd_runs("ucx", "ucp_fadd", [4.0] * 3)
            + fadd_runs("floor", FLOOR_TEST, [8.9, 8.8, 9.0]))
    row = next(r for r in target_rows(runs) if r["test"] == "ucp_fadd" and r["tls"] == "tcp")
    assert row["verdict"] == "PASS" and round(row["judged"], 3) == 0.944, row
    assert row["floor"]["median"] == 8.9 and row["ucx"]["median"] == 4.0, row
    row = next(r for r in target_rows(runs[:6]) if r["test"] == "ucp_fadd" and r["tls"] == "tcp")
    assert row["verdict"] == "no floor measured", row

    # Sweep points: judged like the targets, against parity (lat <= 1.0, bw >= 1.0), the
    # sizes reaching 64 MiB.
    assert SWEEP_SIZES[-2:] == [32 * MIB, 64 * MIB] and SWEEP_SIZES[0] == 1
    def sweep_runs(tool, test, size, vals, speeds):
        key = "lat_p50_us" if test.endswith("_lat") else "bw_overall_mbs"
        return [dict(run(tool, i + 1, 0, probes=sp), kind="sweep", transport="shm", test=test,
                     size=size, numbers={key: v}) for i, (v, sp) in enumerate(zip(vals, speeds))]
    one = [fast] * 4
    runs = (sweep_runs("courier", "tag_bw", 16, [200.0, 210.0, 90.0, 205.0], one[:2] + [slow] + [fast])
            + sweep_runs("ucx", "tag_bw", 16, [190.0, 200.0, 100.0, 200.0], one)
            + sweep_runs("courier", "tag_lat", 64, [0.20, 0.21, 0.19], one)
            + sweep_runs("ucx", "tag_lat", 64, [0.18, 0.18, 0.18], one))
    sw = sweep_rows(runs)
    bw = sw[("shm", "tag_bw", 16)]
    assert bw["verdict"] == "PASS" and bw["judged_on"] == "one-speed pairs" and bw["pairs_same"] == 3, bw
    lat = sw[("shm", "tag_lat", 64)]
    assert lat["verdict"] == "MISS" and round(lat["judged"], 3) == 1.111, lat
    assert sw[("shm", "tag_lat", 64 * MIB)]["courier"]["runs"] == 0
    assert "median was" not in load_summary([dict(load1=x) for x in (1.0, 3.0, 2.0)])
    assert "was 2.0 in the median" in load_summary([dict(load1=x) for x in (1.0, 3.0, 2.0)])

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
    # Large messages: wall time judged on the repetitions' own ratios (at most 1.5), RSS
    # medians in MiB; a failed run is said, not judged.
    def big(tool, rep, wall, crss, srss, rc=0, probes=(0.05, 0.05)):
        return json.dumps({"command": "64 MiB, -n 10", "options": "-t tag_bw -s 67108864 -n 10",
                           "tool": tool, "rep": rep, "rc": rc, "wall_s": wall,
                           "client_rss_kib": crss, "server_rss_kib": srss,
                           "probe_us": list(probes)})
    lg = render_large([big("courier", 1, 1.2, 71 << 10, 72 << 10), big("ucx", 1, 1.0, 6 << 10, 72 << 10),
                       big("courier", 2, 1.4, 71 << 10, 70 << 10), big("ucx", 2, 1.0, 6 << 10, 72 << 10),
                       big("courier", 3, 9.0, 71 << 10, 70 << 10, probes=(0.2, 0.2)),
                       big("ucx", 3, 1.0, 6 << 10, 72 << 10),
                       big("courier", 4, 1.3, 0, 0, rc=None), big("ucx", 4, 1.0, 6 << 10, 72 << 10),
                       "not json"])
    assert "| `-t tag_bw -s 67108864 -n 10` | 1.40 | 1.00 | 1.40 (3) | all pairs | <= 1.5 | MISS (1 runs failed or timed out) | 71 / 70 | 6 / 72 |" in lg, lg
    print("selftest ok")
