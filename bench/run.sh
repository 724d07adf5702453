#!/usr/bin/env bash
# Side-by-side benchmarks: Courier (`courier perf`) vs UCX (`ucx_perftest`) vs libfabric
# (`fi_pingpong`), same tests, sizes and transports, run alternately; then bench/report.py
# writes bench/RESULTS.md, bench/results/raw.json and bench/results/*.svg.
#
# Environment:
#   BENCH_REPS=5          repetitions of each target test (medians are reported)
#   BENCH_SWEEP_REPS=5    repetitions of each size-sweep point (judged on their pairs, as the targets)
#   BENCH_QUICK=1         ~10x fewer iterations (smoke run)
#   BENCH_NO_SWEEP=1      skip the size sweeps
#   BENCH_NO_INSTALL=1    do not apt-get install ucx-utils / libfabric-bin
#   BENCH_RUN_TIMEOUT=120 seconds allowed to one client run (the server gets a little more)
#   BENCH_SERVER_CPU=0 BENCH_CLIENT_CPU=1   cores for taskset
#   BENCH_PORT_BASE=...   first TCP port (default: random in 20000..39999)
#   BENCH_SKIP_UCX=1      behave as if UCX were not installable (Courier and libfabric only)
#   BENCH_KEEP_LOGS=1     keep the per-run stdout/stderr directory
#   BENCH_SKIP_SIGNAL=1   skip the signaling-put section (bench/put_signal.sh)
#   BENCH_SKIP_GO=1       skip the Go-against-native section (bindings/go/bench.sh)
#   BENCH_SKIP_LARGE=1    skip the large-message section (bench/large.py)
#   BENCH_SKIP_STARTUP=1  skip the job start-up section (bench/startup.sh, against mpirun)
#   BENCH_LARGE_REPS=3    repetitions of each large-message command
#   COURIER=path          courier binary (default target/release/courier)
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
COURIER=${COURIER:-$ROOT/target/release/courier}
REPS=${BENCH_REPS:-5}
SWEEP_REPS=${BENCH_SWEEP_REPS:-5}
QUICK=${BENCH_QUICK:-0}
RUN_TIMEOUT=${BENCH_RUN_TIMEOUT:-120}
PY=${PYTHON:-python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/courier-bench.XXXXXX")
RUNS=$WORK/runs.tsv
META=$WORK/meta.tsv
: >"$RUNS"
: >"$META"

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
meta() { printf '%s\t%s\n' "$1" "$2" >>"$META"; }

NCPU=$(nproc 2>/dev/null || echo 1)
if [ "$NCPU" -ge 2 ]; then
    SERVER_CPU=${BENCH_SERVER_CPU:-0}
    CLIENT_CPU=${BENCH_CLIENT_CPU:-1}
else
    SERVER_CPU=${BENCH_SERVER_CPU:-0}
    CLIENT_CPU=${BENCH_CLIENT_CPU:-0}
fi
START_EPOCH=$(date +%s)
meta date_start "$(date -u '+%Y-%m-%d %H:%M:%S UTC')"
meta loadavg_start "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
meta reps "$REPS"
meta sweep_reps "$( [ "${BENCH_NO_SWEEP:-0}" = 1 ] && echo 0 || echo "$SWEEP_REPS")"
meta quick "$QUICK"
meta nproc "$NCPU"
meta server_cpu "$SERVER_CPU"
meta client_cpu "$CLIENT_CPU"

# ------------------------------------------------------------------------------------------
# Tools
# ------------------------------------------------------------------------------------------
for t in timeout taskset ss "$PY"; do
    command -v "$t" >/dev/null 2>&1 || { log "missing required tool: $t"; exit 1; }
done
if [ ! -x "$COURIER" ]; then
    log "courier binary not found at $COURIER (run: cargo build --release --workspace)"
    exit 1
fi

# Use a private copy of the binary: the workspace may be rebuilt while the benchmark runs.
COURIER_BIN=$COURIER # the signaling-put runs start after the private copy is gone
cp "$COURIER" "$WORK/courier" && COURIER=$WORK/courier
meta courier_bin "$COURIER"

install_note=""
need_pkgs=()
command -v ucx_perftest >/dev/null 2>&1 || need_pkgs+=(ucx-utils)
command -v fi_pingpong >/dev/null 2>&1 || need_pkgs+=(libfabric-bin)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
    if [ "${BENCH_NO_INSTALL:-0}" = 1 ]; then
        install_note="missing ${need_pkgs[*]}; installation disabled (BENCH_NO_INSTALL=1)"
    else
        SUDO=""
        if [ "$(id -u)" != 0 ]; then
            if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; fi
        fi
        if [ "$(id -u)" = 0 ] || [ -n "$SUDO" ]; then
            log "installing ${need_pkgs[*]} with apt-get"
            if timeout 600 $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q >"$WORK/apt.log" 2>&1 &&
               timeout 900 $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
                   "${need_pkgs[@]}" >>"$WORK/apt.log" 2>&1; then
                install_note="installed ${need_pkgs[*]} with apt-get"
            else
                install_note="apt-get install ${need_pkgs[*]} failed: $(tail -n 2 "$WORK/apt.log" | tr '\n\t' '  ')"
            fi
        else
            install_note="missing ${need_pkgs[*]} and not root (no passwordless sudo): cannot install"
        fi
        log "$install_note"
    fi
fi
HAVE_UCX=0; command -v ucx_perftest >/dev/null 2>&1 && HAVE_UCX=1
HAVE_FI=0; command -v fi_pingpong >/dev/null 2>&1 && HAVE_FI=1
if [ "${BENCH_SKIP_UCX:-0}" = 1 ]; then HAVE_UCX=0; install_note="${install_note:+$install_note; }UCX skipped (BENCH_SKIP_UCX=1)"; fi
meta have_ucx "$HAVE_UCX"
meta have_fi "$HAVE_FI"
[ -n "$install_note" ] && meta install_note "$install_note"
[ "$HAVE_UCX" = 1 ] || log "ucx_perftest unavailable: Courier only"
[ "$HAVE_FI" = 1 ] || log "fi_pingpong unavailable: skipping libfabric rows"

# The machine's speed, probed before and after every run: a cache-line ping-pong between the
# two CPUs the runs use (bench/ceilings.c, 20k round trips, a few ms). This machine switches
# between speeds for seconds at a time (its shm latencies then triple); report.py compares
# Courier with UCX over the pairs of runs that all four probes place at one speed.
PROBE=""
if [ "${BENCH_NO_PROBE:-0}" != 1 ] && command -v cc >/dev/null 2>&1 &&
   cc -O2 -o "$WORK/probe" "$HERE/ceilings.c" 2>"$WORK/probe.log"; then
    PROBE=$WORK/probe
else
    log "no speed probe (cc missing, BENCH_NO_PROBE=1, or bench/ceilings.c did not build)"
fi
meta probe "$( [ -n "$PROBE" ] && echo 'ceilings cacheline 20000, one-way us' || echo none)"
# shellcheck source=probe.sh
. "$HERE/probe.sh"

# ------------------------------------------------------------------------------------------
# One client/server pair
# ------------------------------------------------------------------------------------------
PORT=${BENCH_PORT_BASE:-$((20000 + RANDOM % 20000))}
port_busy() { [ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ]; }
next_port() {
    PORT=$((PORT + 1))
    [ "$PORT" -gt 60000 ] && PORT=20000
    while port_busy "$PORT"; do PORT=$((PORT + 1)); done
}

SERVER_PID=""
kill_tree() {  # kill a process we started and its direct children, by pid
    local pid=$1 sig=${2:-TERM} kids
    kids=$(ps -o pid= --ppid "$pid" 2>/dev/null | tr -d ' ')
    kill -"$sig" "$pid" 2>/dev/null
    for k in $kids; do kill -"$sig" "$k" 2>/dev/null; done
}
stop_server() {
    [ -n "$SERVER_PID" ] || return 0
    local i
    for i in $(seq 1 "${1:-30}"); do  # grace period in 0.1 s steps
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        kill_tree "$SERVER_PID" TERM
        sleep 0.2
        kill -0 "$SERVER_PID" 2>/dev/null && kill_tree "$SERVER_PID" KILL
    fi
    wait "$SERVER_PID" 2>/dev/null
    SERVER_PID=""
}
cleanup() { stop_server 0; }
trap cleanup EXIT
trap 'log interrupted; cleanup; exit 130' INT TERM

wait_listen() {  # port pid: poll until the server listens (without connecting to it)
    local i
    for i in $(seq 1 200); do
        port_busy "$1" && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

RUN_ID=0
# run_one KIND TOOL TLS TEST SIZE ITERS WARMUP WINDOW REP [retry]
run_one() {
    local kind=$1 tool=$2 tls=$3 test=$4 size=$5 iters=$6 warmup=$7 window=$8 rep=$9 again=${10:-}
    local id envs srv cli rc t0 t1 elapsed probe_before probe_after
    RUN_ID=$((RUN_ID + 1))
    id=$(printf '%04d' "$RUN_ID")
    next_port
    local pfx=$WORK/logs/$id-$tool-$tls-$test-$size-r$rep
    mkdir -p "$WORK/logs"
    case "$tool" in
    courier)
        if [ "$tls" = tcp ]; then envs=(COURIER_TLS=tcp); else envs=(-u COURIER_TLS); fi
        srv=("$COURIER" perf -p "$PORT")
        cli=("$COURIER" perf 127.0.0.1 -p "$PORT" -t "$test" -s "$size" -n "$iters" -w "$warmup")
        [ "$window" -gt 1 ] && cli+=(-O "$window")
        cli+=(--json)
        ;;
    ucx)
        if [ "$tls" = tcp ]; then envs=(UCX_TLS=tcp); else envs=(-u UCX_TLS); fi
        [ -n "${BENCH_UCX_NET_DEVICES:-}" ] && envs+=(UCX_NET_DEVICES="$BENCH_UCX_NET_DEVICES")
        srv=(ucx_perftest -p "$PORT")
        # ucx_perftest's default window (32 for *_bw) is used: no -O
        cli=(ucx_perftest 127.0.0.1 -p "$PORT" -t "$test" -s "$size" -n "$iters" -w "$warmup" -f)
        ;;
    floor)
        # The kernel's TCP round trip (bench/ceilings.c pingpong, which pins its two
        # processes to CPUs 0 and 1 itself): the floor tcp ucp_fadd is judged against.
        envs=(-u COURIER_TLS)
        srv=()
        cli=("$PROBE" pingpong)
        ;;
    fi)
        envs=(-u FI_PROVIDER)
        local fargs=(-p "$tls" -e rdm)
        [ "$tls" = tcp ] && fargs+=(-d lo)
        srv=(fi_pingpong "${fargs[@]}" -B "$PORT" -I "$iters" -S "$size")
        cli=(fi_pingpong "${fargs[@]}" -P "$PORT" -I "$iters" -S "$size" 127.0.0.1)
        ;;
    esac
    load1=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null)
    probe_before=$(probe_us)
    if [ "${#srv[@]}" -eq 0 ]; then
        # No server (the floor): the client alone.
        : >"$pfx.srv.out"; : >"$pfx.srv.err"
        t0=$(date +%s.%N)
        env "${envs[@]}" timeout -k 5 "$RUN_TIMEOUT" "${cli[@]}" >"$pfx.out" 2>"$pfx.err" </dev/null
        rc=$?
    else
        env "${envs[@]}" timeout -k 5 $((RUN_TIMEOUT + 20)) taskset -c "$SERVER_CPU" "${srv[@]}" \
            >"$pfx.srv.out" 2>"$pfx.srv.err" </dev/null &
        SERVER_PID=$!
        t0=$(date +%s.%N)
        if wait_listen "$PORT" "$SERVER_PID"; then
            env "${envs[@]}" timeout -k 5 "$RUN_TIMEOUT" taskset -c "$CLIENT_CPU" "${cli[@]}" \
                >"$pfx.out" 2>"$pfx.err" </dev/null
            rc=$?
        else
            echo "server did not listen on port $PORT" >"$pfx.err"
            : >"$pfx.out"
            rc=99
        fi
    fi
    t1=$(date +%s.%N)
    # a finished pair leaves no server; an unsupported/failed client leaves it waiting
    if [ "$rc" = 0 ]; then stop_server 50; else stop_server 2; fi
    probe_after=$(probe_us)
    # A server that never listened (its port taken in the meantime, or a slow start) says
    # nothing about the tool: one more try on another port, and only that one is recorded.
    if [ "$rc" = 99 ] && [ -z "$again" ]; then
        log "$id $kind r$rep $tool/$tls $test $size: server did not listen on port $PORT ($(tail -n 1 "$pfx.srv.err" 2>/dev/null | cut -c1-80)); retrying once"
        run_one "$kind" "$tool" "$tls" "$test" "$size" "$iters" "$warmup" "$window" "$rep" retry
        return
    fi
    elapsed=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b-a}')
    local envtxt="${envs[*]}"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
        "$id" "$kind" "$tool" "$tls" "$test" "$size" "$rep" "$iters" "$warmup" "$window" \
        "$rc" "$elapsed" "$PORT" "${cli[*]}" "$pfx.out" "$pfx.err" "$pfx.srv.out" "$pfx.srv.err" \
        "${envtxt//-u /unset }" "$probe_before" "$probe_after" "$load1" >>"$RUNS"
    local brief
    if [ "$tool" = courier ]; then
        brief=$(grep -o '"\(latency_percentile_us\|bandwidth_overall_mbs\|msgrate_overall\|transport\)":[^,}]*' \
            "$pfx.out" 2>/dev/null | tr '\n' ' ' | cut -c1-130)
    else
        brief=$(tail -n 1 "$pfx.out" 2>/dev/null | tr -s ' ' | cut -c1-110)
    fi
    [ "$rc" = 0 ] || brief="rc=$rc $(tail -n 1 "$pfx.err" 2>/dev/null | cut -c1-90)"
    log "$id $kind r$rep $tool/$tls $test $size n=$iters (${elapsed}s) $brief"
}

