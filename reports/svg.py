"""Inline SVG plots built with ``xml.etree``: examples over time, scenario-class coverage.

Elements are built, never formatted as strings, so every label (a target, an
implementation, a scenario class) is escaped by the serializer.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from typing import Any

from attnfuzz.reports.document import printable, run_verdict

# Distinguishable on white and for the common colour-vision deficiencies (Okabe-Ito).
PALETTE = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000")
FONT = "font-family:system-ui,sans-serif;font-size:11px"
CHAR = 6.6  # rough width of one character at 11px, to size label columns


def _el(parent: ET.Element | None, tag: str, text: str | None = None, **attrs: Any) -> ET.Element:
    attrs = {k.rstrip("_").replace("_", "-"): str(v) for k, v in attrs.items()}
    el = ET.Element(tag, attrs) if parent is None else ET.SubElement(parent, tag, attrs)
    if text is not None:
        el.text = printable(text)
    return el


def nice_ticks(top: float, n: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``top`` (1, 2 or 5 times a power of ten apart)."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    count = math.ceil(top / step - 1e-9)
    return [round(i * step, 10) for i in range(count + 1)]


def _tick_label(x: float) -> str:
    return f"{x:g}" if x < 1e5 else f"{x:.0e}"


def _points(run: Mapping[str, Any]) -> list[tuple[float, float]]:
    pts = [(float(t), float(n)) for t, n in run.get("timeline") or []]
    return pts or [(0.0, 0.0), (float(run["seconds"]), float(run["examples"]))]


def _time_at(points: list[tuple[float, float]], examples: float) -> float | None:
    """When the line reached ``examples`` (linear between points); None if it never did.

    The marker of a first failure sits on its run's line whatever the timeline's
    time origin (the run's start, or the campaign's)."""
    for (t0, n0), (t1, n1) in zip(points, points[1:], strict=False):
        if n0 <= examples <= n1:
            return t0 if n1 == n0 else t0 + (t1 - t0) * (examples - n0) / (n1 - n0)
    return None


def _svg_root(width: int, height: int, kind: str) -> ET.Element:
    """An inline ``<svg>`` of the given size, classed ``plot <kind>``."""
    return _el(
        None,
        "svg",
        xmlns="http://www.w3.org/2000/svg",
        width=width,
        height=height,
        viewBox=f"0 0 {width} {height}",
        role="img",
        class_=f"plot {kind}",
    )


def timeline_svg(
    title: str, runs: Sequence[Mapping[str, Any]], findings: Mapping[str, Mapping[str, Any]]
) -> ET.Element:
    """Examples judged over time, one line per run; a ring marks each first failure."""
    labels = [printable(r["implementation"]) for r in runs]
    legend_w = int(max((len(s) for s in labels), default=4) * CHAR) + 110
    left, top, plot_w, plot_h, bottom = 56, 28, 460, 200, 40
    width, height = left + plot_w + 20 + legend_w, top + plot_h + bottom
    svg = _svg_root(width, height, "timeline")
    _el(svg, "title", f"Examples over time: {title}")
    _el(svg, "text", f"{title}: examples over time", x=left, y=16, style=FONT + ";font-weight:600")
    series = [_points(r) for r in runs]
    xs = nice_ticks(max((p[0] for s in series for p in s), default=1.0))
    ys = nice_ticks(max((p[1] for s in series for p in s), default=1.0))
    xmax, ymax = xs[-1] or 1.0, ys[-1] or 1.0

    def sx(t: float) -> float:
        return round(left + plot_w * t / xmax, 1)

    def sy(n: float) -> float:
        return round(top + plot_h - plot_h * n / ymax, 1)

    axes = _el(svg, "g", class_="axes", style=FONT, fill="#333")
    for t in xs:
        _el(axes, "line", x1=sx(t), x2=sx(t), y1=top, y2=top + plot_h, stroke="#e5e5e5")
        _el(axes, "text", _tick_label(t), x=sx(t), y=top + plot_h + 14, text_anchor="middle")
    for n in ys:
        _el(axes, "line", x1=left, x2=left + plot_w, y1=sy(n), y2=sy(n), stroke="#e5e5e5")
        _el(axes, "text", _tick_label(n), x=left - 6, y=sy(n) + 4, text_anchor="end")
    _el(axes, "rect", x=left, y=top, width=plot_w, height=plot_h, fill="none", stroke="#999")
    _el(axes, "text", "seconds", x=left + plot_w / 2, y=height - 6, text_anchor="middle")
    _el(
        axes,
        "text",
        "examples",
        x=12,
        y=top + plot_h / 2,
        text_anchor="middle",
        transform=f"rotate(-90 12 {top + plot_h / 2})",
    )

    for i, (run, pts) in enumerate(zip(runs, series, strict=True)):
        colour = PALETTE[i % len(PALETTE)]
        dash = "5 3" if run["kind"] == "mutant" else "none"
        g = _el(svg, "g", class_="series")
        _el(g, "title", f"{labels[i]} ({run['kind']}): {run['examples']} examples")
        _el(
            g,
            "polyline",
            points=" ".join(f"{sx(t)},{sy(n)}" for t, n in pts),
            fill="none",
            stroke=colour,
            stroke_width=2,
            stroke_dasharray=dash,
        )
        for fid in run.get("findings", []):
            f = findings.get(fid)
            if f is None or f.get("examples_to_failure") is None:
                continue
            n = f["examples_to_failure"]
            t = _time_at(pts, n)
            if t is None:
                t = f.get("seconds_to_failure") or 0.0
            mark = _el(g, "circle", cx=sx(t), cy=sy(n), r=5, fill="white", stroke=colour)
            mark.set("stroke-width", "2")
            _el(mark, "title", f"first failure of {labels[i]}: {f['key']} after {n} examples")
        ly = top + 8 + 18 * i
        lx = left + plot_w + 20
        _el(
            g,
            "line",
            x1=lx,
            x2=lx + 24,
            y1=ly,
            y2=ly,
            stroke=colour,
            stroke_width=2,
            stroke_dasharray=dash,
        )
        _el(g, "text", f"{labels[i]} ({run_verdict(run)})", x=lx + 30, y=ly + 4, style=FONT)
    return svg


def _shade(share: float) -> str:
    """White to blue by share; an unseen class is tinted red, a gap in coverage."""
    if share <= 0:
        return "#fbe3e1"
    a = 0.15 + 0.85 * min(share, 1.0)
    r, g, b = (round(255 - a * (255 - c)) for c in (0, 114, 178))
    return f"#{r:02x}{g:02x}{b:02x}"


def coverage_svg(title: str, runs: Sequence[Mapping[str, Any]]) -> ET.Element:
    """A heat map: scenario classes (rows) x runs (columns), share of each run's examples."""
    labels = sorted({k for r in runs for k in r.get("labels", {})})
    names = [printable(r["implementation"]) for r in runs]
    row_h, col_w = 20, max(64, int(max((len(s) for s in names), default=4) * CHAR) + 12)
    left = int(max((len(s) for s in labels), default=8) * CHAR) + 16
    top = 44
    width = left + col_w * len(runs) + 10
    height = top + row_h * max(len(labels), 1) + 10
    svg = _svg_root(width, height, "coverage")
    _el(svg, "title", f"Scenario-class coverage: {title}")
    _el(
        svg,
        "text",
        f"{title}: scenario classes, share of examples",
        x=4,
        y=16,
        style=FONT + ";font-weight:600",
    )
    for j, name in enumerate(names):
        _el(
            svg,
            "text",
            name,
            x=left + col_w * j + col_w / 2,
            y=top - 8,
            text_anchor="middle",
            style=FONT,
        )
    if not labels:
        _el(svg, "text", "no scenario class recorded", x=4, y=top + 14, style=FONT)
    for i, label in enumerate(labels):
        y = top + row_h * i
        _el(svg, "text", label, x=left - 8, y=y + 14, text_anchor="end", style=FONT)
        for j, run in enumerate(runs):
            n = run.get("labels", {}).get(label, 0)
            share = n / run["examples"] if run["examples"] else 0.0
            cell = _el(svg, "g", class_="cell")
            _el(cell, "title", f"{label} in {names[j]}: {n} of {run['examples']} examples")
            _el(
                cell,
                "rect",
                x=left + col_w * j + 1,
                y=y + 1,
                width=col_w - 2,
                height=row_h - 2,
                fill=_shade(share),
            )
            ink = "white" if share > 0.55 else "#222"
            _el(
                cell,
                "text",
                f"{100 * share:.0f}%",
                x=left + col_w * j + col_w / 2,
                y=y + 14,
                text_anchor="middle",
                fill=ink,
                style=FONT,
            )
    return svg
