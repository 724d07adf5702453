#!/usr/bin/env bash
# Authentication is done once, at wireup: show that the data path did not move.
# An alternating A/B of `courier perf -t tag_lat` between two builds, server and client as
# separate processes pinned to their own CPUs, on shm and on tcp:
#   before      the build BEFORE (no authentication)
#   after       the build AFTER, no key (COURIER_AUTH=auto: local peers)
#   after+key   the build AFTER, both sides with the same key file (every link authenticated)
# Prints one line per run and the median per variant and transport (median of the runs'
# 50th-percentile latencies), with the ratio to `before`.
#
# usage: bench/auth_ab.sh BEFORE_COURIER AFTER_COURIER [ROUNDS] [ITERS]
set -euo pipefail
before=${1:?usage: $0 BEFORE_COURIER AFTER_COURIER [ROUNDS] [ITERS]}
after=${2:?usage: $0 BEFORE_COURIER AFTER_COURIER [ROUNDS] [ITERS]}
rounds=${3:-7}
iters=${4:-200000}
cpus=$(nproc)
srv_cpu=0
cli_cpu=$((cpus > 1 ? 1 : 0))
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
head -c 32 /dev/urandom >"$dir/key"
chmod 600 "$dir/key"
port=$((20000 + RANDOM % 20000))

run() { # variant tls -> p50 latency (us)
    local variant=$1 tls=$2 bin env=()
    case $variant in
    before) bin=$before ;;
    after) bin=$after ;;
    after+key) bin=$after env=(COURIER_AUTH_KEY_FILE="$dir/key") ;;
    esac
    port=$((port + 1))
    env "${env[@]}" COURIER_TLS="$tls" taskset -c $srv_cpu "$bin" perf -p $port >/dev/null 2>&1 &
    local srv=$!
    local out=""
    for _ in $(seq 50); do
        if out=$(env "${env[@]}" COURIER_TLS="$tls" taskset -c $cli_cpu "$bin" perf 127.0.0.1 -p $port \
            -t tag_lat -n "$iters" --json 2>/dev/null); then
            break
        fi
        sleep 0.1
    done
    kill "$srv" 2>/dev/null || true
    wait "$srv" 2>/dev/null || true
    python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["latency_percentile_us"])' <<<"$out"
}

for tls in shm,self tcp,self; do
    for r in $(seq "$rounds"); do
        for v in before after after+key; do
            echo "$tls $v $r $(run $v $tls)"
        done
    done
done | tee "$dir/runs"
python3 - "$dir/runs" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
res = {}
for tls, v, _, lat in rows:
    res.setdefault((tls.split(',')[0], v), []).append(float(lat))
for tls in ("shm", "tcp"):
    base = statistics.median(res[(tls, "before")])
    for v in ("before", "after", "after+key"):
        m = statistics.median(res[(tls, v)])
        print(f"{tls:4} {v:10} median p50 {m:8.3f} us  ratio {m / base:.3f}  (n={len(res[(tls, v)])})")
EOF
