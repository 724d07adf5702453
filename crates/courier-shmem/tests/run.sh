#!/usr/bin/env bash
# Courier's own OpenSHMEM tests: every C program here, compiled with oshcc (the C++ one
# with oshc++), run with 2 and 4 PEs under oshrun, on shared memory and with
# COURIER_TLS=tcp; then the error cases, each of which must end the job with its message.
# Prints "N passed, M failed"; exits 1 if any failed.
set -uo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
here="$root/crates/courier-shmem/tests"
bin="$root/target/release"
out="$root/target/shmem-tests"
mkdir -p "$out"
limit="${SHMEM_TEST_TIMEOUT:-180}"
pass=0; fail=0; failed=()

build() {  # build SRC OUT
  case "$1" in
    *.cpp) "$bin/oshc++" -O2 -g -Wall -Werror "$1" -o "$2" ;;
    *) "$bin/oshcc" -O2 -g -std=gnu11 -Wall -Werror "$1" -o "$2" -lpthread ;;
  esac
}

result() {  # result OK NAME [DETAIL]
  if [ "$1" = 0 ]; then echo "PASS $2"; pass=$((pass + 1))
  else echo "FAIL $2${3:+: $3}"; fail=$((fail + 1)); failed+=("$2"); fi
}

for src in "$here"/*.c "$here"/*.cpp; do
  name="$(basename "${src%.*}")"
  exe="$out/$name"
  if ! build "$src" "$exe" 2>"$out/$name.build.log"; then
    result 1 "$name (build)" "$(head -5 "$out/$name.build.log")"; continue
  fi
  [ "$name" = errors ] && continue
  for tls in all tcp; do
    for np in 2 4; do
      log="$out/$name.$np.$tls.log"
      COURIER_TLS=$tls timeout -k 10 "$limit" "$bin/oshrun" -np "$np" "$exe" >"$log" 2>&1
      rc=$?
      result $rc "$name np=$np tls=$tls" "exit $rc; $(grep -m3 -i 'fail\|error\|courier-shmem' "$log")"
    done
  done
done

# More PEs than a flat sync takes (8): coll over shared memory also through the
# dissemination sync and the reductions the first member gathers.
log="$out/coll.9.all.log"
timeout -k 10 "$limit" "$bin/oshrun" -np 9 "$out/coll" >"$log" 2>&1
rc=$?
result $rc "coll np=9 tls=all" "exit $rc; $(grep -m3 -i 'fail\|error\|courier-shmem' "$log")"

# How waits behave (SHMEM_DEBUG names it): they yield now and then when each PE has a
# CPU of its own, at every round when the PEs outnumber their CPUs (two PEs held to one
# CPU); they spin 1ms before they sleep, or SHMEM_WAIT_SPIN when set.
spin_case() {  # spin_case NAME WANT CMD...: WANT ends the debug line
  local name=$1 want=$2; shift 2
  local log="$out/spin.$name.log"
  SHMEM_DEBUG=1 timeout -k 10 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ] && grep -q "waits yield $want\$" "$log"; then
    result 0 "wait spin $name"
  else
    result 1 "wait spin $name" "exit $rc, expected 'waits yield $want' in: $(grep -m2 'waits yield' "$log")"
  fi
}
spin_case own-cpu "now and then, spin 1ms" "$bin/oshrun" -np 1 "$out/wait"
spin_case shared-cpu "at every round, spin 1ms" taskset -c 0 "$bin/oshrun" -np 2 "$out/wait"
spin_case set ".*, spin 200µs" env SHMEM_WAIT_SPIN=200us "$bin/oshrun" -np 2 "$out/wait"

# mode: the words the message must hold
declare -A want=(
  [pe]="shmem_long_p: pe=[0-9]*: out of range"
  [nonsym]="shmem_long_put: dest=.*is not symmetric"
  [before_init]="shmem_my_pe: called before shmem_init"
  [team]="shmem_team_sync: team=.*not a team of this job"
  [cmp]="shmem_long_wait_until: cmp=42: not a comparison"
  [align]="shmem_long_atomic_inc: dest=.*not aligned"
  [sigop]="shmem_putmem_signal: sig_op=7"
  [free]="shmem_free: ptr=.*not a block of the symmetric heap"
  [semowner]="shmemx_sem_wait: sem=.*belongs to PE 0; only its owner waits"
  [semfreed]="shmemx_sem_try: sem=.*this semaphore was freed"
  [semover]="shmemx_sem_wait: sem=.*posts took it to 80000, past its maximum 65535"
  [reducecount]="shmem_long_sum_reduce: nreduce=2305843009213693953: .*overflow"
  [alltoallscount]="shmem_long_alltoalls: nelems=[0-9]*, dst=1: .*overflow"
  [exit]="shmem_global_exit(3)"
  [exit0]="shmem_global_exit(0)"
)
for mode in "${!want[@]}"; do
  log="$out/errors.$mode.log"
  if [ "$mode" = before_init ]; then
    timeout -k 10 60 "$out/errors" "$mode" >"$log" 2>&1
  else
    timeout -k 10 "$limit" "$bin/oshrun" -np 2 "$out/errors" "$mode" >"$log" 2>&1
  fi
  rc=$?
  ok=$([ $rc -ne 0 ] && [ $rc -ne 124 ] && echo yes)
  [ "$mode" = exit ] && ok=$([ $rc -eq 3 ] && echo yes)
  # Not a failure: every PE ends, and the job's status is the one given, 0 included.
  [ "$mode" = exit0 ] && ok=$([ $rc -eq 0 ] && echo yes)
  if [ "$ok" = yes ] && grep -q -- "${want[$mode]}" "$log"; then
    result 0 "errors $mode"
  else
    result 1 "errors $mode" "exit $rc, expected '${want[$mode]}' in: $(head -c 400 "$log")"
  fi
done

# A PE whose published heap is longer than its key's region (examples/lying_pe.rs: rank 0
# runs rma, rank 1 lies) must end the job at shmem_init, over shared memory and tcp alike:
# believed, it would have others store past the mapping.
liar="$bin/examples/lying_pe"
if ! (cd "$root" && "${CARGO:-cargo}" build --release -q -p courier-shmem --example lying_pe) \
    >"$out/lying_pe.build.log" 2>&1; then
  result 1 "lying PE (build)" "$(head -5 "$out/lying_pe.build.log")"
else
  for tls in all tcp; do
    log="$out/lyingpe.$tls.log"
    COURIER_TLS=$tls timeout -k 10 "$limit" "$bin/oshrun" -np 2 "$liar" "$out/rma" >"$log" 2>&1
    rc=$?
    lie="shmem_init: reaching PE 1: its symmetric heap .* lies outside its key's region"
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "$lie" "$log"; then
      result 0 "lying PE tls=$tls"
    else
      result 1 "lying PE tls=$tls" "exit $rc, expected '$lie' in: $(head -c 400 "$log")"
    fi
  done
fi

echo
[ $fail -gt 0 ] && { echo "failed:"; printf '  %s\n' "${failed[@]}"; }
echo "shmem tests: $pass passed, $fail failed"
[ $fail -eq 0 ]
