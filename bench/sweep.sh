#!/usr/bin/env bash
# bench/sweep.sh — N trainings of the MNIST CNN in one process on one GPU (examples/sweep.c), bf16,
# batch 64: total images/s of N at once against 1 alone (measured in the same run), then the 5-epoch
# accuracy of each seed trained with the others against the same seed trained alone, and the
# dataset's bytes with UMT_MEM_REPORT=1 (held once, by the data context; the N contexts share it).
# From the GPU bundle's root (bash bench/sweep.sh), or from the repository with
#     BIN=bazel-bin/examples DATA=data/mnist bash bench/sweep.sh
# N (8), STEPS (3000: the bench's timed steps each) and EPOCHS (5) may be set; ONE_GRAPH=on runs
# the N trainings as one step group (one CUDA graph for all, from one thread) instead of a thread
# and a graph each. The accuracy runs set
# UMT_CONV_TIMING=0, so that cuDNN's engine choice does not depend on timings taken beside the
# others: each seed's bits are then the same at once and alone (the parameters' hash says so).
set -uo pipefail
bin="${BIN:-bin}"
data="${DATA:-data}"
n="${N:-8}"
steps="${STEPS:-3000}"
epochs="${EPOCHS:-5}"
logs="${OUT:-/tmp/umt_gpu_logs}/sweep"
mkdir -p "$logs"
common=(--device cuda --precision bf16 --batch-size 64 --data-dir "$data" --one-graph "${ONE_GRAPH:-off}")

echo "== throughput: $n at once against 1 alone, $steps steps each"
"$bin/sweep" "${common[@]}" --sweep "$n" --bench "$steps" | tee "$logs/bench.txt"

echo "== $epochs-epoch accuracy: seeds 1..$n at once, then each alone"
UMT_CONV_TIMING=0 UMT_MEM_REPORT=1 "$bin/sweep" "${common[@]}" --sweep "$n" --epochs "$epochs" \
    > "$logs/together.txt" 2>&1 || { tail -n 20 "$logs/together.txt"; exit 1; }
printf '%-6s %12s %12s %s\n' seed "at once" alone "same parameters"
for seed in $(seq 1 "$n"); do
    UMT_CONV_TIMING=0 "$bin/sweep" "${common[@]}" --sweep-seeds "$seed" --epochs "$epochs" \
        > "$logs/alone_$seed.txt" 2>&1
    row_together=$(grep "^seed $seed lr " "$logs/together.txt")
    row_alone=$(grep "^seed $seed lr " "$logs/alone_$seed.txt")
    same=no
    [[ -n $row_alone && ${row_together##* } == "${row_alone##* }" ]] && same=yes
    printf '%-6s %12s %12s %s\n' "$seed" "$(awk '{print $8}' <<< "$row_together")" \
        "$(awk '{print $8}' <<< "$row_alone")" "$same"
done
grep "trainings at once" "$logs/together.txt"

echo "== the dataset in the memory reports ($n contexts and the data context)"
held=$(awk '$1 == "dataset" && $2 != "shared" && $3 ~ /^[0-9]+$/ && $3 > 0' "$logs/together.txt")
echo "dataset pools holding bytes: $(grep -c . <<< "$held") (expected 1: the data context's)"
echo "$held"
echo "contexts reading it through a share: $(grep -c '^dataset      shared' "$logs/together.txt") (expected $n)"
