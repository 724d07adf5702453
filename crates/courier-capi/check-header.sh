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

# The header's minimal example compiles (against the header alone).
ex="$(mktemp --suffix=.c)"
trap 'rm -f "$tmp" "$ex" "$ex.o"' EXIT
{
  printf '#include <courier.h>\n#include <stdio.h>\nint main(void) {\n'
  sed -n '/^ \*     courier_context_t \*ctx;/,/^ \*     courier_context_destroy(ctx);/p' "$here/include/courier.h" | cut -c4-
  printf 'return s < 0;\n}\n'
} > "$ex"
grep -q courier_context_destroy "$ex" || { echo "check-header: the header's example is missing" >&2; exit 1; }
if ! "${CC:-cc}" -std=c11 -Wall -Wextra -Werror -I"$here/include" -c "$ex" -o "$ex.o"; then
  echo "check-header: the example at the top of courier.h does not compile" >&2
  exit 1
fi
echo "check-header: the header's example compiles"
