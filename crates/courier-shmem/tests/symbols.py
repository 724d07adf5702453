#!/usr/bin/env python3
"""The OpenSHMEM headers and the library agree: every function and variable that
include/shmem.h and include/shmemx.h declare (other than their static inline ones) is
exported by libcourier_shmem.so, and the library exports nothing else.

Usage: symbols.py [LIB]   (LIB defaults to target/release/libcourier_shmem.so)
The headers go through the C preprocessor first, so what is checked is what a C program
sees. Exits 1, naming each name that is on one side only."""

import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
INCLUDE = os.path.join(HERE, "..", "include")


def statements(text):
    """The top-level statements of preprocessed C: (text, had_body) pairs."""
    out, cur, depth = [], [], 0
    for ch in text:
        cur.append(ch)
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                s = "".join(cur).strip()
                # `extern "C" {` is not a body
                out.append((s, True))
                cur = []
        elif ch == ";" and depth == 0:
            out.append(("".join(cur).strip(), False))
            cur = []
    return out


# Declared on purpose and never defined: the C11 generic interfaces name it for an argument
# of a type they do not take, so that such a program fails to link.
NEVER_DEFINED = {"shmem_c11_type_not_supported"}


def ours(pre):
    """The parts of the preprocessor's output that come from our two headers (the line
    markers name each part's file), not from the system headers they include."""
    keep, mine = [], False
    for line in pre.splitlines():
        m = re.match(r'^# \d+ "([^"]+)"', line)
        if m:
            mine = os.path.basename(m.group(1)) in ("shmem.h", "shmemx.h")
        elif mine:
            keep.append(line)
    return "\n".join(keep)


def declared():
    src = '#include <shmem.h>\n#include <shmemx.h>\n'
    pre = subprocess.run(["cc", "-E", "-std=gnu11", "-I", INCLUDE, "-x", "c", "-"],
                         input=src, capture_output=True, text=True, check=True).stdout
    pre = ours(pre)
    names = set()
    for s, body in statements(pre):
        s = " ".join(s.split())
        if body or s.startswith("typedef") or "static" in s.split("(")[0].split():
            continue
        m = re.match(r"^(?:extern\s+)?[\w\s\*]*?\b(\w+)\s*\(", s)
        if m:  # a function: the identifier before the parameter list
            names.add(m.group(1))
            continue
        m = re.match(r"^extern\s+[\w\s\*]+?\b(\w+)\s*;$", s)
        if m:  # a variable
            names.add(m.group(1))
    return names - NEVER_DEFINED


def exported(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def main():
    lib = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/libcourier_shmem.so")
    h, so = declared(), exported(lib)
    if len(h) < 1000:
        print(f"symbols.py: only {len(h)} declarations parsed from the headers", file=sys.stderr)
        return 1
    missing, extra = sorted(h - so), sorted(so - h)
    for n in missing:
        print(f"declared in the headers, not exported by {os.path.basename(lib)}: {n}")
    for n in extra:
        print(f"exported by {os.path.basename(lib)}, not declared in the headers: {n}")
    if missing or extra:
        return 1
    print(f"symbols.py: the headers' {len(h)} functions and variables are exactly the library's exports")
    return 0


if __name__ == "__main__":
    sys.exit(main())