# ------------------------------------------------------------------------------------------
# Plan (from report.py, single source of truth) and execution
# ------------------------------------------------------------------------------------------
plan_args=()
[ "$QUICK" = 1 ] && plan_args+=(--quick)
mapfile -t PLAN < <("$PY" "$HERE/report.py" plan "${plan_args[@]}")
[ "${#PLAN[@]}" -gt 0 ] || { log "empty plan"; exit 1; }

tool_ok() {
    case "$1" in
    ucx) [ "$HAVE_UCX" = 1 ] ;;
    fi) [ "$HAVE_FI" = 1 ] ;;
    floor) [ -n "$PROBE" ] ;;
    *) return 0 ;;
    esac
}

# run_plan KIND REPS: for each rep, each line; Courier and UCX alternate (order flips each time)
run_plan() {
    local want=$1 reps=$2 rep i=0 line kind tls test size iters warmup window tools t
    for rep in $(seq 1 "$reps"); do
        for line in "${PLAN[@]}"; do
            read -r kind tls test size iters warmup window tools <<<"$line"
            [ "$kind" = "$want" ] || continue
            i=$((i + 1))
            local order=()
            IFS=, read -r -a order <<<"$tools"
            if [ $(((i + rep) % 2)) = 1 ] && [ "${#order[@]}" = 2 ]; then
                order=("${order[1]}" "${order[0]}")
            fi
            for t in "${order[@]}"; do
                tool_ok "$t" || continue
                run_one "$kind" "$t" "$tls" "$test" "$size" "$iters" "$warmup" "$window" "$rep"
            done
        done
    done
}

