"""Hand-written SVG line charts for the audit report: no JavaScript, no network, no matplotlib."""

from __future__ import annotations

from html import escape
from collections.abc import Sequence

__all__ = ["line_chart"]

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
_W, _H, _L, _R, _T, _B = 720, 256, 64, 16, 44, 40
_LEGEND = 4


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]


def _fmt(v: float) -> str:
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.0f}"
    return f"{v:.2g}" if v else "0"


def line_chart(title: str, series: Sequence[tuple[str, Sequence[float], Sequence[float]]],
               x_label: str, y_label: str, y_max: float | None = None,
               css_class: str = "plot") -> str:
    """An inline ``<svg>`` with axes, ticks, one polyline per ``(label, xs, ys)`` and a legend."""
    xs_all = [x for _, xs, _ in series for x in xs]
    ys_all = [y for _, _, ys in series for y in ys]
    x_hi = max(xs_all, default=1.0) or 1.0
    y_hi = y_max if y_max is not None else (max(ys_all, default=1.0) or 1.0) * 1.05
    pw, ph = _W - _L - _R, _H - _T - _B

    def px(x: float) -> float:
        return _L + pw * x / x_hi

    def py(y: float) -> float:
        return _T + ph * (1 - min(y, y_hi) / y_hi)

    out = [f'<svg class="{css_class}" xmlns="http://www.w3.org/2000/svg" width="{_W}" '
           f'height="{_H}" viewBox="0 0 {_W} {_H}" role="img" aria-label="{escape(title)}">',
           f'<title>{escape(title)}</title>',
           f'<text x="{_L}" y="18" class="t">{escape(title)}</text>',
           f'<rect x="{_L}" y="{_T}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>']
    for v in _ticks(0.0, y_hi):
        y = py(v)
        out.append(f'<line x1="{_L}" x2="{_L + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{_L - 6}" y="{y + 4:.1f}" text-anchor="end" class="k">'
                   f'{_fmt(v)}</text>')
    for v in _ticks(0.0, x_hi):
        x = px(v)
        out.append(f'<text x="{x:.1f}" y="{_T + ph + 16}" text-anchor="middle" class="k">'
                   f'{_fmt(v)}</text>')
    out.append(f'<text x="{_L + pw / 2}" y="{_H - 6}" text-anchor="middle" class="k">'
               f'{escape(x_label)}</text>')
    out.append(f'<text x="14" y="{_T + ph / 2}" text-anchor="middle" class="k" '
               f'transform="rotate(-90 14 {_T + ph / 2})">{escape(y_label)}</text>')
    for i, (label, xs, ys) in enumerate(series):
        color = _COLORS[i % len(_COLORS)]
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys))
        if pts:
            out.append(f'<polyline class="series" fill="none" stroke="{color}" stroke-width="1.5" '
                       f'points="{pts}"/>')
        shown = min(len(series), _LEGEND)
        if i >= shown:
            continue
        lx = _L + 96 * i  # legend row between the title and the plot
        out.append(f'<rect x="{lx}" y="25" width="10" height="10" fill="{color}"/>'
                   f'<text x="{lx + 14}" y="34" class="k">{escape(label)}</text>')
    if len(series) > _LEGEND:
        out.append(f'<text x="{_L + 96 * _LEGEND}" y="34" class="k">'
                   f'+{len(series) - _LEGEND} more</text>')
    if not xs_all:
        out.append(f'<text x="{_L + pw / 2}" y="{_T + ph / 2}" text-anchor="middle" class="k">'
                   'no data</text>')
    out.append("</svg>")
    return "".join(out)
