#!/usr/bin/env python3
"""tools/plot_metrics.py — draws a trainer's --metrics file (JSON Lines, examples/example_metrics.h)
as one SVG: the training loss, the test accuracy and the throughput (images/s), three panels over
one axis of optimizer steps.

    python3 tools/plot_metrics.py metrics.jsonl [-o curves.svg] [--title TEXT]

A resumed run appends to the file after a "start" line that names the step it resumed from: the
resume is drawn as a dashed line across the panels, and what the earlier run wrote past that step
(work after its last checkpoint, trained again by the resumed run) is left out. A line without a
field is drawn in the panels whose fields it has; a loss that was not finite (written as null) is a
gap in the curve, counted in the summary. A line that is not a JSON object stops the tool with its
line number. Prints one summary line. Only the standard library.
"""
import argparse
import json
import math
import sys

WIDTH, PANEL_H, GAP, LEFT, RIGHT, TOP = 960, 190, 50, 80, 30, 50
COLOURS = {"loss": "#1f77b4", "accuracy": "#2ca02c", "speed": "#ff7f0e", "resume": "#7f7f7f"}


def fail(message):
    sys.exit(f"plot_metrics: {message}")


def number(row, key):
    """row[key] as a float when it is a finite number (not a bool), else None."""
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def read(path):
    """The file's runs, in order: each a start line (a dict, {} when the file has none first) and
    the rows after it. A line that is not a JSON object stops the tool, naming it."""
    runs = [({}, [])]
    try:
        lines = open(path, "rb").read().split(b"\n")
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            fail(f"{path}:{n}: not UTF-8 text")
        except json.JSONDecodeError as e:
            fail(f"{path}:{n}: not a JSON line ({e.msg} at column {e.colno})")
        if not isinstance(row, dict):
            fail(f"{path}:{n}: a JSON {type(row).__name__}, expected an object")
        if row.get("event") == "start":
            runs.append((row, []))
        else:
            runs[-1][1].append(row)
    return [(start, rows) for start, rows in runs if start or rows]


def merge(runs):
    """One list of rows over the steps, and the steps where a run resumed. A run after the first
    starts after its checkpoint's step (its start line's, else just before its first row's): what
    the runs before it wrote past that step is dropped."""
    rows, resumes = [], []
    for k, (start, own) in enumerate(runs):
        steps = [s for s in (number(r, "step") for r in own) if s is not None]
        since = number(start, "step")
        if since is None:
            since = min(steps) - 0.5 if steps else None
        if k and since is not None:
            rows = [r for r in rows if number(r, "step") is None or number(r, "step") <= since]
            resumes.append(since)
        rows += own
    return rows, resumes


def nice_ticks(low, high, count=5):
    """Round tick values from at or below low to at or above high (a step of 1, 2 or 5 times a
    power of ten)."""
    if high <= low:
        high = low + 1
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first, last = math.floor(low / step + 1e-9), math.ceil(high / step - 1e-9)
    return [k * step for k in range(first, last + 1)]


def label(v):
    """A tick's number: 20,000 rather than 2e+04; 0.001 as it is."""
    if v == 0:
        return "0"
    if abs(v) >= 1e4:
        return f"{v:,.0f}"
    return f"{v:.3g}" if abs(v) < 1e-2 else f"{v:.4g}"


class Panel:
    """One panel: a y range (linear, or log10 when the values span more than 50x) at a height."""

    def __init__(self, top, values, floor_zero, log_ok=False):
        self.top = top
        low, high = (min(values), max(values)) if values else (0.0, 1.0)
        self.log = log_ok and low > 0 and high / low >= 50
        if self.log:
            self.low, self.high = math.floor(math.log10(low)), math.ceil(math.log10(high))
            self.ticks = [10.0 ** e for e in range(int(self.low), int(self.high) + 1)]
            return
        if floor_zero:
            low = min(low, 0.0)
        pad = (high - low) * 0.05 or abs(high) * 0.05 or 1.0
        self.ticks = nice_ticks(low if floor_zero else low - pad, high + pad)
        self.low, self.high = self.ticks[0], self.ticks[-1]

    def y(self, v):
        t = (math.log10(v) if self.log else v) - self.low
        return self.top + PANEL_H - t / ((self.high - self.low) or 1) * PANEL_H


