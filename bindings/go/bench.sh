#!/usr/bin/env bash
# Go binding benchmark: builds cmd/goperftest, runs server and client pinned to different
# CPUs (taskset -c $SERVER_CPU / -c $CLIENT_CPU), 5 repetitions per point (Go and native
# alternating), and prints the medians as one JSON line per point:
#   8 B      active-message ping-pong latency (one-way, RTT/2)   goperftest -lat
#   1, 4, 16 MiB  active-message bandwidth (window of 32)       goperftest
# With NATIVE=1 the same points run with `target/release/courier perf` (-t ucp_am_lat /
# ucp_am_bw) and print lines with "impl":"native" next to "impl":"go"; the native line also
# carries the paired comparison (median over repetitions of Go / native bandwidth and of
# Go - native latency, each repetition's two runs being next to each other in time), and
# each repetition's two values ("go_values", "native_values").
# With PROBE set to a build of bench/ceilings.c, the machine's speed is probed before and
# after every run (its `cacheline 20000`, one-way us), and the native line carries the four
# probes of each repetition ("probes"): bench/report.py `go` judges on the repetitions whose
# probes agree, as `make bench` judges Courier against UCX.
#
# Environment: REPS (5), SIZES ("8 1048576 4194304 16777216"), SERVER_CPU (0),
# CLIENT_CPU (1), PORT (first port, 13400), COURIER_TLS (as usual), NATIVE (0),
# ITERS_LAT / ITERS_BW_1M / ITERS_BW_4M / ITERS_BW_16M, GOPERFTEST_FLAGS (e.g. -wakeup),
# GOPERFTEST_BIN (a prebuilt goperftest: skip the build), PROBE (none).
# Needs target/release/libcourier.a (make capi). Run from anywhere.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
REPS=${REPS:-5}
SIZES=${SIZES:-"8 1048576 4194304 16777216"}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
PORT=${PORT:-13400}
NATIVE=${NATIVE:-0}
ITERS_LAT=${ITERS_LAT:-100000}
# Bandwidth runs of about 0.2-0.4 s each at this machine's 60-140 GB/s: shorter ones (40 ms
# at 4 MiB) read a few percent either way from run to run.
ITERS_BW_1M=${ITERS_BW_1M:-30000}
ITERS_BW_4M=${ITERS_BW_4M:-5000}
ITERS_BW_16M=${ITERS_BW_16M:-1500}
# Every run warms up with as many messages as it measures, both implementations: a process's
# rendezvous copies take a few tenths of a second to reach full speed (the Go server's
# first 15,000 copies of 512 KiB ran at 58-77 GB/s, then 88-99; the native one's first
# 5,000 at 79, then 86), and a warm-up of a tenth of the run left that in the measurement.
PROBE=${PROBE:-}
GOPERFTEST_FLAGS=${GOPERFTEST_FLAGS:-}

bin="${GOPERFTEST_BIN:-$root/target/goperftest}"
if [ -z "${GOPERFTEST_BIN:-}" ]; then
    # The library's digest in courier.LibBuild: Go's build cache would otherwise relink a
    # rebuilt library's old copy (it does not look at libcourier.a).
    libbuild=$(sha256sum "$root/target/release/libcourier.a" | cut -c1-16)
    (cd "$here" && go build -ldflags="-X=courier.dev/courier.LibBuild=$libbuild" -o "$bin" ./cmd/goperftest)
fi
native="$root/target/release/courier"

pin() { # pin CPU cmd...: taskset when there is such a CPU, else unpinned
    local cpu=$1; shift
    if command -v taskset >/dev/null && taskset -c "$cpu" true 2>/dev/null; then
        taskset -c "$cpu" "$@"
    else
        "$@"
    fi
}

wait_listen() { # wait until something listens on TCP port $1 (up to 10 s)
    for _ in $(seq 100); do
        if command -v ss >/dev/null; then
            # without connecting (a probe connection would be a failed client to the server)
            if ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; then return 0; fi
        elif (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    echo "bench.sh: nothing listens on port $1" >&2
    return 1
}

field() { # field NAME < json: the number after "NAME":
    sed -n "s/.*\"$1\":\([-0-9.eE+]*\).*/\1/p"
}

# shellcheck source=/dev/null
. "$root/bench/probe.sh"
probe() { # probe_us, or null
    local v
    v=$(probe_us) || v=""
    echo "${v:-null}"
}

json_list() { # the arguments as a JSON list (an empty one as null)
    local out="" x
    for x in "$@"; do out+="${out:+,}${x:-null}"; done
    echo "[$out]"
}

median() { # median of the numbers on stdin
    sort -g | awk '{a[NR]=$1} END {if (NR==0) print "null"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'
}

iters_for() {
    case $1 in
        8) echo "$ITERS_LAT" ;;
        1048576) echo "$ITERS_BW_1M" ;;
        4194304) echo "$ITERS_BW_4M" ;;
        16777216) echo "$ITERS_BW_16M" ;;
        *) echo 1000 ;;
    esac
}

