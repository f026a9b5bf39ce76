#!/usr/bin/env python3
"""tools/trace_phases.py — where a step's time goes, from a UMT_MEM_TRACE file.

    python3 tools/trace_phases.py trace.json

For each whole step of the trace: its length, and per track (copy in, copy out, compute,
update) the number of timed intervals and their busy time (overlaps merged); then the two
phases of an offloaded step: forward + backward (up to the first optimizer interval) with the
link's busy time inside it, and the update phase after it. A phase whose link busy time is
close to its length is link-bound; one far below it waits on compute.
"""
import json
import sys


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


def main(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    marks = sorted(e["ts"] for e in events if e.get("cat") == "step")
    timed = [e for e in events if e.get("ph") == "X"]
    for i in range(len(marks) - 1):
        start, end = marks[i], marks[i + 1]
        tracks = {}
        for e in timed:
            if start <= e["ts"] < end:
                tracks.setdefault((e["tid"], e["cat"]), []).append((e["ts"], e["ts"] + e["dur"]))
        updates = [x for (tid, cat), v in tracks.items() if cat == "optimizer" for x in v]
        update_start = min(x[0] for x in updates) if updates else end
        link = [x for (tid, cat), v in tracks.items() if cat in ("prefetch", "offload") for x in v if x[1] <= update_start]
        parts = [f"{cat} n={len(v)} busy {busy(v) / 1e3:.1f} ms" for (tid, cat), v in sorted(tracks.items())]
        print(f"step {i}: {(end - start) / 1e3:.1f} ms; " + "; ".join(parts) +
              f"; forward+backward {(update_start - start) / 1e3:.1f} ms (link busy {busy(link) / 1e3:.1f} ms)"
              f"; update phase {(end - update_start) / 1e3:.1f} ms")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
