#!/usr/bin/env bash
# Tests of scripts/deps.sh's Rust toolchain choice, with apt-get, apt-cache, rustc and cargo
# replaced by stubs (nothing is installed, nothing is fetched).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
t="$(mktemp -d)"
trap 'rm -rf "$t"' EXIT
mkdir -p "$t/bin" "$t/home"
need="$(sed -n 's/^rust-version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)"

cat >"$t/bin/apt-cache" <<'EOF'
#!/bin/sh
case "$2" in
  rustc-web) echo "rustc-web:"; echo "  Installed: (none)"; echo "  Candidate: ${STUB_WEB:-(none)}" ;;
  rustc) echo "rustc:"; echo "  Installed: (none)"; echo "  Candidate: ${STUB_PLAIN:-(none)}" ;;
esac
EOF
cat >"$t/bin/apt-get" <<'EOF'
#!/bin/sh
echo "$*" >>"$STUB_DIR/apt.log"
case "$*" in
  *install*rustc-web*)
    printf '#!/bin/sh\necho "rustc 1.96.0 (stub)"\n' >"$STUB_DIR/bin/rustc"
    printf '#!/bin/sh\necho "cargo 1.96.0 (stub)"\n' >"$STUB_DIR/bin/cargo"
    chmod +x "$STUB_DIR/bin/rustc" "$STUB_DIR/bin/cargo" ;;
esac
exit 0
EOF
chmod +x "$t/bin/apt-cache" "$t/bin/apt-get"

# deps.sh with the stubs first on PATH and no ~/.cargo; its exit code, output in $t/out.
deps() {
  rm -f "$t/apt.log"
  touch "$t/apt.log"
  set +e
  env -i HOME="$t/home" PATH="$t/bin:/usr/bin:/bin" STUB_DIR="$t" STUB_WEB="$1" STUB_PLAIN="$2" \
    bash "$root/scripts/deps.sh" >"$t/out" 2>&1
  local rc=$?
  set -e
  return $rc
}
fail() {
  echo "test-deps: FAILED: $*" >&2
  cat "$t/out" "$t/apt.log" >&2
  exit 1
}
rm -f "$t/bin/rustc" "$t/bin/cargo"
if env -i PATH=/usr/bin:/bin bash -c 'command -v cargo' >/dev/null; then
  echo "test-deps: skipped (a cargo in /usr/bin or /bin would be found before the stubs' choice)"
  exit 0
fi

# A new enough rustc-web is installed, with clippy and rustfmt.
deps "1.96.0+dfsg1-1~deb12u2" "1.63.0+dfsg1-2" || fail "rustc-web 1.96 offered: deps.sh failed"
grep -q "install -y -qq rustc-web cargo-web rust-web-clippy rustfmt-web" "$t/apt.log" ||
  fail "rustc-web 1.96 offered: not installed"
rm -f "$t/bin/rustc" "$t/bin/cargo"

# Only toolchains older than rust-version: nothing installed, a clear error.
for offer in "1.85.0+dfsg3-1~deb12u3 1.63.0+dfsg1-2" " "; do
  read -r web plain <<<"$offer" || true
  if deps "${web:-}" "${plain:-}"; then fail "offer '$offer': deps.sh succeeded"; fi
  grep -qE "install.*(rustc|cargo)" "$t/apt.log" && fail "offer '$offer': installed a Rust"
  grep -q "needs Rust $need or newer" "$t/out" || fail "offer '$offer': no clear error"
  grep -q "rustup" "$t/out" || fail "offer '$offer': no way out named"
done

# An installed rustc older than rust-version: a clear error naming it.
printf '#!/bin/sh\necho "rustc 1.63.0 (stub)"\n' >"$t/bin/rustc"
printf '#!/bin/sh\necho "cargo 0.66.0 (stub)"\n' >"$t/bin/cargo"
chmod +x "$t/bin/rustc" "$t/bin/cargo"
if deps "" ""; then fail "rustc 1.63 installed: deps.sh succeeded"; fi
grep -q "needs Rust $need or newer.*is 1.63.0" "$t/out" || fail "rustc 1.63 installed: no clear error"

echo "test-deps: deps.sh installs a new enough Rust or stops with a clear error"
