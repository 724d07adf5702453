#!/usr/bin/env bash
# The CUDA checks on a machine with an NVIDIA GPU but no Rust or Go toolchain and no network
# (the GPU machine lent to some sessions): `prepare` builds, here, everything `run` needs
# into .gpu/ (ignored by git); `run`, there, runs the CUDA tests against the real driver
# and device, then `courier perf` on device buffers, each row alternating the binary of
# this tree with an older one when `prepare` was given a revision.
#
#   bash scripts/gpu-check.sh prepare [OLD_REV]   # here: .gpu/ holds the stripped binaries
#   bash scripts/gpu-check.sh run [tests|perf]    # there, from the repository root
#
# `run` writes its logs to $OUT (or .gpu/out) and prints a short table last. With a Rust
# toolchain and a GPU on the same machine, `make test-gpu` runs the same tests.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
gpu=.gpu

prepare() {
    export PATH="$PATH:$HOME/.cargo/bin:/usr/local/go/bin"
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
    rm -rf "$gpu" && mkdir -p "$gpu"
    cargo build --release --workspace
    # The test binaries' paths, from cargo's own report.
    exe_of() {
        cargo test --release "$@" --no-run --message-format=json 2>/dev/null |
            python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])' | tail -1
    }
    cp "$(exe_of -p courier --test cuda)" "$gpu/cuda-tests"
    cp "$(exe_of -p courier --test cuda_memory)" "$gpu/cuda-memory-tests"
    cp "$(exe_of -p courier-cli --test cli)" "$gpu/cli-tests"
    cp target/release/courier "$gpu/courier"
    local lib
    lib="$(sha256sum target/release/libcourier.a | cut -c1-16)"
    (cd bindings/go && go test -c -o "$root/$gpu/go-tests" -ldflags="-X=courier.dev/courier.LibBuild=$lib" .)
    if [ -n "${1:-}" ]; then
        local old=/tmp/courier-gpu-old
        rm -rf "$old"
        git worktree add -f --detach "$old" "$1" >/dev/null
        (cd "$old" && CARGO_TARGET_DIR="$root/target/gpu-old" cargo build --release -p courier-cli)
        cp target/gpu-old/release/courier "$gpu/courier-old"
        git worktree remove --force "$old"
        git rev-parse --short "$1" >"$gpu/old-rev"
    fi
    git rev-parse --short HEAD >"$gpu/new-rev"
    git diff --quiet HEAD || echo "+ uncommitted changes" >>"$gpu/new-rev"
    strip "$gpu"/courier* "$gpu"/*-tests
    # The cli tests run the courier binary from where cargo built it.
    echo "$root/target/release/courier" >"$gpu/courier-path"
    du -sh "$gpu"
}

tests() {
    local out=$1 rc=0
    # A test binary spawns its children from its own path; the cli tests run courier from
    # the path cargo built it at.
    local want
    want="$(cat "$gpu/courier-path")"
    mkdir -p "$(dirname "$want")"
    [ "$(readlink -f "$want")" = "$(readlink -f "$gpu/courier")" ] || cp "$gpu/courier" "$want"
    export COURIER_TEST_CUDA=real
    echo "== library CUDA tests (tests/cuda.rs, tests/cuda_memory.rs)"
    timeout 300 "$gpu/cuda-tests" --test-threads=1 >"$out/cuda-tests.log" 2>&1 || rc=1
    tail -4 "$out/cuda-tests.log"
    timeout 300 "$gpu/cuda-memory-tests" --test-threads=1 >"$out/cuda-memory-tests.log" 2>&1 || rc=1
    tail -4 "$out/cuda-memory-tests.log"
    echo "== courier perf on device memory (tests/cli.rs)"
    timeout 120 "$gpu/cli-tests" perf_with_device_memory --test-threads=1 >"$out/cli-tests.log" 2>&1 || rc=1
    tail -3 "$out/cli-tests.log"
    echo "== Go TestDeviceMemory"
    (cd bindings/go && timeout 120 "$root/$gpu/go-tests" -test.run TestDeviceMemory -test.count=1 -test.v) \
        >"$out/go-tests.log" 2>&1 || rc=1
    tail -3 "$out/go-tests.log"
    return $rc
}

# The rows `run perf` measures: mode (l: both sides in one process, 2: a server process and
# a client), COURIER_TLS, memory types, test, size, iterations, warm-up, and optionally one
# more VAR=value for both sides. GPU_ROWS (space-separated) replaces them.
ROWS="l:all:cuda,cuda:tag_bw:1048576:400:40 l:all:cuda,cuda:tag_bw:16777216:100:20
l:all:host,cuda:tag_bw:1048576:400:40 l:all:host,cuda:tag_bw:4194304:200:40
l:all:host,cuda:tag_bw:8388608:200:40 l:all:host,cuda:tag_bw:16777216:100:20
l:all:cuda,host:tag_bw:1048576:400:40 l:all:cuda,host:tag_bw:16777216:100:20
l:all:cuda,cuda:tag_lat:8:20000:1000 l:tcp:cuda,cuda:tag_bw:1048576:400:40
2:all:cuda,cuda:tag_bw:1048576:200:40 2:all:host,cuda:tag_bw:1048576:200:40
2:all:cuda,cuda:tag_bw:16777216:200:40 2:all:host,cuda:tag_bw:16777216:200:40"

perf() {
    local out=$1 port=23456
    local bins=("$gpu/courier")
    [ -x "$gpu/courier-old" ] && bins=("$gpu/courier-old" "$gpu/courier" "$gpu/courier-old" "$gpu/courier")
    for row in ${GPU_ROWS:-$ROWS}; do
        IFS=: read -r mode tls m t s n w extra <<<"$row"
        local env=(env "COURIER_TLS=$tls")
        [ -n "$extra" ] && env+=("$extra")
        for b in "${bins[@]}"; do
            local args=(-t "$t" -m "$m" -s "$s" -n "$n" -w "$w" -f)
            if [ "$mode" = l ]; then
                r=$("${env[@]}" timeout 40 "$b" perf -l "${args[@]}" 2>&1 | tail -1)
            else
                "${env[@]}" timeout 60 "$b" perf -p $port >/dev/null 2>&1 &
                sleep 0.5
                r=$("${env[@]}" timeout 60 "$b" perf 127.0.0.1 -p $port "${args[@]}" 2>&1 | tail -1)
                wait || true
                port=$((port + 1))
            fi
            echo "$mode $tls $m $t $s ${extra:--} $(basename "$b") | $r"
        done
    done | tee "$out/perf.log"
}

run() {
    local out=${OUT:-$gpu/out} what=${1:-all} rc=0
    mkdir -p "$out"
    nvidia-smi -L || true
    echo "new: $(cat "$gpu/new-rev" | tr '\n' ' ') old: $(cat "$gpu/old-rev" 2>/dev/null || echo none)"
    case $what in
    tests) tests "$out" || rc=1 ;;
    perf) perf "$out" ;;
    all)
        tests "$out" || rc=1
        perf "$out"
        ;;
    esac
    return $rc
}

case ${1:-} in
prepare) prepare "${2:-}" ;;
run) run "${2:-all}" ;;
*)
    echo "usage: $0 prepare [OLD_REV] | run [tests|perf]" >&2
    exit 2
    ;;
esac
