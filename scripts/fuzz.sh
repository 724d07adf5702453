#!/usr/bin/env bash
# make fuzz: every fuzz target of fuzz/ under libFuzzer (cargo-fuzz, no sanitizer, so the
# stable toolchain does), one after another, niced, for SECONDS each (or until RUNS
# executions). New inputs go to a scratch corpus; those that add coverage are merged into
# the checked-in corpus (fuzz/corpus/<target>), which make test replays. A crash stops
# that target (its input is in fuzz/artifacts/<target>/) and fails the run at the end.
# The numbers, one row per target, go to target/fuzz/report.md (for docs/fuzzing.md).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]        (SECONDS: 60 by default)
#   FUZZ_RUNS=10000000 scripts/fuzz.sh 600       (stop each at ten million executions)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
secs="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(ls fuzz/fuzz_targets | sed -n 's/\.rs$//p')
fi
out="$root/target/fuzz"
mkdir -p "$out"
report="$out/report.md"
runs_arg=()
[ -n "${FUZZ_RUNS:-}" ] && runs_arg=("-runs=$FUZZ_RUNS")
fuzz() {
  nice -n 15 cargo fuzz run --fuzz-dir fuzz --features libfuzzer -s none \
    --target-dir "$out/build" "$@"
}
{
  echo "| target | seconds | executions | executions/s | coverage (edges) | corpus kept | crashes |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
} > "$report"
failed=0
for t in "${targets[@]}"; do
  scratch="$out/corpus/$t"
  mkdir -p "$scratch" "fuzz/corpus/$t"
  log="$out/$t.log"
  echo "fuzz: $t for ${secs}s (log: $log)"
  start=$(date +%s)
  fuzz "$t" "$scratch" "fuzz/corpus/$t" -- -max_total_time="$secs" -max_len=8192 \
    -print_final_stats=1 "${runs_arg[@]}" > "$log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  crashes=0
  if [ $rc -ne 0 ]; then
    crashes=1
    failed=1
    echo "fuzz: $t FAILED (exit $rc); the input is under fuzz/artifacts/$t/:" >&2
    grep -m5 -E 'panicked|ERROR|SUMMARY' "$log" >&2 || tail -20 "$log" >&2
  fi
  # Keep what adds coverage to the checked-in corpus.
  before=$(ls "fuzz/corpus/$t" | wc -l)
  fuzz "$t" "fuzz/corpus/$t" "$scratch" -- -merge=1 -max_len=8192 > "$out/$t.merge.log" 2>&1 || true
  after=$(ls "fuzz/corpus/$t" | wc -l)
  echo "| $t | $took | ${execs:-?} | ${rate:-?} | ${cov:-?} | $after (+$((after - before))) | $crashes |" >> "$report"
  echo "fuzz: $t: ${execs:-?} executions, ${rate:-?}/s, crashes $crashes"
done
cat "$report"
exit $failed
