#!/usr/bin/env bash
# The C ABI's hot path before and after a change, run alternately against two builds of
# libcourier.so and pinned to the same CPUs; prints each run, the medians and the ratio
# after / before:
# - hot.c: an 8-byte tag ping-pong between two processes through courier_worker_tag_recv /
#   courier_ep_tag_send / courier_request_wait / _info / _free (CPUs BENCH_CPUS, 0,1);
# - calls.c: one call's cost in one process, no data moved (courier_request_test,
#   courier_worker_progress, courier_ep_status, and a request made, used and freed), on
#   CPU BENCH_CALLS_CPU (1). It shows a per-call change that the ping-pong's noise hides.
#
#   bench/capi_handles/run.sh BEFORE_DIR AFTER_DIR [RUNS] [ITERS]
#
# BEFORE_DIR and AFTER_DIR each hold a libcourier.so (e.g. a copy of target/release/ from
# each commit). COURIER_TLS chooses the transport (default: all, so shm between processes).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
before="$(cd "$1" && pwd)"; after="$(cd "$2" && pwd)"
runs="${3:-7}"; iters="${4:-100000}"
cpus="${BENCH_CPUS:-0,1}"
bin="$(mktemp -d)/hot"
trap 'rm -rf "$(dirname "$bin")"' EXIT
cc -O2 -std=c11 -D_DEFAULT_SOURCE -I"$root/crates/courier-capi/include" "$here/hot.c" -o "$bin" \
  -L"$after" -lcourier
cc -O2 -std=c11 -D_DEFAULT_SOURCE -I"$root/crates/courier-capi/include" "$here/calls.c" \
  -o "$bin-calls" -L"$after" -lcourier
one() { LD_LIBRARY_PATH="$1" taskset -c "$cpus" timeout 300 "$bin" "$iters" | awk '/round_trip_ns/ {print $2}'; }
b=(); a=()
for ((i = 0; i < runs; i++)); do
  x="$(one "$before")"; y="$(one "$after")"
  echo "run $i: before ${x} ns  after ${y} ns"
  b+=("$x"); a+=("$y")
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
mb="$(median "${b[@]}")"; ma="$(median "${a[@]}")"
echo "median round trip: before ${mb} ns, after ${ma} ns, ratio after/before $(awk -v a="$ma" -v b="$mb" 'BEGIN {printf "%.3f", a/b}')"

calls="$(dirname "$bin")/calls.txt"
for ((i = 0; i < runs; i++)); do
  for v in before after; do
    d="$before"; [ "$v" = after ] && d="$after"
    LD_LIBRARY_PATH="$d" taskset -c "${BENCH_CALLS_CPU:-1}" timeout 300 "$bin-calls" 1000000 | sed "s/^/$v /"
  done
done > "$calls"
for k in test_ns progress_ns status_ns cycle_ns; do
  mb="$(median $(awk -v k="$k" '$1 == "before" && $2 == k {print $3}' "$calls"))"
  ma="$(median $(awk -v k="$k" '$1 == "after" && $2 == k {print $3}' "$calls"))"
  echo "per call ${k%_ns}: before ${mb} ns, after ${ma} ns, after - before $(awk -v a="$ma" -v b="$mb" 'BEGIN {printf "%.1f", a-b}') ns, ratio $(awk -v a="$ma" -v b="$mb" 'BEGIN {printf "%.2f", a/b}')"
done
