#!/usr/bin/env python3
"""bench/kernel_timeline.py — what a training step waits for, from the GPU's own timeline.

    python3 bench/kernel_timeline.py TIMELINE.csv [--steps N] [--marker KERNEL] [--whole]

Reads the CSV that bench/kernel_timeline.c writes (every kernel, memset and copy with its real
start and end) and prints, per step, where the time goes:
  - the step's length (marker to marker: by default the batch gather that starts every step);
  - the GPU idle (nothing running: launch latency, waits on the host, dependencies);
  - for each kernel: its calls a step, its own time, and its time *alone*, when it is the only
    thing running. Alone time is what the step would lose if the kernel took no time at all, up
    to overlap: a kernel beside another (a weight gradient on the side stream) costs the step
    little, and the alone column says so where Nsight Compute's one-kernel-at-a-time cannot.
--whole skips the steps and reports the whole run's last part instead (for runs with no single
marker, such as a sweep of several trainings), with how often 0, 1, 2, ... things ran at once.
"""
import argparse
import collections
import csv
import shutil
import subprocess
import sys


def demangle(names):
    """C++ and CUDA kernels' names as a reader writes them, without their parameter lists."""
    names = list(names)
    plain = names
    if shutil.which("c++filt"):
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
        plain = out.split("\n")[: len(names)]
    short = {}
    for mangled, readable in zip(names, plain):
        base = readable.split("(")[0]
        # "void foo<...>" -> "foo<...>"; keep the template arguments: they tell kernels apart.
        if base.startswith("void "):
            base = base[5:]
        short[mangled] = base[:100]
    return short


def read(path):
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            rows.append((int(r["start_ns"]), int(r["end_ns"]), r["name"], int(r["stream"]), r["kind"]))
    if not rows:
        sys.exit(f"kernel_timeline: {path} holds no records (was the library loaded? is CUPTI there?)")
    names = demangle({r[2] for r in rows})
    rows = [(s, e, names[n], st, k) for s, e, n, st, k in rows]
    rows.sort()
    return rows


def sweep(rows, lo, hi):
    """Walks [lo, hi): per name its own and alone time, per stream its busy time, and the time
    with k things running at once (k = 0 is the GPU idle)."""
    events = []
    for i, (s, e, _, _, _) in enumerate(rows):
        s, e = max(s, lo), min(e, hi)
        if s < e:
            events.append((s, 1, i))
            events.append((e, -1, i))
    events.sort(key=lambda ev: (ev[0], ev[1]))  # ends before starts at the same instant
    own, alone, calls = collections.Counter(), collections.Counter(), collections.Counter()
    by_stream, at_once = collections.Counter(), collections.Counter()
    running, streams_running = set(), collections.Counter()
    t = lo
    for when, step, i in events:
        span = when - t
        if span > 0:
            at_once[len(running)] += span
            for j in running:
                own[rows[j][2]] += span
            if len(running) == 1:
                alone[rows[next(iter(running))][2]] += span
            for st, n in streams_running.items():
                if n:
                    by_stream[st] += span
        t = when
        if step > 0:
            running.add(i)
            streams_running[rows[i][3]] += 1
            if rows[i][0] >= lo:
                calls[rows[i][2]] += 1
        else:
            running.discard(i)
            streams_running[rows[i][3]] -= 1
    if hi > t:
        at_once[0] += hi - t
    return own, alone, calls, by_stream, at_once


def report(rows, lo, hi, count, what):
    own, alone, calls, by_stream, at_once = sweep(rows, lo, hi)
    total = hi - lo
    per = lambda ns: ns / count / 1e3  # ns over the window -> us per step
    print(f"{what}: {per(total):.1f} us each; GPU idle {per(at_once[0]):.1f} us "
          f"({100 * at_once[0] / total:.1f}%), one thing running {per(at_once[1]):.1f} us, "
          f"two or more {per(total - at_once[0] - at_once[1]):.1f} us")
    print("at once: " + ", ".join(f"{k}: {100 * v / total:.1f}%" for k, v in sorted(at_once.items())))
    print("streams (busy us each): " + ", ".join(f"{st}: {per(v):.1f}" for st, v in sorted(by_stream.items())))
    print(f"{'name':<72} {'calls':>6} {'own us':>8} {'alone us':>9}")
    for name, _ in sorted(own.items(), key=lambda kv: (-alone[kv[0]], -kv[1])):
        print(f"{name[:72]:<72} {calls[name] / count:>6.2f} {per(own[name]):>8.2f} {per(alone[name]):>9.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("csv")
    p.add_argument("--steps", type=int, default=100, help="the last N whole steps (default 100)")
    p.add_argument("--marker", help="the kernel that starts each step (default: the batch gather, "
                   "gather_vectors_kernel or gather_batch_kernel, or gather_batch_half_kernel and "
                   "gather_images_kernel in older builds)")
    p.add_argument("--whole", action="store_true", help="no steps: the last --fraction of the run")
    p.add_argument("--fraction", type=float, default=0.5)
    a = p.parse_args()
    rows = read(a.csv)
    if a.whole:
        lo, hi = rows[0][0], max(e for _, e, _, _, _ in rows)
        lo = int(hi - (hi - lo) * a.fraction)
        report(rows, lo, hi, 1, f"the last {100 * a.fraction:.0f}% of the run ({(hi - lo) / 1e6:.1f} ms)")
        return
    markers = [a.marker] if a.marker else ["gather_vectors_kernel", "gather_batch_kernel", "gather_batch_half_kernel",
                                           "gather_images_kernel"]
    for marker in markers:
        starts = [s for s, _, n, _, _ in rows if n.startswith(marker)]
        if starts:
            break
    if len(starts) < 3:
        sys.exit(f"kernel_timeline: {len(starts)} steps start with {marker}; need 3 (--marker, --whole)")
    # The last marker starts a step that may be cut short (the run's end), so it only closes one.
    use = starts[-(a.steps + 1):] if len(starts) > a.steps + 1 else starts[1:]
    report(rows, use[0], use[-1], len(use) - 1, f"{len(use) - 1} steps")


if __name__ == "__main__":
    main()
