#!/usr/bin/env bash
# Regenerate include/courier.h into a temporary file and compare it with the committed one.
# Exit status: 0 when they match, 1 when the committed header is stale (the diff is printed),
# 2 when cbindgen is missing or fails. Fix a stale header with:
#   (cd crates/courier-capi && cbindgen --config cbindgen.toml --crate courier-capi --output include/courier.h)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
CBINDGEN="${CBINDGEN:-cbindgen}"
if ! command -v "$CBINDGEN" >/dev/null 2>&1; then
  echo "check-header: cbindgen not found (cargo install cbindgen --version 0.29.4 --locked)" >&2
  exit 2
fi
tmp="$(mktemp)"
trap 'rm -f "$tmp"' EXIT
(cd "$here" && "$CBINDGEN" --quiet --config cbindgen.toml --crate courier-capi --output "$tmp") || exit 2
if diff -u "$here/include/courier.h" "$tmp"; then
  echo "check-header: include/courier.h is up to date"
else
  echo "check-header: include/courier.h differs from what cbindgen generates; regenerate it" >&2
  exit 1
fi
