"""Plots as inline SVG data URIs, drawn by hand.

Three chart shapes are all a report needs; writing them as SVG keeps report.html self-contained and
sharp at any zoom, and keeps matplotlib (2-3 s of import) off every compile, where the report is
written: a cached compile must cost a few per cent of a cold one.
"""
from __future__ import annotations

import base64
import math
from html import escape

HTP_COLOR, CPU_COLOR, LINE_COLOR = "#2e7d32", "#c62828", "#1565c0"
LABEL_W, PLOT_W, ROW_H, TOP, BOTTOM = 190, 420, 18, 34, 56


def _svg(width: int, height: int, body: list[str]) -> str:
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
           f'<rect width="100%" height="100%" fill="white"/>{"".join(body)}</svg>')
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()


def _text(x: float, y: float, s: str, anchor: str = "start", extra: str = "", size: int = 11) -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-family="sans-serif" font-size="{size}" {extra}>'
            f'{escape(str(s))}</text>')


def _drawable(values: list, threshold: float | None = None) -> list[float]:
    """The values as drawn: +inf (an output verified exactly) at the largest finite one (at least twice
    the threshold), -inf at the smallest, NaN or None at 0."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    top, low = max([*finite, 2 * (threshold or 0.0), 1.0]), min([*finite, 0.0])
    return [v if v is not None and math.isfinite(v) else 0.0 if v is None or math.isnan(v) else (top if v > 0 else low)
            for v in values]


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 × 10^k apart) covering [lo, hi]."""
    raw = ((hi - lo) or 1.0) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * 0.999)
    first = math.ceil(lo / step - 1e-9) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step + 1e-9) + 1)]


def _hbars(labels: list[str], segments: list[list[tuple[float, str]]], title: str, xlabel: str,
           threshold: float | None = None, legend: list[tuple[str, str]] = ()) -> str:
    """Horizontal bars, one row per label, each a stack of (value, colour) segments from 0."""
    totals = [sum(v for v, _ in seg) for seg in segments]
    lo = min([0.0, *(v for v in totals), *([threshold] if threshold is not None else [])])
    hi = max([0.0, *(v for v in totals), *([threshold] if threshold is not None else [])]) or 1.0
    x = lambda v: LABEL_W + (v - lo) / (hi - lo) * PLOT_W   # noqa: E731
    height = TOP + ROW_H * len(labels) + BOTTOM
    body = [_text(LABEL_W + PLOT_W / 2, 18, title, "middle", 'font-weight="bold"', 13)]
    for t in _ticks(lo, hi):
        body.append(f'<line x1="{x(t):.1f}" y1="{TOP - 4}" x2="{x(t):.1f}" y2="{height - BOTTOM}" stroke="#ddd"/>')
        body.append(_text(x(t), height - BOTTOM + 14, f"{t:g}", "middle"))
    for i, (label, seg) in enumerate(zip(labels, segments)):
        y = TOP + i * ROW_H
        body.append(_text(LABEL_W - 6, y + ROW_H * 0.7, label[-32:], "end"))
        start = 0.0
        for v, color in seg:
            a, b = sorted((x(start), x(start + v)))
            body.append(f'<rect x="{a:.1f}" y="{y + 2}" width="{max(b - a, 0.5):.1f}" height="{ROW_H - 4}" fill="{color}">'
                        f'<title>{escape(label)}: {v:g}</title></rect>')
            start += v
    if threshold is not None:
        body.append(f'<line x1="{x(threshold):.1f}" y1="{TOP - 4}" x2="{x(threshold):.1f}" y2="{height - BOTTOM}" '
                    f'stroke="black" stroke-dasharray="4 3"/>')
        legend = [*legend, (f"threshold {threshold:g}", "black")]
    body.append(_text(LABEL_W + PLOT_W / 2, height - BOTTOM + 30, xlabel, "middle"))
    for j, (name, color) in enumerate(legend):
        lx = LABEL_W + PLOT_W - 110 * (len(legend) - j)
        body.append(f'<rect x="{lx}" y="{height - 16}" width="10" height="10" fill="{color}"/>')
        body.append(_text(lx + 14, height - 7, name))
    return _svg(LABEL_W + PLOT_W + 20, height, body)


def placement_by_op(by_op: dict[str, dict[str, int]]) -> str:
    """Stacked horizontal bars: nodes per op type on HTP and on CPU (the 25 most frequent types)."""
    ops = sorted(by_op, key=lambda o: -(by_op[o].get("HTP", 0) + by_op[o].get("CPU", 0)))[:25]
    segs = [[(by_op[o].get("HTP", 0), HTP_COLOR), (by_op[o].get("CPU", 0), CPU_COLOR)] for o in ops]
    return _hbars(ops, segs, "Placement by op type", "nodes", legend=[("HTP", HTP_COLOR), ("CPU fallback", CPU_COLOR)])


def bars(labels: list[str], values: list[float], title: str, xlabel: str, threshold: float | None = None) -> str:
    """One bar per label; red where below the threshold. An exact output (inf dB) draws at the largest
    finite value shown (at least twice the threshold), a NaN at 0."""
    drawn = _drawable(values, threshold)
    segs = [[(d, HTP_COLOR if threshold is None or (v is not None and v >= threshold) else CPU_COLOR)]
            for v, d in zip(values, drawn)]
    return _hbars(labels, segs, title, xlabel, threshold)


