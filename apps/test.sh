#!/usr/bin/env bash
# `make apps-test`: every application of apps/ once at a small size, in each variant, on 2
# and 4 PEs over shared memory and on 2 PEs over tcp, its answer checked by the program
# itself (exit 1 and check=FAILED on a wrong one); then each with -x, which spoils one
# result, must fail (check=FAILED, a failed exit, not a hang). The microbenchmark and the fetch-add program run briefly too.
# Prints "N passed, M failed"; exits 1 if any failed.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/target/apps"
oshrun="$root/target/release/oshrun"
out="$root/target/apps-tests"
mkdir -p "$out"
limit="${APPS_TEST_TIMEOUT:-120}"
pass=0; fail=0; failed=()

result() { # result OK NAME [DETAIL]
  if [ "$1" = 0 ]; then echo "PASS $2"; pass=$((pass + 1))
  else echo "FAIL $2${3:+: $3}"; fail=$((fail + 1)); failed+=("$2"); fi
}

run() { # run LOG TLS NP PROGRAM ARGS...: the exit status
  local log=$1 tls=$2 np=$3; shift 3
  COURIER_TLS=$tls timeout -k 10 "$limit" "$oshrun" -np "$np" "$@" >"$log" 2>&1
}

declare -A size=([bcast]=64 [allreduce]=16 [spmv]=32 [cg]=16)
declare -A iters=([bcast]=50 [allreduce]=50 [spmv]=20 [cg]=20)
for app in bcast allreduce spmv cg; do
  for v in barrier flag signal; do
    for case in "all 2" "all 4" "tcp 2"; do
      set -- $case
      name="$app -v $v np=$2 tls=$1"
      log="$out/$app.$v.$2.$1.log"
      run "$log" "$1" "$2" "$bin/$app" -v "$v" -n "${size[$app]}" -i "${iters[$app]}"
      rc=$?
      ok=$([ $rc -eq 0 ] && grep -q "^RESULT app=$app variant=$v npes=$2 .*check=ok" "$log" && echo 0 || echo 1)
      result "$ok" "$name" "exit $rc; $(grep -m3 -i 'fail\|error\|expected' "$log")"
    done
  done
  # A spoiled result must fail the check (exit 1, check=FAILED), not pass unnoticed.
  log="$out/$app.spoiled.log"
  run "$log" all 2 "$bin/$app" -v signal -n "${size[$app]}" -i 5 -x
  rc=$?
  # (courier run ends the job at the first rank's exit 1: the status may be its own)
  ok=$([ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] && grep -q "check=FAILED" "$log" && echo 0 || echo 1)
  result "$ok" "$app -x (a spoiled result fails)" "exit $rc, $(grep -m1 RESULT "$log")"
done

for m in flag fenceflag signal sem; do
  for tls in all tcp; do
    log="$out/syncput.$m.$tls.log"
    run "$log" "$tls" 2 "$bin/syncput" -m "$m" -s 1 -S 4096 -i 20
    rc=$?
    ok=$([ $rc -eq 0 ] && [ "$(grep -c "^SYNCPUT mode=$m .*check=ok" "$log")" = 13 ] && echo 0 || echo 1)
    result "$ok" "syncput -m $m tls=$tls" "exit $rc; $(head -c 300 "$log")"
  done
done

for m in heap global nic; do
  for np in 2 4; do
    log="$out/fadd.$m.$np.log"
    run "$log" all "$np" "$bin/fadd" -m "$m" -i 2000
    rc=$?
    ok=$([ $rc -eq 0 ] && grep -q "^FADD mem=$m npes=$np .*check=ok" "$log" && echo 0 || echo 1)
    result "$ok" "fadd -m $m np=$np" "exit $rc; $(head -c 300 "$log")"
  done
done

echo
[ $fail -gt 0 ] && { echo "failed:"; printf '  %s\n' "${failed[@]}"; }
echo "apps tests: $pass passed, $fail failed"
[ $fail -eq 0 ]