def polyline(points, x, panel, colour, width=1.5):
    """Paths through points (step, value or None): a None breaks the line; a lone point between
    two breaks is a dot."""
    out, run = [], []
    for step, v in points + [(None, None)]:
        if v is not None:
            run.append((x(step), panel.y(v)))
            continue
        if len(run) > 1:
            d = " ".join(f"{'M' if not k else 'L'}{a:.1f},{b:.1f}" for k, (a, b) in enumerate(run))
            out.append(f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="{width}"/>')
        elif run:
            out.append(f'<circle cx="{run[0][0]:.1f}" cy="{run[0][1]:.1f}" r="2" fill="{colour}"/>')
        run = []
    return out


def svg(title, rows, resumes):
    train = [r for r in rows if r.get("event") == "train" and number(r, "step") is not None]
    evals = [r for r in rows if r.get("event") == "eval" and number(r, "step") is not None]
    loss = [(number(r, "step"), number(r, "loss")) for r in train if "loss" in r]
    accuracy = [(number(r, "step"), number(r, "test_accuracy")) for r in evals
                if number(r, "test_accuracy") is not None]
    speed = [(number(r, "step"), number(r, "images_per_s")) for r in train if number(r, "images_per_s") is not None]
    steps = [s for s, _ in loss + accuracy + speed] + resumes
    x_max = max(steps) if steps else 1
    x_ticks = nice_ticks(0, x_max)
    x_end = max(x_ticks[-1], x_max)
    x = lambda s: LEFT + s / (x_end or 1) * (WIDTH - LEFT - RIGHT)
    height = TOP + 3 * (PANEL_H + GAP) + 10
    panels = [("training loss (mean over each progress line's steps)", "loss", loss, False, True),
              ("test accuracy (%)", "accuracy", accuracy, False, False),
              ("throughput (images/s)", "speed", speed, True, False)]
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" '
         f'font-size="11">',
         f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
         f'<text x="{LEFT}" y="22" font-size="14">{escape(title)}</text>']
    for k, (name, key, points, floor_zero, log_ok) in enumerate(panels):
        top = TOP + k * (PANEL_H + GAP)
        panel = Panel(top, [v for _, v in points if v is not None], floor_zero, log_ok)
        scale = ", log scale" if panel.log else ""
        s.append(f'<text x="{LEFT}" y="{top - 8}" font-size="12">{escape(name)}{scale}</text>')
        for v in panel.ticks:
            yy = panel.y(v)
            s.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#ddd"/>')
            s.append(f'<text x="{LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end">{label(v)}</text>')
        for t in x_ticks:
            s.append(f'<text x="{x(t):.1f}" y="{top + PANEL_H + 14}" text-anchor="middle">{label(t)}</text>')
        s.append(f'<rect x="{LEFT}" y="{top}" width="{WIDTH - LEFT - RIGHT}" height="{PANEL_H}" fill="none" '
                 f'stroke="#999"/>')
        for at in resumes:
            s.append(f'<line class="resume" x1="{x(at):.1f}" x2="{x(at):.1f}" y1="{top}" y2="{top + PANEL_H}" '
                     f'stroke="{COLOURS["resume"]}" stroke-dasharray="5,4"/>')
            if k == 0:
                s.append(f'<text x="{x(at) + 4:.1f}" y="{top + 12}" fill="{COLOURS["resume"]}">resumed</text>')
        if not points:
            s.append(f'<text x="{WIDTH / 2}" y="{top + PANEL_H / 2}" text-anchor="middle" fill="#999">no values</text>')
            continue
        s += polyline(points, x, panel, COLOURS[key])
        if key == "accuracy":
            for step, v in points:
                s.append(f'<circle cx="{x(step):.1f}" cy="{panel.y(v):.1f}" r="3" fill="{COLOURS[key]}">'
                         f'<title>step {step:.0f}: {v:.2f}%</title></circle>')
    s.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{height - 8}" text-anchor="middle">optimizer steps</text>')
    s.append("</svg>")
    return "\n".join(s), loss, accuracy, speed


def escape(text):
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("metrics")
    ap.add_argument("-o", "--output", default="curves.svg")
    ap.add_argument("--title", default=None)
    a = ap.parse_args()
    runs = read(a.metrics)
    rows, resumes = merge(runs)
    if not any(r.get("event") in ("train", "eval") and number(r, "step") is not None for r in rows):
        fail(f"{a.metrics}: no train or eval line with a step: nothing to draw")
    program = next((start.get("program") for start, _ in runs if start.get("program")), "a run")
    title = a.title or f"umtrain {program}: {a.metrics}"
    picture, loss, accuracy, speed = svg(title, rows, resumes)
    with open(a.output, "w") as f:
        f.write(picture)
    finite = [v for _, v in loss if v is not None]
    parts = [f"{len(loss)} training lines", f"{len(accuracy)} evaluations",
             f"{len(resumes)} resume{'s' if len(resumes) != 1 else ''}"]
    if len(finite) < len(loss):
        parts.append(f"{len(loss) - len(finite)} losses not finite")
    if finite:
        parts.append(f"loss {finite[0]:.4g} to {finite[-1]:.4g}")
    if accuracy:
        parts.append(f"test accuracy {accuracy[-1][1]:.2f}% at the end (best {max(v for _, v in accuracy):.2f}%)")
    if speed:
        parts.append(f"median {sorted(v for _, v in speed)[len(speed) // 2]:.0f} images/s")
    print(f"plot_metrics: {', '.join(parts)} -> {a.output}")


if __name__ == "__main__":
    main()
