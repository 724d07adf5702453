#!/usr/bin/env bash
# The hello programs (Rust, C, Go) as two real processes: every server with every client,
# over shared memory (the default on one host) and tcp (COURIER_TLS=tcp). Each pair must
# print its exchange and pick the transport asked for; a hang fails after 60 s.
#
#   scripts/hello-test.sh RUST_BIN C_BIN GO_BIN
set -euo pipefail
declare -A BIN=([rust]="$1" [c]="$2" [go]="$3")
for b in "${BIN[@]}"; do
    [ -x "$b" ] || { echo "hello-test: $b is not built" >&2; exit 1; }
done
out=$(mktemp -d)
server_pid=
cleanup() {
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    rm -rf "$out"
}
trap cleanup EXIT

expect() { # file, line
    grep -qxF "$2" "$1" || { echo "hello-test: $1 lacks the line: $2" >&2; cat "$1" >&2; exit 1; }
}

runs=0
for tls in all tcp; do
    want=shm; [ "$tls" = tcp ] && want=tcp
    for s in rust c go; do
        for c in rust c go; do
            echo "== COURIER_TLS=$tls server $s, client $c"
            : > "$out/server"
            COURIER_TLS=$tls timeout 60 "${BIN[$s]}" server 127.0.0.1:0 > "$out/server" 2>&1 &
            server_pid=$!
            addr=
            for _ in $(seq 600); do  # the server prints its address once it listens
                addr=$(sed -n 's/^listening on //p' "$out/server")
                [ -n "$addr" ] && break
                kill -0 "$server_pid" 2>/dev/null || break
                sleep 0.1
            done
            [ -n "$addr" ] || { echo "hello-test: the $s server did not listen" >&2; cat "$out/server" >&2; exit 1; }
            COURIER_TLS=$tls timeout 60 "${BIN[$c]}" client "$addr" > "$out/client" 2>&1 \
                || { echo "hello-test: the $c client failed" >&2; cat "$out/client" "$out/server" >&2; exit 1; }
            wait "$server_pid" || { echo "hello-test: the $s server failed" >&2; cat "$out/server" >&2; exit 1; }
            server_pid=
            expect "$out/client" "client: connected over $want"
            expect "$out/client" "client: tag: hello, client"
            expect "$out/client" "client: am: hello, client (am)"
            expect "$out/client" "client: done"
            expect "$out/server" "server: tag: hello, server"
            expect "$out/server" "server: am: hello, server (am)"
            expect "$out/server" "server: done"
            runs=$((runs + 1))
        done
    done
done
echo "hello-test: $runs pairs passed (Rust, C and Go servers and clients, shm and tcp)"
