#!/usr/bin/env bash
# bench/kernel_timeline.sh — runs one command with the GPU's timeline recorded (bench/kernel_timeline.c,
# loaded through CUDA_INJECTION64_PATH), then prints where a step's time goes (bench/kernel_timeline.py).
#
#     bash gpu_bundle/bench/kernel_timeline.sh OUT.csv [REPORT OPTIONS --] COMMAND [ARGS...]
#
# e.g. bash gpu_bundle/bench/kernel_timeline.sh t.csv bin/mnist_cnn --device cuda --data-dir data \
#          --precision bf16 --batch-size 64 --bench 300
#      bash gpu_bundle/bench/kernel_timeline.sh t.csv --whole -- bin/sweep --sweep 8 ...
# Run from the bundle's root (the library is lib/libumt_timeline.so, with libcupti beside it when
# the machine's CUDA lacks it). Caveat: CUPTI adds about a microsecond of host work to each
# launch, so launch-bound steps read a little longer than they run without it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
[[ $# -ge 2 ]] || { sed -n '2,12p' "$0"; exit 2; }
out="$1"; shift
report=()
if [[ " $* " == *" -- "* ]]; then
    while [[ $1 != -- ]]; do report+=("$1"); shift; done
    shift
fi
lib="$root/lib/libumt_timeline.so"
[[ -e $lib ]] || { echo "kernel_timeline: $lib is missing (tools/gpu_bundle.sh builds it)" >&2; exit 1; }
export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
CUDA_INJECTION64_PATH="$lib" UMT_TIMELINE="$out" "$@"
python3 "$here/kernel_timeline.py" "$out" "${report[@]}"