# One run of goperftest; prints its JSON line.
run_go() { # size iters lat(0/1)
    local size=$1 iters=$2 lat=$3 port=$((PORT++)) flags=()
    [ "$lat" = 1 ] && flags+=(-lat)
    # shellcheck disable=SC2206
    flags+=($GOPERFTEST_FLAGS)
    pin "$SERVER_CPU" "$bin" -p "$port" -s "$size" "${flags[@]}" &
    local srv=$!
    wait_listen "$port"
    pin "$CLIENT_CPU" "$bin" -i 127.0.0.1 -p "$port" -s "$size" -n "$iters" -warmup "$iters" -json "${flags[@]}"
    wait "$srv"
}

# One run of the native perftest; prints its JSON line.
run_native() { # size iters lat(0/1)
    local size=$1 iters=$2 lat=$3 port=$((PORT++)) test=ucp_am_bw
    [ "$lat" = 1 ] && test=ucp_am_lat
    pin "$SERVER_CPU" "$native" perf -p "$port" >/dev/null &
    local srv=$!
    wait_listen "$port"
    pin "$CLIENT_CPU" "$native" perf 127.0.0.1 -p "$port" -t "$test" -s "$size" -n "$iters" -w "$iters" --json | grep '^{'
    wait "$srv"
}

for size in $SIZES; do
    lat=0; test=am_bw
    if [ "$size" -le 8 ]; then lat=1; test=am_lat; fi
    iters=$(iters_for "$size")
    lats=(); gbps=(); mbs=(); nlats=(); nmbs=(); probes=()
    # Go and native alternate run by run, so that the machine's drift reaches both alike.
    for _ in $(seq "$REPS"); do
        gb=$(probe)
        j=$(run_go "$size" "$iters" "$lat")
        ga=$(probe)
        lats+=("$(field latency_us <<<"$j")")
        gbps+=("$(field bandwidth_gbps <<<"$j")")
        mbs+=("$(field bandwidth_mbs <<<"$j")")
        if [ "$NATIVE" = 1 ]; then
            nb=$(probe)
            j=$(run_native "$size" "$iters" "$lat")
            na=$(probe)
            nlats+=("$(field latency_avg_us <<<"$j")")
            nmbs+=("$(field bandwidth_avg_mbs <<<"$j")")
            probes+=("[$gb,$ga,$nb,$na]")
        fi
    done
    printf '{"impl":"go","test":"%s","size":%d,"iterations":%d,"reps":%d,"latency_us":%s,"bandwidth_gbps":%s,"bandwidth_mbs":%s}\n' \
        "$test" "$size" "$iters" "$REPS" \
        "$(printf '%s\n' "${lats[@]}" | median)" "$(printf '%s\n' "${gbps[@]}" | median)" "$(printf '%s\n' "${mbs[@]}" | median)"
    if [ "$NATIVE" = 1 ]; then
        m=$(printf '%s\n' "${nmbs[@]}" | median)
        # Each repetition's own comparison (Go's run and the native run right after it
        # share the machine's state, where the two medians may not): the median of the
        # bandwidth ratios Go / native and of the latency differences Go - native.
        pr=$(for i in "${!mbs[@]}"; do awk -v g="${mbs[$i]}" -v n="${nmbs[$i]}" 'BEGIN {if (n > 0) printf "%.6f\n", g / n}'; done | median)
        pd=$(for i in "${!lats[@]}"; do awk -v g="${lats[$i]}" -v n="${nlats[$i]}" 'BEGIN {printf "%.6f\n", g - n}'; done | median)
        if [ "$lat" = 1 ]; then gv=("${lats[@]}") nv=("${nlats[@]}"); else gv=("${mbs[@]}") nv=("${nmbs[@]}"); fi
        printf '{"impl":"native","test":"ucp_%s","size":%d,"iterations":%d,"reps":%d,"latency_us":%s,"bandwidth_gbps":%s,"bandwidth_mbs":%s,"paired_bw_ratio":%s,"paired_lat_diff_us":%s,"go_values":%s,"native_values":%s,"probes":%s}\n' \
            "$test" "$size" "$iters" "$REPS" \
            "$(printf '%s\n' "${nlats[@]}" | median)" "$(awk -v m="$m" 'BEGIN {printf "%.6f", m * 1048576 * 8 / 1e9}')" "$m" "$pr" "$pd" \
            "$(json_list "${gv[@]}")" "$(json_list "${nv[@]}")" "$(json_list "${probes[@]}")"
    fi
done