def line(labels: list[str], values: list[float], title: str, ylabel: str, threshold: float | None = None) -> str:
    """Values in order (e.g. SQNR per layer) with the threshold as a dashed line; points below it red."""
    w, h, left, right, top, bottom = 820, 300, 60, 20, 30, 90
    values = _drawable(values, threshold)
    pool = [*values, *([threshold] if threshold is not None else [])] or [0.0]
    lo, hi = min(pool), max(pool)
    lo, hi = (lo - 1, hi + 1) if hi == lo else (lo, hi)
    n = max(len(values) - 1, 1)
    x = lambda i: left + i / n * (w - left - right)        # noqa: E731
    y = lambda v: top + (hi - v) / (hi - lo) * (h - top - bottom)   # noqa: E731
    body = [_text(w / 2, 18, title, "middle", 'font-weight="bold"', 13)]
    for t in _ticks(lo, hi):
        body.append(f'<line x1="{left}" y1="{y(t):.1f}" x2="{w - right}" y2="{y(t):.1f}" stroke="#ddd"/>')
        body.append(_text(left - 6, y(t) + 4, f"{t:g}", "end"))
    pts = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
    body.append(f'<polyline points="{pts}" fill="none" stroke="{LINE_COLOR}" stroke-width="1.5"/>')
    for i, v in enumerate(values):
        bad = threshold is not None and v < threshold
        body.append(f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="2.5" fill="{CPU_COLOR if bad else LINE_COLOR}">'
                    f'<title>{escape(labels[i])}: {v:.2f}</title></circle>')
    if threshold is not None:
        body.append(f'<line x1="{left}" y1="{y(threshold):.1f}" x2="{w - right}" y2="{y(threshold):.1f}" '
                    f'stroke="{CPU_COLOR}" stroke-dasharray="5 3"/>')
        body.append(_text(w - right, y(threshold) - 4, f"threshold {threshold:g} dB", "end"))
    step = max(1, len(labels) // 15)
    for i in range(0, len(labels), step):
        body.append(_text(x(i), h - bottom + 12, labels[i][-28:], "end",
                          f'transform="rotate(-45 {x(i):.1f} {h - bottom + 12})"', 9))
    body.append(_text(14, top + (h - top - bottom) / 2, ylabel, "middle", f'transform="rotate(-90 14 {top + (h - top - bottom) / 2})"'))
    return _svg(w, h, body)


def scatter(points: list[tuple[float, float]], labels: list[str], title: str, xlabel: str, ylabel: str,
            threshold: float | None = None, chosen: int | None = None) -> str:
    """(x, y) points (e.g. a candidate's cycles and dB), the chosen one ringed, the threshold dashed."""
    w, h, left, right, top, bottom = 820, 320, 70, 20, 30, 50
    xs, ys = _drawable([p[0] for p in points]) or [0.0], _drawable([p[1] for p in points], threshold) or [0.0]
    points = list(zip(xs, ys))
    ypool = [*ys, *([threshold] if threshold is not None else [])]
    xlo, xhi = 0.0, max(xs) * 1.05 or 1.0
    ylo, yhi = min(ypool), max(ypool)
    ylo, yhi = (ylo - 1, yhi + 1) if yhi == ylo else (ylo - 0.05 * (yhi - ylo), yhi + 0.05 * (yhi - ylo))
    x = lambda v: left + (v - xlo) / (xhi - xlo) * (w - left - right)    # noqa: E731
    y = lambda v: top + (yhi - v) / (yhi - ylo) * (h - top - bottom)      # noqa: E731
    body = [_text(w / 2, 18, title, "middle", 'font-weight="bold"', 13)]
    for t in _ticks(ylo, yhi):
        body.append(f'<line x1="{left}" y1="{y(t):.1f}" x2="{w - right}" y2="{y(t):.1f}" stroke="#ddd"/>')
        body.append(_text(left - 6, y(t) + 4, f"{t:g}", "end"))
    for t in _ticks(xlo, xhi):
        body.append(_text(x(t), h - bottom + 16, f"{t:.3g}", "middle"))
    if threshold is not None:
        body.append(f'<line x1="{left}" y1="{y(threshold):.1f}" x2="{w - right}" y2="{y(threshold):.1f}" '
                    f'stroke="{CPU_COLOR}" stroke-dasharray="5 3"/>')
        body.append(_text(w - right, y(threshold) - 4, f"budget {threshold:g} dB", "end"))
    for i, ((px, py), lab) in enumerate(zip(points, labels)):
        ok = threshold is None or py >= threshold
        body.append(f'<circle cx="{x(px):.1f}" cy="{y(py):.1f}" r="5" fill="{HTP_COLOR if ok else CPU_COLOR}">'
                    f'<title>{escape(lab)}: {py:.1f} dB, {px:,.0f}</title></circle>')
        body.append(_text(x(px) + 8, y(py) + 4, str(i + 1), size=10))
        if i == chosen:
            body.append(f'<circle cx="{x(px):.1f}" cy="{y(py):.1f}" r="9" fill="none" stroke="black" stroke-width="1.5"/>')
    body.append(_text(left + (w - left - right) / 2, h - 8, xlabel, "middle"))
    body.append(_text(14, top + (h - top - bottom) / 2, ylabel, "middle", f'transform="rotate(-90 14 {top + (h - top - bottom) / 2})"'))
    return _svg(w, h, body)
