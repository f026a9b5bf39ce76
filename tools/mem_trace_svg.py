#!/usr/bin/env python3
"""tools/mem_trace_svg.py — draws a UMT_MEM_TRACE file (Chrome trace-event JSON, memory/trace.h)
as an SVG: each pool's bytes in use over one training step, and under it backward's kernels and
the offload tier's copies in (prefetches), updates (GPU kernels; CPU threads) and copies out, one
lane each, as the device ran them.

    python3 tools/mem_trace_svg.py trace.json [--step N] [-o memory.svg]

--step picks the step (the "step N" marks umt_step_begin writes; default: the last whole step).
Only the standard library: no network, no packages.
"""
import argparse
import json
import sys

COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]
LANES = [("backward", "backward"), ("prefetch", "copy in"), ("optimizer", "update"), ("cpu update", "cpu update"),
         ("offload", "copy out")]
HOST_POOLS = {"staging", "offload"}  # pinned host memory: listed, not drawn (their scale hides the GPU's)
WIDTH, PLOT_H, LANE_H, LEFT, TOP = 960, 300, 18, 70, 40


def step_window(events, wanted):
    marks = sorted((e["ts"], int(e["name"].split()[1])) for e in events
                   if e.get("cat") == "step" and e.get("name", "").startswith("step "))
    if len(marks) < 2:
        sys.exit("mem_trace_svg: the trace has fewer than two step marks: no whole step to draw")
    pairs = list(zip(marks, marks[1:]))
    if wanted is None:
        return pairs[-1][0][1], pairs[-1][0][0], pairs[-1][1][0]
    for (t0, n), (t1, _) in pairs:
        if n == wanted:
            return n, t0, t1
    sys.exit(f"mem_trace_svg: step {wanted} is not a whole step of this trace (marks: {[n for _, n in marks]})")


def series(events, t0, t1):
    """Per pool, (ts, bytes) points inside [t0, t1], starting from the value in force at t0."""
    counters = sorted((e["ts"], e["args"]) for e in events if e.get("ph") == "C" and e.get("name") == "pool bytes")
    before = [args for ts, args in counters if ts <= t0]
    inside = [(ts, args) for ts, args in counters if t0 < ts <= t1]
    start = before[-1] if before else (inside[0][1] if inside else {})
    pools = list(start.keys()) or (list(inside[0][1].keys()) if inside else [])
    out = {}
    for pool in pools:
        points = [(t0, start.get(pool, 0))] + [(ts, args.get(pool, 0)) for ts, args in inside]
        last = points[-1][1]
        points.append((t1, last))
        if any(v for _, v in points):
            out[pool] = points
    return out


def svg(step, t0, t1, pools, intervals, host):
    span = max(t1 - t0, 1.0)
    top = max([v for pts in pools.values() for _, v in pts] + [1])
    x = lambda ts: LEFT + (ts - t0) / span * (WIDTH - LEFT - 20)
    y = lambda v: TOP + PLOT_H - v / top * PLOT_H
    lanes_top = TOP + PLOT_H + 40
    height = lanes_top + LANE_H * len(LANES) + 60 + 16 * (len(pools) + len(host))
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="11">',
         f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
         f'<text x="{LEFT}" y="20" font-size="14">umtrain memory, step {step}: GPU bytes in use per pool ({span / 1e3:.1f} ms)</text>']
    for k in range(5):  # y axis in GiB
        v = top * k / 4
        s.append(f'<line x1="{LEFT}" x2="{WIDTH - 20}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        s.append(f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v / 2**30:.2f} GiB</text>')
    for k in range(6):  # x axis in ms
        ts = t0 + span * k / 5
        s.append(f'<text x="{x(ts):.1f}" y="{TOP + PLOT_H + 16}" text-anchor="middle">{(ts - t0) / 1e3:.0f} ms</text>')
    for i, (pool, pts) in enumerate(sorted(pools.items())):
        colour = COLOURS[i % len(COLOURS)]
        path = []
        for j, (ts, v) in enumerate(pts):  # a step line: a value holds until the next event
            if j:
                path.append(f"L{x(ts):.1f},{y(pts[j - 1][1]):.1f}")
            path.append(f"{'M' if not j else 'L'}{x(ts):.1f},{y(v):.1f}")
        s.append(f'<path d="{" ".join(path)}" fill="none" stroke="{colour}" stroke-width="2"/>')
        ly = lanes_top + LANE_H * len(LANES) + 40 + 16 * i
        s.append(f'<rect x="{LEFT}" y="{ly - 9}" width="12" height="10" fill="{colour}"/>')
        s.append(f'<text x="{LEFT + 18}" y="{ly}">{pool}: {max(v for _, v in pts) / 2**30:.3f} GiB at most</text>')
    for j, (pool, peak) in enumerate(sorted(host.items())):
        ly = lanes_top + LANE_H * len(LANES) + 40 + 16 * (len(pools) + j)
        s.append(f'<text x="{LEFT + 18}" y="{ly}">{pool} (pinned host memory, not drawn): {peak / 2**30:.3f} GiB at most</text>')
    for k, (cat, label) in enumerate(LANES):
        ly = lanes_top + LANE_H * k
        s.append(f'<text x="{LEFT - 6}" y="{ly + 12}" text-anchor="end">{label}</text>')
        s.append(f'<rect x="{LEFT}" y="{ly}" width="{WIDTH - LEFT - 20}" height="{LANE_H - 4}" fill="#f4f4f4"/>')
        for e in intervals:
            if e.get("cat") != cat or e["ts"] + e["dur"] < t0 or e["ts"] > t1:
                continue
            a, b = x(max(e["ts"], t0)), x(min(e["ts"] + e["dur"], t1))
            size = e.get("args", {}).get("bytes", 0)
            title = f'{e["name"]} {size} bytes' if size else e["name"]  # kernels move no bytes of their own
            s.append(f'<rect x="{a:.1f}" y="{ly}" width="{max(b - a, 0.5):.1f}" height="{LANE_H - 4}" '
                     f'fill="{COLOURS[k]}"><title>{title}</title></rect>')
    s.append("</svg>")
    return "\n".join(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--step", type=int, default=None)
    ap.add_argument("-o", "--output", default="memory.svg")
    a = ap.parse_args()
    with open(a.trace) as f:
        events = json.load(f)["traceEvents"]
    step, t0, t1 = step_window(events, a.step)
    pools = series(events, t0, t1)
    host = {p: max(v for _, v in pts) for p, pts in pools.items() if p in HOST_POOLS}
    pools = {p: pts for p, pts in pools.items() if p not in HOST_POOLS}
    intervals = [e for e in events if e.get("ph") == "X"]
    with open(a.output, "w") as f:
        f.write(svg(step, t0, t1, pools, intervals, host))
    copies = sum(1 for e in intervals if t0 <= e["ts"] <= t1)
    print(f"mem_trace_svg: step {step}, {(t1 - t0) / 1e3:.1f} ms, {len(pools)} pools, {copies} device intervals -> {a.output}")


if __name__ == "__main__":
    main()
