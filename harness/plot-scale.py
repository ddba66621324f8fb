#!/usr/bin/env python3
"""Draws bench-scale.py's JSON as an SVG: the volume count on the x axis (log
scale), create and attach p50 and p99 (ms) on the left axis, and the nodes' CPU
at rest (percent of one core, all nodes) on the right axis. No plotting
library: the SVG is written by hand, so the docs' plot needs nothing installed.

Usage: harness/plot-scale.py RESULT.json OUT.svg
"""

import json
import math
import sys

WIDTH, HEIGHT = 720, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 80, 40, 60
SERIES = [  # (field, label, colour, axis)
    ("create_ms_p50", "create p50 (ms)", "#1f77b4", "left"),
    ("create_ms_p99", "create p99 (ms)", "#aec7e8", "left"),
    ("attach_ms_p50", "attach p50 (ms)", "#2ca02c", "left"),
    ("attach_ms_p99", "attach p99 (ms)", "#98df8a", "left"),
    ("nodes_cpu_pct_at_rest", "nodes' CPU at rest (% of a core)", "#d62728", "right"),
]


def nice_max(value):
    """The smallest 1, 2 or 5 times a power of ten at least `value`."""
    if value <= 0:
        return 1
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= value)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    steps = json.load(open(sys.argv[1]))["steps"]
    counts = [s["count"] for s in steps]
    x_lo, x_hi = math.log10(min(counts)), math.log10(max(counts))
    x_span = max(x_hi - x_lo, 1e-9)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    axis_max = {side: nice_max(max(s.get(f, 0) for s in steps for f, _, _, a in SERIES if a == side))
                for side in ("left", "right")}

    def x(count):
        return LEFT + (math.log10(count) - x_lo) / x_span * plot_w

    def y(value, side):
        return TOP + plot_h - value / axis_max[side] * plot_h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}"'
           f' font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="14">'
           f'weft control plane: latency and CPU at rest as volumes grow</text>',
           f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" stroke="black"/>',
           f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="black"/>',
           f'<line x1="{LEFT + plot_w}" y1="{TOP}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" stroke="black"/>']
    for count in counts:
        out.append(f'<text x="{x(count):.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">{count:,}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 15}" text-anchor="middle">'
               f'volumes (log scale)</text>')
    for tick in range(5):
        for side, at, anchor in (("left", LEFT - 6, "end"), ("right", LEFT + plot_w + 6, "start")):
            value = axis_max[side] * tick / 4
            out.append(f'<text x="{at}" y="{y(value, side) + 4:.1f}" text-anchor="{anchor}">'
                       f'{value:g}</text>')
    out.append(f'<text x="18" y="{TOP + plot_h / 2}" transform="rotate(-90 18 {TOP + plot_h / 2})"'
               f' text-anchor="middle">milliseconds</text>')
    right_x = WIDTH - 18
    out.append(f'<text x="{right_x}" y="{TOP + plot_h / 2}" transform="rotate(90 {right_x}'
               f' {TOP + plot_h / 2})" text-anchor="middle">% of one core (all nodes)</text>')
    for index, (field, label, colour, side) in enumerate(SERIES):
        points = " ".join(f"{x(s['count']):.1f},{y(s.get(field, 0), side):.1f}" for s in steps)
        dash = ' stroke-dasharray="6 4"' if side == "right" else ""
        out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        for s in steps:
            out.append(f'<circle cx="{x(s["count"]):.1f}" cy="{y(s.get(field, 0), side):.1f}" r="3"'
                       f' fill="{colour}"/>')
        legend_y = TOP + 14 + index * 16
        out.append(f'<line x1="{LEFT + 10}" y1="{legend_y - 4}" x2="{LEFT + 30}" y2="{legend_y - 4}"'
                   f' stroke="{colour}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{LEFT + 36}" y="{legend_y}">{label}</text>')
    out.append("</svg>")
    with open(sys.argv[2], "w") as svg:
        svg.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