log "work dir $WORK; reps=$REPS quick=$QUICK; server cpu $SERVER_CPU, client cpu $CLIENT_CPU"
run_plan target "$REPS"
if [ "${BENCH_NO_SWEEP:-0}" != 1 ]; then
    run_plan sweep "$SWEEP_REPS"
fi

END_EPOCH=$(date +%s)
meta date_end "$(date -u '+%Y-%m-%d %H:%M:%S UTC')"
meta loadavg_end "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
dur=$((END_EPOCH - START_EPOCH))
meta duration "$((dur / 60)) min $((dur % 60)) s"

# Sections other scripts wrote into RESULTS.md (OpenSHMEM, EXS, job start-up: between
# markers, bench/carry.py) survive the rewrite below: they go back at the end.
[ -f "$HERE/RESULTS.md" ] && "$PY" "$HERE/carry.py" extract "$HERE/RESULTS.md" > "$WORK/sections.md"
"$PY" "$HERE/report.py" build --work "$WORK" --out "$HERE"
status=$?
# Go bindings against the native perf tool on the same active-message tests (issue: the Go
# perftest must reach 0.95 of native bandwidth at 1 MiB and up, and add at most 0.3 us at 8 B).
if [ "$status" = 0 ] && [ "${BENCH_SKIP_GO:-0}" != 1 ] && command -v go >/dev/null; then
    log "Go perftest vs native courier perf"
    if NATIVE=1 REPS="$REPS" SERVER_CPU="$SERVER_CPU" CLIENT_CPU="$CLIENT_CPU" PROBE="$PROBE" \
        timeout 900 bash "$ROOT/bindings/go/bench.sh" > "$HERE/results/go_vs_native.jsonl" 2> "$HERE/results/go_vs_native.log"; then
        "$PY" "$HERE/report.py" go "$HERE/results/go_vs_native.jsonl" >> "$HERE/RESULTS.md"
    else
        log "Go perftest run failed; see $HERE/results/go_vs_native.log"
    fi
