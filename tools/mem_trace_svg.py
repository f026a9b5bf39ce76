#!/usr/bin/env python3
"""tools/mem_trace_svg.py — draws a UMT_MEM_TRACE file (Chrome trace-event JSON, memory/trace.h)
as an SVG: the GPU pools' bytes in use over one training step, stacked so that the top of the
stack is the GPU memory in use, with the device budget as a line; under it backward's kernels and
the offload tier's copies in (prefetches), updates (GPU kernels; CPU threads) and copies out, one
lane each, as the device and the threads ran them.

    python3 tools/mem_trace_svg.py trace.json [--step N] [-o memory.svg] [--min-coverage 0.95]

--step picks the step (the "step N" marks umt_step_begin writes; default: the last whole step).
It prints how much of the step the lanes account for, e.g. "step 5: 208.1 ms, lanes cover 97.3%"
(the union of every lane's bars over the step's wall time) and the longest blank; with
--min-coverage F it exits 1 when that fraction is under F. Only the standard library.
"""
import argparse
import json
import sys

COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]
# (category of the trace's complete events, lane label), top to bottom.
LANES = [("forward", "forward"), ("backward", "backward"), ("prefetch", "copy in"), ("optimizer", "update"), ("cpu update", "cpu update"),
         ("offload", "copy out")]
# Lanes that show the host waiting (offload/update.c): drawn, never counted in the coverage.
WAITS = {"host waits"}
# Traces written before otherData named the stacked pools: the pinned host pools are not GPU memory.
HOST_POOLS = {"staging", "offload"}
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


def stack(pools, order):
    """The pools in order, bottom first, on one time axis: (times, [(pool, lower, upper)]) where
    lower and upper are the stack's bytes below and at the top of the pool at each time (a value
    holds until the pool's next point). upper of the last pool is the sum: the GPU's use."""
    times = sorted({ts for pts in pools.values() for ts, _ in pts})
    below = [0] * len(times)
    layers = []
    for pool in order:
        pts = pools[pool]
        values, j = [], 0
        for ts in times:
            while j + 1 < len(pts) and pts[j + 1][0] <= ts:
                j += 1
            values.append(pts[j][1] if pts[j][0] <= ts else 0)
        upper = [b + v for b, v in zip(below, values)]
        layers.append((pool, below, upper))
        below = upper
    return times, layers


def union(intervals):
    """Merged, sorted [a, b) intervals."""
    merged = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def coverage(intervals, t0, t1):
    """The fraction of [t0, t1] inside at least one interval (ts, ts + dur), and the longest blank
    as (start, length)."""
    clipped = [(max(e["ts"], t0), min(e["ts"] + e["dur"], t1)) for e in intervals
               if e["ts"] < t1 and e["ts"] + e["dur"] > t0]
    merged = union(clipped)
    covered = sum(b - a for a, b in merged)
    edges = [t0] + [x for ab in merged for x in ab] + [t1]
    gaps = [(edges[k], edges[k + 1] - edges[k]) for k in range(0, len(edges), 2)]
    longest = max(gaps, key=lambda g: g[1])
    return covered / max(t1 - t0, 1e-9), longest


def lanes_of(intervals):
    """LANES, then a lane for any other category the trace has (every bar is drawn and counted)."""
    known = {cat for cat, _ in LANES}
    extra = sorted({e.get("cat", "") for e in intervals} - known)
    return LANES + [(cat, cat) for cat in extra]


def step_path(x, y, times, values, backwards=False):
    """A stack edge as SVG path steps (a value holds until the next time)."""
    pts = []
    for k, ts in enumerate(times):
        if k:
            pts.append((x(ts), y(values[k - 1])))
        pts.append((x(ts), y(values[k])))
    if backwards:
        pts.reverse()
    return " ".join(f"{'M' if not k and not backwards else 'L'}{a:.1f},{b:.1f}" for k, (a, b) in enumerate(pts))


