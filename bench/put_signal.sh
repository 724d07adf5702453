#!/usr/bin/env bash
# Signaling put against its parts (issue 3): `courier perf` runs ucp_put_lat,
# put_signal_lat and put_flush_signal_lat (a put, a flush, then an atomic swap of the
# signal) alternately, REPS repetitions each, on shared memory (the default transports) and
# over tcp (COURIER_TLS=tcp, where a flush is a round trip), and prints one JSON line per run:
#   {"tls": "shm"|"tcp", "test": "...", "rep": N, "latency_us": 50%ile one-way latency,
#    "latency_avg_us": the average, "probe_us": [before, after]}
# The 50%ile moves in steps of the clock's (0.005 us one-way here, an eighth of a put), the
# average does not. With PROBE set to a build of bench/ceilings.c, the machine's speed is
# probed before and after every run (`cacheline 20000`, one-way us; else null), for
# bench/report.py `signal` to judge on the repetitions at one speed.
# Environment: COURIER (binary), REPS (3), ITERS (200000 on shm), ITERS_TCP (20000),
# SERVER_CPU (0), CLIENT_CPU (1), PORT (first port, 13600), PROBE (none).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
COURIER=${COURIER:-$here/../target/release/courier}
REPS=${REPS:-3}
ITERS=${ITERS:-200000}
ITERS_TCP=${ITERS_TCP:-20000}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
port=${PORT:-13600}
PROBE=${PROBE:-}
# shellcheck source=/dev/null
. "$here/probe.sh"
probe() { # probe_us, or null
    local v
    v=$(probe_us) || v=""
    echo "${v:-null}"
}
for tls in shm tcp; do
    if [ "$tls" = tcp ]; then env=(COURIER_TLS=tcp); n=$ITERS_TCP; else env=(-u COURIER_TLS); n=$ITERS; fi
    for rep in $(seq 1 "$REPS"); do
        for t in ucp_put_lat put_signal_lat put_flush_signal_lat; do
            port=$((port + 1))
            before=$(probe)
            env "${env[@]}" taskset -c "$SERVER_CPU" timeout 120 "$COURIER" perf -p "$port" >/dev/null 2>&1 &
            srv=$!
            sleep 0.3
            out=$(env "${env[@]}" taskset -c "$CLIENT_CPU" timeout 100 "$COURIER" perf 127.0.0.1 -p "$port" \
                -t "$t" -s 8 -n "$n" --json 2>/dev/null | tail -n 1) || out=""
            wait "$srv" || true
            after=$(probe)
            lat=$(printf '%s' "$out" | grep -o '"latency_percentile_us":[^,}]*' | cut -d: -f2)
            avg=$(printf '%s' "$out" | grep -o '"latency_avg_us":[^,}]*' | cut -d: -f2)
            printf '{"tls": "%s", "test": "%s", "rep": %s, "latency_us": %s, "latency_avg_us": %s, "probe_us": [%s, %s]}\n' \
                "$tls" "$t" "$rep" "${lat:-null}" "${avg:-null}" "$before" "$after"
        done
    done
done
