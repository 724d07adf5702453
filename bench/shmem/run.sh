#!/usr/bin/env bash
# OpenSHMEM on Courier against Open MPI's OSHMEM, side by side: bench/shmem/shmem_bench.c
# compiled once with Courier's oshcc and once with Open MPI's, each test run alternately
# (Courier, OSHMEM, Courier, ...) with 2 and 4 PEs, medians of the rounds, ratios
# Courier / OSHMEM, targets marked. Writes the OpenSHMEM section of bench/RESULTS.md.
# OSHMEM ends its processes with a segmentation fault in shmem_finalize on this machine:
# the numbers it printed before are kept, and the crash is recorded.
#
#   bench/shmem/run.sh          (ROUNDS=5, NPS="2 4", TESTS=... to narrow)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="$root/bench/out/shmem"
mkdir -p "$out"
rounds="${ROUNDS:-5}"
nps="${NPS:-2 4}"
if ! [ -f /usr/lib/x86_64-linux-gnu/openmpi/include/shmem.h ] || ! command -v mpirun >/dev/null; then
  echo "bench/shmem: installing Open MPI (openmpi-bin, libopenmpi-dev) for the comparison"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
fi
make -C "$root" -s shmem >/dev/null
"$root/target/release/oshcc" -O2 "$root/bench/shmem/shmem_bench.c" -o "$out/bench-courier"
/usr/bin/oshcc -O2 "$root/bench/shmem/shmem_bench.c" -o "$out/bench-oshmem"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

TESTS="${TESTS:-put_lat:8 put_lat:4096 put_lat:4194304 get_lat:8 get_lat:4096 get_lat:4194304 \
put_bw:8 put_bw:65536 put_bw:4194304 put_nbi_bw:8 put_nbi_bw:65536 get_bw:65536 get_nbi_bw:8 get_nbi_bw:65536 \
fadd_lat:4 add_rate:4 inc_rate:4 swap_lat:4 cswap_lat:4 fadd_heap:4 fadd_global:4 \
sig_lat:8 putflag_lat:8 sig_lat:4096 putflag_lat:4096 barrier:0 bcast:8 bcast:1048576 reduce:8 reduce:1048576 \
alltoall:8 alltoall:1048576}"

raw="$out/raw.txt"
echo "# load-start $(cut -d' ' -f1-3 /proc/loadavg)" > "$raw"
cpus=$(nproc)
for np in $nps; do
  # More PEs than CPUs: neither launcher binds by default (mpirun's rule, which `oshrun
  # --cpu-bind auto` follows, since other jobs may share the CPUs). This machine runs
  # nothing else, so both bind round robin, which steadies both (bench/analysis.md).
  cbind=(); obind=(--oversubscribe)
  if [ "$np" -gt "$cpus" ]; then cbind=(--cpu-bind core); obind=(--oversubscribe --bind-to core:overload-allowed); fi
  for t in $TESTS; do
    test="${t%%:*}"; size="${t#*:}"
    for r in $(seq 1 "$rounds"); do
      for impl in courier oshmem; do
        if [ $impl = courier ]; then
          cmd=("$root/target/release/oshrun" "${cbind[@]}" -np "$np" "$out/bench-courier" "$test" "$size")
        else
          cmd=(mpirun "${obind[@]}" -np "$np" "$out/bench-oshmem" "$test" "$size")
        fi
        line=$(timeout -k 5 120 "${cmd[@]}" 2>"$out/last-$impl.err" | grep "^$test ")
        rc=$?
        crash=$(grep -c -i "segmentation\|signal 11\|core dumped" "$out/last-$impl.err")
        echo "$impl $np ${line:-$test $size nan ?} rc=$rc crash=$crash" >> "$raw"
      done
    done
    echo "np=$np $t done"
  done
done

python3 "$root/bench/shmem/report.py" "$raw" "$root/bench/RESULTS.md"
