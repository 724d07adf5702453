#!/usr/bin/env bash
# make conformance: build a peer's OpenSHMEM test suite (Sandia OpenSHMEM's tests-sos, C unit
# tests, C++ unit tests and apps) with Courier's oshcc/oshc++, and run every program with 2
# and 4 PEs under oshrun, on shared memory and with COURIER_TLS=tcp. The suite's folder is
# only read: it is copied into target/conformance/ and built there.
#
#   run.sh [SUITE]     SUITE defaults to ../shared/conformance/tests-sos
# Environment: CONF_NPROCS ("2 4"), CONF_TLS ("all tcp"), CONF_ONLY (a regex of test names),
# CONF_TIMEOUT (seconds per run, 120), CONF_JOBS (make -j, 2).
# Prints one line per run and then "N passed, M failed" (excluded tests are listed with
# their reason and counted apart); exits 1 if any run failed.
set -uo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
here="$root/crates/courier-shmem/conformance"
suite="${1:-$root/../shared/conformance/tests-sos}"
out="$root/target/conformance"
bin="$root/target/release"
nprocs="${CONF_NPROCS:-2 4}"
tlss="${CONF_TLS:-all tcp}"
limit="${CONF_TIMEOUT:-120}"

if [ ! -f "$suite/configure.ac" ]; then
  echo "conformance: no test suite at $suite (give its path: make conformance SOS_TESTS=...)" >&2
  exit 1
fi
bash "$root/scripts/deps.sh" conformance >/dev/null || exit 1
suite="$(cd "$suite" && pwd)"

# Build: a private copy of the suite (autogen writes into its tree), configured in a build
# directory beside it. Rebuilt when the library is newer than the last build.
stamp="$out/build/.built"
if [ ! -f "$stamp" ] || [ "$bin/libcourier_shmem.so" -nt "$stamp" ] || [ "$root/crates/courier-shmem/include/shmem.h" -nt "$stamp" ]; then
  rm -rf "$out"
  mkdir -p "$out"
  cp -r "$suite" "$out/src"
  chmod -R u+w "$out/src"
  (cd "$out/src" && ./autogen.sh >"$out/autogen.log" 2>&1) || { echo "conformance: autogen failed (see $out/autogen.log)" >&2; exit 1; }
  mkdir -p "$out/build"
  (cd "$out/build" && "$out/src/configure" CC="$bin/oshcc" CXX="$bin/oshc++" \
     --with-test-runner="$bin/oshrun -np \$(NPROCS)" >"$out/configure.log" 2>&1) \
    || { echo "conformance: configure failed (see $out/configure.log)" >&2; exit 1; }
  for d in test/unit test/apps; do
    (cd "$out/build/$d" && make -k -j"${CONF_JOBS:-2}" check TESTS= >"$out/make-${d//\//-}.log" 2>&1)
  done
  touch "$stamp"
fi

# The programs make check would run, from the Makefiles (TESTS, with conditionals resolved).
tests_of() {
  make -s -C "$out/build/$1" -f Makefile -f - print-tests <<'MK' 2>/dev/null
print-tests:
	@echo $(TESTS)
MK
}

declare -A excluded
while IFS= read -r line; do
  case "$line" in ''|'#'*) continue ;; esac
  excluded["${line%%:*}"]="${line#*: }"
done < "$here/excluded.txt"

pass=0; fail=0; skip=0; failed=()
for d in test/unit test/apps; do
  for t in $(tests_of "$d"); do
    if [ -n "${CONF_ONLY:-}" ] && ! [[ "$t" =~ ${CONF_ONLY} ]]; then continue; fi
    if [ -n "${excluded[$t]:-}" ]; then
      echo "EXCLUDED $t: ${excluded[$t]}"
      skip=$((skip + 1)); continue
    fi
    exe="$out/build/$d/$t"
    for tls in $tlss; do
      for np in $nprocs; do
        name="$t np=$np tls=$tls"
        if [ ! -x "$exe" ]; then
          echo "FAIL $name (did not build; see $out/make-${d//\//-}.log)"
          fail=$((fail + 1)); failed+=("$name"); continue
        fi
        log="$out/logs/$t.$np.$tls.log"; mkdir -p "$out/logs"
        start=$(date +%s%N)
        (cd "$out/build/$d" && COURIER_TLS="$tls" timeout -k 10 "$limit" "$bin/oshrun" -np "$np" "$exe" >"$log" 2>&1)
        rc=$?
        ds=$(( ($(date +%s%N) - start) / 100000000 )); secs="$((ds / 10)).$((ds % 10))"
        if [ $rc -eq 0 ]; then
          echo "PASS $name (${secs}s)"; pass=$((pass + 1))
        else
          echo "FAIL $name (exit $rc, ${secs}s; log $log)"; fail=$((fail + 1)); failed+=("$name")
        fi
      done
    done
  done
done
echo
if [ $fail -gt 0 ]; then
  echo "failed runs:"; printf '  %s\n' "${failed[@]}"
fi
echo "conformance: $pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
