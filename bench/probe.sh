# Sourced by bench/run.sh, bench/put_signal.sh and bindings/go/bench.sh: the machine's speed
# probe. `probe_us` prints the one-way latency (us) of `$PROBE cacheline 20000`, a cache-line
# ping-pong between the two CPUs the runs use (bench/ceilings.c), or nothing when PROBE is
# unset or the probe fails.
probe_us() {
    [ -n "${PROBE:-}" ] || return 0
    timeout 10 "$PROBE" cacheline 20000 2>/dev/null | sed -n 's/.*"oneway_us": *\([0-9.]*\).*/\1/p'
}
