"""SVG plots for bench/report.py (standard library only): log2 x axis, log10 y axis, lines
with markers, a legend."""

from __future__ import annotations

import math
from xml.sax.saxutils import escape

KIB = 1024
MIB = 1024 * 1024


def fmt_size_short(n: int) -> str:
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB}M"
    if n >= KIB and n % KIB == 0:
        return f"{n // KIB}K"
    return str(n)


COLORS = {"courier": "#d62728", "ucx": "#1f77b4"}
LABELS = {"courier": "Courier", "ucx": "UCX ucx_perftest"}
MARKERS = {"courier": "circle", "ucx": "square"}


def _nice_ticks(lo: float, hi: float) -> list[float]:
    e0, e1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    mult = [1] if e1 - e0 > 3 else [1, 2, 5]
    ticks = []
    for e in range(e0, e1 + 1):
        for m in mult:
            v = m * 10.0 ** e
            if lo <= v <= hi:
                ticks.append(v)
    return ticks


def _fmt_tick(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:g}M"
    if v >= 1e4:
        return f"{v / 1e3:g}K"
    return f"{v:g}"


def svg_plot(path: str, title: str, ylabel: str, series: dict[str, list[tuple[int, float]]]) -> None:
    W, H = 760, 470
    L, R, T, B = 80, 30, 50, 60
    pw, ph = W - L - R, H - T - B
    xs = [s for pts in series.values() for s, v in pts if v]
    ys = [v for pts in series.values() for s, v in pts if v and v > 0]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="Helvetica, Arial, sans-serif" font-size="12">',
           f'<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="24" text-anchor="middle" font-size="16" font-weight="bold">'
           f'{escape(title)}</text>']
    if not ys:
        out.append(f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">no data</text></svg>')
        with open(path, "w") as fh:
            fh.write("\n".join(out) + "\n")
        return
    x_lo, x_hi = math.log2(min(xs)), math.log2(max(xs))
    if x_hi == x_lo:
        x_hi += 1
    y_lo = 10 ** math.floor(math.log10(min(ys)))
    y_hi = 10 ** math.ceil(math.log10(max(ys)))
    if y_hi <= y_lo:
        y_hi = y_lo * 10
    ly_lo, ly_hi = math.log10(y_lo), math.log10(y_hi)

    def px(x):
        return L + (math.log2(x) - x_lo) / (x_hi - x_lo) * pw

    def py(y):
        return T + ph - (math.log10(y) - ly_lo) / (ly_hi - ly_lo) * ph

    # grid and ticks
    for v in _nice_ticks(y_lo, y_hi):
        y = py(v)
        out.append(f'<line x1="{L}" y1="{y:.1f}" x2="{L + pw}" y2="{y:.1f}" stroke="#e0e0e0"/>')
        out.append(f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt_tick(v)}</text>')
    for s in sorted(set(xs)):
        x = px(s)
        out.append(f'<line x1="{x:.1f}" y1="{T}" x2="{x:.1f}" y2="{T + ph}" stroke="#eeeeee"/>')
        out.append(f'<text x="{x:.1f}" y="{T + ph + 16}" text-anchor="middle">{fmt_size_short(s)}</text>')
    out.append(f'<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="none" stroke="black"/>')
    out.append(f'<text x="{L + pw / 2}" y="{H - 16}" text-anchor="middle">message size (bytes, log scale)</text>')
    out.append(f'<text x="18" y="{T + ph / 2}" text-anchor="middle" '
               f'transform="rotate(-90 18 {T + ph / 2})">{escape(ylabel)} (log scale)</text>')
    # series
    for i, (tool, pts) in enumerate(series.items()):
        col = COLORS.get(tool, "#333333")
        good = [(s, v) for s, v in pts if v and v > 0]
        if len(good) > 1:
            d = " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in good)
            out.append(f'<polyline points="{d}" fill="none" stroke="{col}" stroke-width="2"/>')
        for s, v in good:
            if MARKERS.get(tool) == "square":
                out.append(f'<rect x="{px(s) - 3.5:.1f}" y="{py(v) - 3.5:.1f}" width="7" height="7" fill="{col}"/>')
            else:
                out.append(f'<circle cx="{px(s):.1f}" cy="{py(v):.1f}" r="3.5" fill="{col}"/>')
        # legend
        lx, ly = L + 14, T + 16 + i * 20
        out.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 26}" y2="{ly}" stroke="{col}" stroke-width="2"/>')
        out.append(f'<text x="{lx + 32}" y="{ly + 4}">{escape(LABELS.get(tool, tool))}</text>')
    out.append("</svg>")
    with open(path, "w") as fh:
        fh.write("\n".join(out) + "\n")
