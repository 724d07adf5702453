#!/usr/bin/env python3
"""Sections of bench/RESULTS.md that other scripts write, kept across `make bench`.

`bench/report.py build` writes RESULTS.md afresh; sections that come from other runs
(OpenSHMEM against OSHMEM, EXS, job start-up) sit between markers
`<!-- NAME:begin ... -->` and `<!-- NAME:end -->` and are carried over.

  carry.py extract RESULTS.md          print every marked section, in order
  carry.py splice RESULTS.md NAME FILE put FILE's text (without markers) as section
                                          NAME: in place of the old one, or at the end
"""
import re
import sys

BLOCK = re.compile(r"<!-- ([a-z0-9_-]+):begin[^>]*-->.*?<!-- \1:end -->\n?", re.S)


def extract(text):
    return [m.group(0).rstrip("\n") + "\n" for m in BLOCK.finditer(text)]


def splice(text, name, body):
    block = f"<!-- {name}:begin -->\n{body.strip()}\n<!-- {name}:end -->\n"
    for m in BLOCK.finditer(text):
        if m.group(1) == name:
            return text[: m.start()] + block + text[m.end():]
    return text.rstrip("\n") + "\n\n" + block


def selftest():
    doc = "# R\n\nx\n\n<!-- a:begin (w) -->\nA\n<!-- a:end -->\n\ny\n"
    assert extract(doc) == ["<!-- a:begin (w) -->\nA\n<!-- a:end -->\n"], extract(doc)
    once = splice(doc, "b", "B1")
    twice = splice(once, "b", "B2")
    assert twice.count("<!-- b:begin -->") == 1 and "B2" in twice and "B1" not in twice, twice
    assert splice(twice, "a", "A2").startswith("# R\n\nx\n\n<!-- a:begin -->\nA2\n"), twice
    assert extract("no markers\n") == []


def main(argv):
    if argv[:1] == ["selftest"]:
        selftest()
        return 0
    if len(argv) == 2 and argv[0] == "extract":
        with open(argv[1]) as fh:
            print("\n".join(extract(fh.read())), end="")
        return 0
    if len(argv) == 4 and argv[0] == "splice":
        with open(argv[1]) as fh:
            text = fh.read()
        with open(argv[3]) as fh:
            body = fh.read()
        with open(argv[1], "w") as fh:
            fh.write(splice(text, argv[2], body))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
