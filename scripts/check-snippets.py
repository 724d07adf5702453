#!/usr/bin/env python3
"""Every Rust, C and Go block in the repository's Markdown is compiled and run by `make test`.

A block is either
  - a plain ```rust block of a file the courier crate includes as doctests (README.md,
    through `crates/courier/src/lib.rs`), compiled and run by `cargo test --doc`; or
  - preceded by `<!-- snippet: PATH -->` (the whole file) or `<!-- snippet: PATH#NAME -->`
    (the lines between `// snippet: NAME` and `// snippet-end` in PATH, dedented), and the
    same text as that file or region, which the build compiles (examples, Go packages);
    in a doctested file such a Rust block is ```rust,ignore (a part of an example).

Anything else fails, as does a block that differs from its source. Usage: check-snippets.py
[--fix] [ROOT] (default: the repository holding this script); --fix copies each marked
block's source into the Markdown.
"""
import difflib
import pathlib
import re
import subprocess
import sys
import textwrap

FIX = "--fix" in sys.argv[1:]
ARGS = [a for a in sys.argv[1:] if a != "--fix"]
ROOT = pathlib.Path(ARGS[0] if ARGS else pathlib.Path(__file__).resolve().parent.parent)
# Markdown files whose Rust blocks are doctests (each included by a hidden item in lib.rs).
DOCTESTED = {"README.md"}
LANGS = {"rust", "c", "go"}
MARK = re.compile(r"^<!-- snippet: (\S+?)(?:#(\S+))? -->$")
FENCE = re.compile(r"^(\s*)```([\w,]*)\s*$")


def region(path, name):
    lines = (ROOT / path).read_text().splitlines()
    begin = [i for i, l in enumerate(lines) if l.strip() == f"// snippet: {name}"]
    if len(begin) != 1:
        raise SystemExit(f"check-snippets: {path} has {len(begin)} '// snippet: {name}' lines, not 1")
    end = next((i for i in range(begin[0] + 1, len(lines)) if lines[i].strip() == "// snippet-end"), None)
    if end is None:
        raise SystemExit(f"check-snippets: {path}: '// snippet: {name}' has no '// snippet-end'")
    return textwrap.dedent("\n".join(lines[begin[0] + 1:end])).strip("\n").splitlines()


def blocks(md):
    """(lang, first line number, body lines, the line before the fence) of each fenced block."""
    lines = md.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        body = [l[len(indent):] if l.startswith(indent) else l for l in lines[i + 1:j]]
        before = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        yield lang, i + 1, body, before, (i + 1, j, indent)
        i = j + 1


def main():
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "*.md"], capture_output=True,
                           text=True, check=True).stdout.split()
    failures, checked = [], 0
    for f in files:
        fixes = []
        for lang, line, body, before, span in blocks(ROOT / f):
            lang, _, attrs = lang.partition(",")
            if lang not in LANGS:
                continue
            where = f"{f}:{line}"
            m = MARK.match(before)
            if m:
                path, name = m.group(1), m.group(2)
                if not (ROOT / path).is_file():
                    failures.append(f"{where}: snippet source {path} does not exist")
                    continue
                want = region(path, name) if name else (ROOT / path).read_text().splitlines()
                if body != want and FIX:
                    fixes.append((span, want))
                elif body != want:
                    diff = "\n".join(difflib.unified_diff(want, body, f"{path}{'#' + name if name else ''}", where, lineterm=""))
                    failures.append(f"{where}: differs from its source (copy the source into the README):\n{diff}")
                checked += 1
            elif lang == "rust" and f in DOCTESTED and not attrs:
                checked += 1
            else:
                failures.append(f"{where}: a {lang} block that nothing compiles: make it a doctest or mark "
                                f"it <!-- snippet: PATH#NAME --> over a compiled source")
        if fixes:
            lines = (ROOT / f).read_text().splitlines()
            for (a, b, indent), want in reversed(fixes):
                lines[a:b] = [indent + l if l else l for l in want]
            (ROOT / f).write_text("\n".join(lines) + "\n")
            print(f"check-snippets: {f}: {len(fixes)} blocks copied from their sources")
    for msg in failures:
        print(msg, file=sys.stderr)
    if failures:
        sys.exit(1)
    print(f"check-snippets: {checked} Rust, C and Go blocks in {len(files)} Markdown files are compiled sources")


main()