fi
# Signaling put against a put and against put + flush + atomic signal (issue 3's targets).
if [ "$status" = 0 ] && [ "${BENCH_SKIP_SIGNAL:-0}" != 1 ]; then
    log "signaling put vs put and vs put + flush + atomic (shm and tcp)"
    if COURIER="$COURIER_BIN" REPS="$REPS" SERVER_CPU="$SERVER_CPU" CLIENT_CPU="$CLIENT_CPU" PROBE="$PROBE" \
        bash "$HERE/put_signal.sh" > "$HERE/results/put_signal.jsonl" 2>/dev/null; then
        "$PY" "$HERE/report.py" signal "$HERE/results/put_signal.jsonl" >> "$HERE/RESULTS.md"
    else
        log "signaling put runs failed"
    fi
fi
# Large messages as a ucx_perftest user first types them (issue 31): wall time against
# ucx_perftest's and both tools' peak RSS.
if [ "$status" = 0 ] && [ "${BENCH_SKIP_LARGE:-0}" != 1 ] && [ "$HAVE_UCX" = 1 ]; then
    log "large messages: wall time and peak RSS against ucx_perftest (tcp)"
    if COURIER="$COURIER" SERVER_CPU="$SERVER_CPU" CLIENT_CPU="$CLIENT_CPU" PROBE="$PROBE" \
        LARGE_TIMEOUT="$RUN_TIMEOUT" "$PY" "$HERE/large.py" "${BENCH_LARGE_REPS:-3}" \
        > "$HERE/results/large.jsonl" 2> "$HERE/results/large.log"; then
        "$PY" "$HERE/report.py" large "$HERE/results/large.jsonl" >> "$HERE/RESULTS.md"
    else
        log "large-message runs failed; see $HERE/results/large.log"
    fi
