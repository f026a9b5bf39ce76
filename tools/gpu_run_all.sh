#!/usr/bin/env bash
# gpu_bundle/run_all.sh (copied from tools/gpu_run_all.sh) — on the GPU machine: every GPU test,
# the MLP trainer on CUDA in each memory mode, a clean budget refusal, and the benchmarks.
# Logs go to $OUT (or /tmp/umt_gpu_logs); the summary table comes last.
set -uo pipefail
cd "$(dirname "$0")" || exit 1
export LD_LIBRARY_PATH="$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
logs="${OUT:-/tmp/umt_gpu_logs}"
mkdir -p "$logs"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader | tee "$logs/gpu.txt"

rows=()
row() { rows+=("$(printf '%-44s %s' "$1" "$2")"); }

# cmocka tests: "N passed, N failed" per binary from its closing lines.
for t in bin/test_*; do
    name=$(basename "$t")
    "$t" > "$logs/$name.log" 2>&1
    rc=$?
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$logs/$name.log" | tail -n 1)
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$logs/$name.log" | tail -n 1)
    [[ $rc -ne 0 ]] && tail -n 30 "$logs/$name.log"
    row "$name" "${p:-0} passed, ${f:-$([[ $rc -eq 0 ]] && echo 0 || echo 1)} failed (exit $rc)"
done

# The trainer on CUDA: 2 epochs in the default mode, 1 epoch in the other two.
for mode in managed managed-plain device; do
    epochs=1
    [[ $mode == managed ]] && epochs=2
    log="$logs/mnist_mlp_$mode.log"
    UMT_MEM_REPORT=1 bin/mnist_mlp --device cuda --mem "$mode" --data-dir data --epochs "$epochs" > "$log" 2>&1
    rc=$?
    acc=$(grep 'test accuracy' "$log" | tail -n 1 | awk '{print $NF}')
    speed=$(grep 'images/s' "$log" | tail -n 1 | awk '{print $NF}')
    row "mnist_mlp --mem $mode ($epochs ep)" "accuracy ${acc:-none}, ${speed:-?} images/s (exit $rc)"
done
grep -A12 '^pool' "$logs/mnist_mlp_managed.log"

# A model that needs more than the budget must fail cleanly, naming pool, request and what is left.
log="$logs/budget_refusal.log"
UMT_DEVICE_BUDGET=64M bin/mnist_mlp --device cuda --data-dir data --epochs 1 > "$log" 2>&1
rc=$?
tail -n 3 "$log"
if [[ $rc -ne 0 ]] && grep -q 'device budget' "$log"; then row "UMT_DEVICE_BUDGET=64M mnist_mlp" "refused cleanly (exit $rc)"
else row "UMT_DEVICE_BUDGET=64M mnist_mlp" "NOT refused as expected (exit $rc)"; fi

bin/mlp_mem_modes 200 5 | tee "$logs/mlp_mem_modes.txt"

echo
echo "== summary ($(head -n 1 "$logs/gpu.txt")) =="
printf '%s\n' "${rows[@]}"
