#!/usr/bin/env bash
# EXS benchmarks: exs-blast and exs-pingpong over Courier shm, Courier tcp, kernel TCP
# loopback and kernel Unix sockets, the same binaries, the kinds alternating run by run;
# then bench/exs/report.py renders the EXS section of bench/RESULTS.md and its plots.
#
#   bash bench/exs/run.sh            # full: sweeps (3 repetitions) and targets (7)
#   EXS_QUICK=1 bash bench/exs/run.sh   # one repetition, fewer points (a smoke run)
#   EXS_REPS=2 EXS_TREPS=5 bash bench/exs/run.sh   # other repetition counts
#
# Needs target/release/libcourier.so (cargo build --release -p courier-capi).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="$root/bench/exs/results"
bin="$root/target/exs-bench"
mkdir -p "$out" "$bin"
lib="$root/target/release"
[ -f "$lib/libcourier.so" ] || { echo "run: build first: cargo build --release -p courier-capi" >&2; exit 1; }
for p in exs_blast exs_pingpong; do
  cc -O2 -g -Wall -Wextra -Werror -std=c11 -D_GNU_SOURCE -I"$root/crates/courier-capi/include" \
    "$root/bench/exs/$p.c" -o "$bin/${p/_/-}" -L"$lib" -lcourier -Wl,-rpath,"$lib"
done
reps=3
treps=7
sizes=4K,64K,512K,2M,16M
counts=1,4,16
psizes=8,1K,64K,1M
iters=5000
if [ -n "${EXS_QUICK:-}" ]; then reps=1; treps=3; sizes=64K,512K,2M; counts=4; psizes=8,64K; iters=2000; fi
reps=${EXS_REPS:-$reps}
treps=${EXS_TREPS:-$treps}
raw="$out/raw.jsonl"
: > "$raw"
# kind: label and how to run it (COURIER_TLS for Courier; -k for kernel sockets).
kinds=(kernel-tcp courier-shm courier-tcp kernel-unix)
run_kind() {
  local kind=$1; shift
  case $kind in
    kernel-tcp) "$@" -k tcp ;;
    kernel-unix) "$@" -k unix ;;
    courier-shm) env -u COURIER_TLS "$@" -k courier ;;
    courier-tcp) COURIER_TLS=tcp "$@" -k courier ;;
  esac
}
tag() { sed -e "s/^{/{\"rep\":$1,\"phase\":\"$2\",/"; }
# A crowded machine can stall a process for seconds: Courier's peer-silence limit (2 s by
# default) would take that for a dead peer. A failed run is reported and the plan goes on.
export COURIER_KEEPALIVE_TIMEOUT=${COURIER_KEEPALIVE_TIMEOUT:-30s}
echo "exs bench: $(nproc) CPUs, $(uname -r); results in $raw"
# Targets first: 512 KiB x 4 (blast) and 8 B busy-polling (ping-pong), alternating kinds.
for r in $(seq 1 "$treps"); do
  for k in kernel-tcp courier-shm courier-tcp; do
    run_kind "$k" timeout 300 "$bin/exs-blast" -s 512K -o 4 -t 0.5 | tag "$r" target >> "$raw" || echo "run failed: $k blast" >&2
    run_kind "$k" timeout 300 "$bin/exs-pingpong" -s 8 -n "$iters" -b | tag "$r" target >> "$raw" || echo "run failed: $k pingpong" >&2
  done
  # The same blast with each process (and its completion thread) on its own CPU.
  for k in kernel-tcp courier-shm; do
    run_kind "$k" timeout 300 "$bin/exs-blast" -s 512K -o 4 -t 0.5 -c 0,1 | tag "$r" target >> "$raw" || echo "run failed: $k blast pinned" >&2
  done
done
# Sweeps: blast (notify) and ping-pong (busy and notify, pinned and not), every kind.
for r in $(seq 1 "$reps"); do
  for k in "${kinds[@]}"; do
    run_kind "$k" timeout 600 "$bin/exs-blast" -s "$sizes" -o "$counts" -t 0.2 | tag "$r" sweep >> "$raw" || echo "run failed: $k blast sweep" >&2
    for b in "" "-b"; do
      for c in "" "-c 0,1"; do
        # shellcheck disable=SC2086
        run_kind "$k" timeout 300 "$bin/exs-pingpong" -s "$psizes" -n "$iters" $b $c | tag "$r" sweep >> "$raw" || echo "run failed: $k pingpong $b $c" >&2
      done
    done
  done
done
python3 "$root/bench/exs/report.py" "$raw" "$root/bench/RESULTS.md" "$out"
