#!/usr/bin/env python3
"""tools/trace_phases.py — where a step's time goes, from a UMT_MEM_TRACE file.

    python3 tools/trace_phases.py trace.json
    python3 tools/trace_phases.py trace.json --step 4 --bins 10
    python3 tools/trace_phases.py trace.json --step 4 --timeline

For each whole step of the trace: its length, and per track (copy in, copy out, compute: backward's
ops and the update phase, update) the number of timed intervals and their busy time (overlaps
merged); then the two phases of an offloaded step: forward + backward (up to the first optimizer interval) with the
link's busy time inside it, and the update phase after it. A phase whose link busy time is
close to its length is link-bound; one far below it waits on compute.

With updates in backward the optimizer's intervals start inside backward and the two phases
blur; --bins MS then shows step N in slices of MS milliseconds: the busy fraction of the copies
to the device, of the copies to the host, of the update kernels, of the CPU updates and of
backward's kernels in each. A slice where a direction is idle is time the link could have used;
one where backward's kernels are idle is time the step waited. --timeline lists every timed interval of
step N by its start (ms from the step's start), with its length, track, name, bytes and rate.
"""
import argparse
import json


def busy(intervals):
    total, current = 0.0, None
    for a, b in sorted(intervals):
        if current is None or a > current[1]:
            if current:
                total += current[1] - current[0]
            current = [a, b]
        else:
            current[1] = max(current[1], b)
    return total + (current[1] - current[0] if current else 0.0)


def load(path):
    """The step marks (sorted) and the timed intervals of a trace, with the tracks' names."""
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    marks = sorted(e["ts"] for e in events if e.get("cat") == "step")
    timed = [e for e in events if e.get("ph") == "X"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
    return marks, timed, names


def step_events(marks, timed, step):
    if not 0 <= step < len(marks) - 1:
        raise SystemExit(f"trace_phases: step {step} is not a whole step of the trace (0 to {len(marks) - 2})")
    start, end = marks[step], marks[step + 1]
    return start, end, sorted((e for e in timed if start <= e["ts"] < end), key=lambda e: e["ts"])


def phases(marks, timed):
    for i in range(len(marks) - 1):
        start, end, events = step_events(marks, timed, i)
        tracks = {}
        for e in events:
            tracks.setdefault((e["tid"], e["cat"]), []).append((e["ts"], e["ts"] + e["dur"]))
        updates = [x for (tid, cat), v in tracks.items() if cat == "optimizer" for x in v]
        update_start = min(x[0] for x in updates) if updates else end
        link = [x for (tid, cat), v in tracks.items() if cat in ("prefetch", "offload") for x in v if x[1] <= update_start]
        parts = [f"{cat} n={len(v)} busy {busy(v) / 1e3:.1f} ms" for (tid, cat), v in sorted(tracks.items())]
        print(f"step {i}: {(end - start) / 1e3:.1f} ms; " + "; ".join(parts) +
              f"; forward+backward {(update_start - start) / 1e3:.1f} ms (link busy {busy(link) / 1e3:.1f} ms)"
              f"; update phase {(end - update_start) / 1e3:.1f} ms")


def bins(marks, timed, step, width_ms):
    start, end, events = step_events(marks, timed, step)
    kinds = {"prefetch": "to device", "offload": "to host", "optimizer": "update", "cpu update": "cpu",
             "backward": "backward"}
    width = width_ms * 1e3
    print(f"step {step}: {(end - start) / 1e3:.1f} ms; busy fraction per {width_ms:g} ms "
          "(copies to the device, copies to the host, update kernels, CPU updates, backward's kernels)")
    t = start
    while t < end:
        b = min(t + width, end)
        row = []
        for cat, label in kinds.items():
            clipped = [(max(e["ts"], t), min(e["ts"] + e["dur"], b)) for e in events
                       if e["cat"] == cat and e["ts"] < b and e["ts"] + e["dur"] > t]
            row.append(f"{label} {busy(clipped) / (b - t):4.2f}")
        print(f"  {(t - start) / 1e3:7.1f} - {(b - start) / 1e3:7.1f} ms  " + "  ".join(row))
        t = b


def timeline(marks, timed, names, step):
    start, end, events = step_events(marks, timed, step)
    print(f"step {step}: {(end - start) / 1e3:.1f} ms; start ms, length ms, track, name, MiB, GB/s")
    for e in events:
        size = e.get("args", {}).get("bytes", 0)
        rate = f"{size / e['dur'] / 1e3:6.1f}" if size and e["dur"] > 0 else "     -"
        print(f"{(e['ts'] - start) / 1e3:9.2f} {e['dur'] / 1e3:8.2f}  {names.get(e['tid'], e['tid']):<42} "
              f"{e['name']:<16} {size / 2**20:7.1f} {rate}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--step", type=int, help="the step --bins and --timeline show (0: the first whole one)")
    parser.add_argument("--bins", type=float, metavar="MS", help="busy fractions per slice of MS ms")
    parser.add_argument("--timeline", action="store_true", help="every timed interval of the step")
    args = parser.parse_args()
    marks, timed, names = load(args.trace)
    if args.bins is None and not args.timeline:
        phases(marks, timed)
    elif args.step is None or (args.bins is not None and args.bins <= 0):
        parser.error("--bins and --timeline need --step N (and --bins a positive width)")
    else:
        if args.bins is not None:
            bins(marks, timed, args.step, args.bins)
        if args.timeline:
            timeline(marks, timed, names, args.step)
