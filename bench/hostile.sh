#!/usr/bin/env bash
# Issue 30's numbers at full size (not in `make test`, which runs the same floods in
# seconds with a small budget): 60 s floods of unexpected tag messages, stream bytes and
# unanswered gets against a victim with the default budget, over shm and tcp (the victim's
# peak RSS over its idle RSS, a legitimate client's round trips meanwhile, once polling for
# its answers, once waiting as the library's blocking waits do (courier::Backoff: spin,
# yield, sleep) and once sleeping until they come); 500 idle connections in setup (the
# victim's CPU, the three clients' round trips meanwhile; `bench/ceilings.c sleepy [SECS]
# [poll]` times the kernel's own round trips the same way, the floor for these).
#   bench/hostile.sh            # 60 s floods (about 20 minutes in all)
#   COURIER_TEST_BENCH_SECS=10 bench/hostile.sh
#   COURIER_TEST_BENCH_TLS=tcp COURIER_TEST_BENCH_FLOODS=tag,stream,get,idle \
#       COURIER_TEST_BENCH_CLIENT=busy,backoff,wait bench/hostile.sh
#   COURIER_TEST_VICTIM_RCVBUF=1m bench/hostile.sh   # the victim's COURIER_TCP_RCVBUF only
# Prints one BENCH line per case; bench/analysis.md records the last run.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:$HOME/.cargo/bin"
cargo test --release -p courier --test hostile --no-run
cargo test --release -p courier --test hostile -- --ignored --exact bench::bench_hostile \
    --nocapture --test-threads=1 2>&1 | grep -oE 'BENCH.*|test result.*|panicked.*' || true
