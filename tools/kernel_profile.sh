#!/usr/bin/env bash
# tools/kernel_profile.sh — where one training step's GPU time goes, kernel by kernel.
#
#     bash gpu_bundle/kernel_profile.sh [BATCH] [PRECISION]      (on the GPU machine, from the bundle)
#
# Runs `mnist_cnn --bench 5 --graph off` under Nsight Compute, reading only each kernel's duration
# (gpu__time_duration, one pass per kernel, clocks left as they are), and prints the kernels of a
# step, longest first, each as its mean time per step over the 24 steps after the first (20 warm-up
# and 5 timed steps in all). The first step is left out: it holds the one-off set-up, and the runs
# that time cuDNN's candidate engines (kernels/cuda/conv_engines.cu). Steps are told apart by the
# batch gather that starts each one.
# The graph is off so that every kernel is a launch of its own; the kernels are the same.
# Caveat: conv_engines.cu times cuDNN's candidate engines on the first step, and under Nsight
# Compute each kernel runs alone with the profiler's overhead, so the engines kept here can be
# other (slower) ones than a plain run keeps: read the cuDNN rows as an upper bound, and take
# their plain-run time as the step's time less the other kernels'.
set -euo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
batch="${1:-4096}" precision="${2:-bf16}"
steps=25
first_kernel=gather_batch_kernel
csv=$(mktemp)
ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    bin/mnist_cnn --device cuda --data-dir data --precision "$precision" --bench $((steps - 20)) \
    --batch-size "$batch" --graph off >"$csv"
python3 - "$csv" "$first_kernel" "$batch" "$precision" <<'PY'
import csv, sys, collections
path, first_kernel, batch, precision = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = [l for l in open(path) if l.startswith('"')]
total, count = collections.Counter(), collections.Counter()
starts = 0  # steps begun so far (rows come in launch order)
for r in csv.DictReader(rows):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = r["Kernel Name"].split("(")[0][:90]
    starts += name == first_kernel
    if starts < 2:
        continue
    total[name] += float(r["Metric Value"].replace(",", "")) / 1e3  # ns -> us
    count[name] += 1
steps = starts - 1
if steps < 1:
    sys.exit(f"kernel_profile: no {first_kernel} after the first step's; is it still the step's first kernel?")
step = sum(total.values()) / steps
print(f"batch {batch}, {precision}: {step:.1f} us of kernels per step ({steps} steps averaged)")
print(f"{'us/step':>9} {'share':>6} {'calls/step':>10}  kernel")
for name, us in total.most_common():
    print(f"{us / steps:9.1f} {100 * us / steps / step:5.1f}% {count[name] / steps:10.2f}  {name}")
PY
rm -f "$csv"
