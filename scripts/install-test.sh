#!/usr/bin/env bash
# A clean install, used as a user would: `make install PREFIX=$tmp`, then
#   - a C program built only with `pkg-config courier` from that prefix runs without
#     LD_LIBRARY_PATH (the .pc's rpath), and one built with `pkg-config courier-static`
#     needs no libcourier.so at all;
#   - a Go program in a module of its own (a `replace` to bindings/go) builds with
#     -tags courier_system against the installed library and talks to the C one;
#   - the installed `courier` command runs; `make uninstall` removes every file.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
MAKE="${MAKE:-make}"
tmp="$(mktemp -d)"
server_pid=
cleanup() {
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    chmod -R u+w "$tmp" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
prefix="$tmp/prefix"

"$MAKE" -s -C "$root" install PREFIX="$prefix" >/dev/null
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
unset LD_LIBRARY_PATH

"$prefix/bin/courier" --version >/dev/null || { echo "install-test: the installed courier command fails" >&2; exit 1; }
for f in include/courier.h include/exs.h include/shmem.h lib/libcourier.so lib/libcourier.a bin/oshcc bin/oshrun; do
    [ -e "$prefix/$f" ] || { echo "install-test: $f not installed" >&2; exit 1; }
done

# C, shared and static, from pkg-config alone.
cc -std=c11 -D_DEFAULT_SOURCE "$root/examples/c/hello.c" $(pkg-config --cflags --libs courier) -o "$tmp/hello"
cc -std=c11 -D_DEFAULT_SOURCE "$root/examples/c/hello.c" $(pkg-config --cflags --libs courier-static) -o "$tmp/hello-static"
# (ldd's output in a variable: grep -q closing the pipe early would fail it under pipefail)
libs=$(ldd "$tmp/hello")
grep -qF "$prefix/lib/libcourier.so" <<<"$libs" \
    || { echo "install-test: the shared build does not find $prefix/lib/libcourier.so:" >&2; ldd "$tmp/hello" >&2; exit 1; }
if grep -q libcourier <<<"$(ldd "$tmp/hello-static")"; then
    echo "install-test: the static build still needs libcourier.so" >&2; exit 1
fi

# Go, in a module of its own.
mkdir -p "$tmp/gomod"
cp "$root/bindings/go/cmd/hello/main.go" "$tmp/gomod/"
cat > "$tmp/gomod/go.mod" <<MOD
module example.com/hello

go 1.24

require courier.dev/courier v0.0.0

replace courier.dev/courier => $root/bindings/go
MOD
# A cache of its own, as on a clean machine: Go's build cache does not notice that
# pkg-config's answer changed (another prefix), and would link the last test's.
(cd "$tmp/gomod" && GOCACHE="$tmp/gocache" GOFLAGS=-mod=mod go build -tags courier_system -o "$tmp/hello-go" .)
libs=$(ldd "$tmp/hello-go")
grep -qF "$prefix/lib/libcourier.so" <<<"$libs" \
    || { echo "install-test: the Go program is not linked to the installed library:" >&2; ldd "$tmp/hello-go" >&2; exit 1; }

# Each built program as a server with another as its client.
pair() { # server client
    "$1" server 127.0.0.1:0 > "$tmp/server.out" 2>&1 &
    server_pid=$!
    local addr=
    for _ in $(seq 600); do
        addr=$(sed -n 's/^listening on //p' "$tmp/server.out")
        [ -n "$addr" ] && break
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$addr" ] || { echo "install-test: $1 did not listen" >&2; cat "$tmp/server.out" >&2; exit 1; }
    timeout 60 "$2" client "$addr" > "$tmp/client.out" 2>&1 \
        || { echo "install-test: $2 failed" >&2; cat "$tmp/client.out" "$tmp/server.out" >&2; exit 1; }
    wait "$server_pid" || { echo "install-test: $1 failed" >&2; cat "$tmp/server.out" >&2; exit 1; }
    server_pid=
    grep -qxF "client: done" "$tmp/client.out" && grep -qxF "server: done" "$tmp/server.out" \
        || { echo "install-test: $1 and $2 did not finish their exchange" >&2; exit 1; }
}
pair "$tmp/hello" "$tmp/hello-go"
pair "$tmp/hello-go" "$tmp/hello-static"

"$MAKE" -s -C "$root" uninstall PREFIX="$prefix" >/dev/null
left=$(find "$prefix" -type f)
[ -z "$left" ] || { echo "install-test: make uninstall left files:" >&2; echo "$left" >&2; exit 1; }
echo "install-test: installed, built with pkg-config (C shared and static, Go in its own module), ran, uninstalled"
