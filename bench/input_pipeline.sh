#!/usr/bin/env bash
# bench/input_pipeline.sh — what the input path costs: the MNIST CNN trained with its data
# resident on the GPU, on the host through the pinned prefetching loader, and on the host
# through the naive pageable-sync path, side by side. Epoch 1 warms up (cuDNN algorithm search,
# first touches); the table shows the last epoch.
#
#   bench/input_pipeline.sh [MNIST_CNN_BINARY] [DATA_DIR] [BATCH] [EPOCHS] [WORKERS]
#   bench/input_pipeline.sh bazel-bin/examples/mnist_cnn data/mnist 512 2 1
set -uo pipefail
bin="${1:-bazel-bin/examples/mnist_cnn}"
data="${2:-data/mnist}"
batch="${3:-512}"
epochs="${4:-2}"
workers="${5:-1}"
log="${INPUT_BENCH_LOG:-/dev/null}"

# mode name, then the flags of that mode
run_mode() {
    local name="$1"
    shift
    local out
    out="$("$bin" --data-dir "$data" --batch-size "$batch" --epochs "$epochs" --log-every 100000 "$@" 2>&1)"
    echo "== $name: $bin $*" >> "$log"
    echo "$out" >> "$log"
    local seconds wait accuracy
    seconds="$(echo "$out" | awk -v e="$epochs" '$1 == "epoch" && $2 == e && $3 == "trained" {print $5}')"
    wait="$(echo "$out" | awk -v e="$epochs" '$1 == "epoch" && $2 == e && $4 == "wait" {gsub(/[(%]/, "", $10); print $5 " ms (" $10 "%)"}')"
    accuracy="$(echo "$out" | awk -v e="$epochs" '$1 == "epoch" && $2 == e && $4 == "accuracy" {print $5}')"
    printf "%-26s %10s %26s %10s\n" "$name" "${seconds:-FAILED}" "${wait:--}" "${accuracy:--}"
}

printf "input pipeline, MNIST CNN, batch %s, %s loader thread(s), epoch %s of %s\n" "$batch" "$workers" "$epochs" "$epochs"
printf "%-26s %10s %26s %10s\n" "data path" "epoch s" "compute wait for data" "test acc"
run_mode "gpu-resident" --data-on gpu
run_mode "host, pinned + async" --data-on host --loader pinned --prefetch 4 --workers "$workers"
run_mode "host, pageable-sync" --data-on host --loader pageable-sync