fi
# What the machine allows without any library (bench/ceilings.c): the TCP loopback stream
# over one and two connections with the system's congestion control and with reno, the TCP
# ping-pong round trip, a shared-memory cache-line ping-pong, and memcpy / CMA / split memcpy
# of 16 MiB.
if [ "$status" = 0 ] && [ "${BENCH_SKIP_CEILINGS:-0}" != 1 ] && command -v cc >/dev/null; then
    log "ceilings of this machine (no library)"
    if cc -O2 -o "$HERE/results/ceilings" "$HERE/ceilings.c" 2>> "$HERE/results/ceilings.log"; then
        : > "$HERE/results/ceilings.jsonl"
        for _ in $(seq "$REPS"); do
            for mode in "tcp 1" "tcp 1 reno" "tcp 2" "tcp 2 reno" "pingpong" "cacheline" "copy"; do
                # shellcheck disable=SC2086
                timeout 120 "$HERE/results/ceilings" $mode >> "$HERE/results/ceilings.jsonl" 2>> "$HERE/results/ceilings.log" || true
            done
        done
        rm -f "$HERE/results/ceilings"
        "$PY" "$HERE/report.py" ceilings "$HERE/results/ceilings.jsonl" >> "$HERE/RESULTS.md"
    else
        log "bench/ceilings.c did not build; see $HERE/results/ceilings.log"
    fi
fi
# The hand-written analysis of the misses (profiles), after the numbers.
[ "$status" = 0 ] && [ -f "$HERE/analysis.md" ] && { echo; cat "$HERE/analysis.md"; } >> "$HERE/RESULTS.md"
[ "$status" = 0 ] && [ -s "$WORK/sections.md" ] && { echo; cat "$WORK/sections.md"; } >> "$HERE/RESULTS.md"
# Job start-up against mpirun (bench/startup.sh): replaces its section in place.
if [ "$status" = 0 ] && [ "${BENCH_SKIP_STARTUP:-0}" != 1 ]; then
    log "job start-up: courier run vs mpirun"
    bash "$HERE/startup.sh" > "$HERE/results/startup.log" 2>&1 || log "startup runs failed; see $HERE/results/startup.log"
fi
[ "$status" = 0 ] && sed -n '/^## Targets/,/^## Size sweeps/p' "$HERE/RESULTS.md" | head -n -1
# The work dir (runs' logs, the speed probe the sections above use) goes last.
if [ "${BENCH_KEEP_LOGS:-0}" = 1 ]; then
    log "logs kept in $WORK"
else
    rm -rf "$WORK"
fi
log "done in $((dur / 60)) min $((dur % 60)) s: $HERE/RESULTS.md"
exit "$status"