def svg(step, t0, t1, pools, order, budget, intervals, lanes, host, device):
    span = max(t1 - t0, 1.0)
    times, layers = stack(pools, order)
    used = max(layers[-1][2]) if layers else 0
    top = max(used, budget or 0, 1) * 1.05
    x = lambda ts: LEFT + (ts - t0) / span * (WIDTH - LEFT - 20)
    y = lambda v: TOP + PLOT_H - v / top * PLOT_H
    lanes_top = TOP + PLOT_H + 40
    legend_top = lanes_top + LANE_H * len(lanes) + 40
    height = legend_top + 16 * (len(pools) + len(host) + 1)
    what = "GPU bytes in use, pools stacked" if device == "cuda" else "bytes in use, pools stacked"
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" '
         f'font-size="11">',
         f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
         f'<text x="{LEFT}" y="20" font-size="14">umtrain memory, step {step}: {what} ({span / 1e3:.1f} ms)</text>']
    for k in range(5):  # y axis in GiB
        v = top * k / 4
        s.append(f'<line x1="{LEFT}" x2="{WIDTH - 20}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        s.append(f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v / 2**30:.2f} GiB</text>')
    for k in range(6):  # x axis in ms
        ts = t0 + span * k / 5
        s.append(f'<text x="{x(ts):.1f}" y="{TOP + PLOT_H + 16}" text-anchor="middle">{(ts - t0) / 1e3:.0f} ms</text>')
    for i, (pool, lower, upper) in enumerate(layers):
        colour = COLOURS[i % len(COLOURS)]
        outline = step_path(x, y, times, upper) + " " + step_path(x, y, times, lower, backwards=True) + " Z"
        s.append(f'<path class="pool" d="{outline}" fill="{colour}" fill-opacity="0.8" stroke="{colour}">'
                 f'<title>{pool}</title></path>')
        s.append(f'<rect x="{LEFT}" y="{legend_top + 16 * i - 9}" width="12" height="10" fill="{colour}"/>')
        peak = max(v for _, v in pools[pool])
        s.append(f'<text x="{LEFT + 18}" y="{legend_top + 16 * i}">{pool}: {peak / 2**30:.3f} GiB at most</text>')
    if budget:
        s.append(f'<line class="budget" x1="{LEFT}" x2="{WIDTH - 20}" y1="{y(budget):.1f}" y2="{y(budget):.1f}" '
                 f'stroke="#d62728" stroke-width="1.5" stroke-dasharray="6,4"/>')
        s.append(f'<text x="{WIDTH - 22}" y="{y(budget) - 4:.1f}" text-anchor="end" fill="#d62728">'
                 f'device budget {budget / 2**30:.2f} GiB</text>')
    ly = legend_top + 16 * len(pools)
    s.append(f'<text x="{LEFT + 18}" y="{ly}">all pools together: {used / 2**30:.3f} GiB at most</text>')
    for j, (pool, peak) in enumerate(sorted(host.items())):
        s.append(f'<text x="{LEFT + 18}" y="{ly + 16 * (j + 1)}">{pool} (pinned host memory, not drawn): '
                 f'{peak / 2**30:.3f} GiB at most</text>')
    for k, (cat, label) in enumerate(lanes):
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
                     f'fill="{COLOURS[k % len(COLOURS)]}"><title>{title}</title></rect>')
    s.append("</svg>")
    return "\n".join(s), used


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--step", type=int, default=None)
    ap.add_argument("-o", "--output", default="memory.svg")
    ap.add_argument("--min-coverage", type=float, default=None, metavar="F",
                    help="exit 1 when the lanes cover less than this fraction of the step (0 to 1)")
    a = ap.parse_args()
    with open(a.trace) as f:
        trace = json.load(f)
    events, other = trace["traceEvents"], trace.get("otherData", {})
    step, t0, t1 = step_window(events, a.step)
    pools = series(events, t0, t1)
    stacked = other.get("stacked_pools")
    if stacked is None:  # an older trace: every pool but the pinned host ones
        stacked = [p for p in pools if p not in HOST_POOLS]
    host = {p: max(v for _, v in pts) for p, pts in pools.items() if p not in stacked}
    pools = {p: pts for p, pts in pools.items() if p in stacked}
    order = [p for p in stacked if p in pools]
    intervals = [e for e in events if e.get("ph") == "X"]
    lanes = lanes_of(intervals)
    picture, used = svg(step, t0, t1, pools, order, other.get("budget_bytes"), intervals, lanes, host,
                        other.get("device", "cuda"))
    with open(a.output, "w") as f:
        f.write(picture)
    # The host waiting for the device is drawn, but explains nothing: it does not count as covered.
    fraction, (gap_at, gap) = coverage([e for e in intervals if e.get("cat") not in WAITS], t0, t1)
    inside = [e for e in intervals if e["ts"] < t1 and e["ts"] + e["dur"] > t0]
    print(f"step {step}: {(t1 - t0) / 1e3:.1f} ms, lanes cover {100 * fraction:.1f}%")
    busy = [f"{label} {coverage([e for e in inside if e.get('cat') == cat], t0, t1)[0] * (t1 - t0) / 1e3:.1f}"
            for cat, label in lanes]
    # The host's bars (CPU updates) and the device's share an axis to within this (memory/trace.h).
    aligned = other.get("clock_alignment_us")
    clocks = f"; host and device clocks aligned within {aligned:.0f} us" if aligned is not None else ""
    print(f"step {step}: busy ms per lane: {', '.join(busy)}; longest blank {gap / 1e3:.1f} ms at "
          f"{(gap_at - t0) / 1e3:.1f} ms{clocks}")
    budget = other.get("budget_bytes")
    of_budget = f" of a {budget / 2**30:.3f} GiB budget" if budget else ""
    print(f"mem_trace_svg: step {step}, {(t1 - t0) / 1e3:.1f} ms, lanes cover {100 * fraction:.1f}%, "
          f"{len(pools)} pools stacked ({used / 2**30:.3f} GiB at most{of_budget}), {len(inside)} intervals "
          f"-> {a.output}")
    if a.min_coverage is not None and fraction < a.min_coverage:
        print(f"mem_trace_svg: step {step}: the lanes cover {100 * fraction:.1f}% of the step, under --min-coverage "
              f"{100 * a.min_coverage:.1f}%", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
