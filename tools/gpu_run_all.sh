#!/usr/bin/env bash
# gpu_bundle/run_all.sh (copied from tools/gpu_run_all.sh) — on the GPU machine: every GPU test,
# the MLP trainer on CUDA in each memory mode, a clean budget refusal, and the benchmarks
# (`bash run_all.sh --skip-offload` leaves out the offload tier's few minutes).
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
    # The number after "images/s" (the elapsed time and ETA follow it on the line).
    speed=$(sed -n 's/.* images\/s \([0-9]*\).*/\1/p' "$log" | tail -n 1)
    row "mnist_mlp --mem $mode ($epochs ep)" "accuracy ${acc:-none}, ${speed:-?} images/s (exit $rc)"
done
grep -A12 '^pool' "$logs/mnist_mlp_managed.log"

# The MNIST CNN: 5 epochs with the example's recipe in each precision (accuracy after each
# epoch, and fp16's skipped steps).
for precision in fp32 bf16 fp16; do
    log="$logs/mnist_cnn_$precision.log"
    UMT_MEM_REPORT=1 bin/mnist_cnn --device cuda --data-dir data --epochs 5 --precision "$precision" \
        --save "/tmp/umt_cnn_$precision.ckpt" > "$log" 2>&1
    rc=$?
    accs=$(grep 'test accuracy' "$log" | awk '{print $NF}' | tr '\n' ' ')
    skipped=$(grep 'steps skipped' "$log" | tail -n 1 | sed 's/.*scale \([^,]*\), \([0-9]*\) steps.*/, scale \1, \2 skipped/')
    row "mnist_cnn 5 epochs $precision" "${accs:-none}(exit $rc)$skipped"
    [[ $rc -ne 0 ]] && tail -n 5 "$log"
done
# The minimal trainer (examples/mnist_cnn_minimal.c, eager f32) reads the uncompressed files.
mkdir -p /tmp/umt_mnist
for f in data/*.gz; do gunzip -c "$f" > "/tmp/umt_mnist/$(basename "$f" .gz)"; done
log="$logs/mnist_cnn_minimal.log"
bin/mnist_cnn_minimal --data-dir /tmp/umt_mnist --epochs 2 > "$log" 2>&1
rc=$?
row "mnist_cnn_minimal 2 epochs" "$(grep 'test accuracy' "$log" | awk '{print $NF}' | tr '\n' ' ')(exit $rc)"

# Data parallelism's path on one GPU (--dist on: the gradient hook, the buckets, a one-rank
# all-reduce) must leave training as it was: after an epoch, the same checkpoint bytes.
for precision in fp32 bf16; do
    for dist in auto on; do
        bin/mnist_cnn --device cuda --data-dir data --epochs 1 --precision "$precision" --graph off --dist "$dist" \
            --save "/tmp/umt_dist_$dist.ckpt" > "$logs/mnist_cnn_dist_${dist}_$precision.log" 2>&1
    done
    same="checkpoints DIFFER"
    cmp -s /tmp/umt_dist_auto.ckpt /tmp/umt_dist_on.ckpt && same="checkpoints equal"
    row "mnist_cnn 1 epoch $precision: --dist on vs auto" "$same ($(grep -c 'test accuracy' "$logs/mnist_cnn_dist_on_$precision.log") epoch)"
done

# Speed: umtrain against PyTorch (eager and torch.compile) with the floor, in fp32 and bf16
# (bench/speed.sh; the bf16 table is the one docs/PERF.md and the README show).
# torch.compile takes minutes per batch size: it runs for bf16 only, fp32 against eager.
for precision in fp32 bf16; do
    modes=eager,default,reduce-overhead
    [[ $precision == fp32 ]] && modes=eager
    PRECISION=$precision MODES=$modes bash bench/speed.sh > "$logs/speed_$precision.txt" 2>&1
    while read -r line; do row "speed $precision ${line%%|*}" "${line#*|}"; done < <(grep '^| [0-9]' "$logs/speed_$precision.txt")
done
cat "$logs/speed_bf16.txt"
# The whole-step CUDA graph off and on, bf16 (bench/graph_speed.sh: images/s of two runs each).
bash bench/graph_speed.sh > "$logs/graph_speed.txt" 2>&1
while read -r line; do row "graph off / on bf16 ${line%%|*}" "${line#*|}"; done < <(grep '^| [0-9]' "$logs/graph_speed.txt")

# A sweep: 8 MNIST CNN trainings at once in one process against 1 alone, bf16 batch 64, and each
# seed's 5-epoch accuracy at once and alone (bench/sweep.sh).
bash bench/sweep.sh > "$logs/sweep.txt" 2>&1
bench_line=$(grep '^bench:' "$logs/sweep.txt" | tail -n 1)
row "sweep: 8 at once / 1 alone (bf16 b64)" "${bench_line#*: }"
row "sweep: seeds with the same bits at once" "$(grep -c ' yes$' "$logs/sweep.txt") of 8"

# A model that needs more than the budget must fail cleanly, naming pool, request and what is left.
log="$logs/budget_refusal.log"
UMT_DEVICE_BUDGET=64M bin/mnist_mlp --device cuda --data-dir data --epochs 1 > "$log" 2>&1
rc=$?
tail -n 3 "$log"
if [[ $rc -ne 0 ]] && grep -q 'device budget' "$log"; then row "UMT_DEVICE_BUDGET=64M mnist_mlp" "refused cleanly (exit $rc)"
else row "UMT_DEVICE_BUDGET=64M mnist_mlp" "NOT refused as expected (exit $rc)"; fi

bin/mlp_mem_modes 200 5 | tee "$logs/mlp_mem_modes.txt"

# The offload tier (bench/offload.sh: big_mlp at 4x a 2 GiB budget against GPU memory, the
# benchmark, the memory picture); a few minutes, left out with --skip-offload.
if [[ ${1:-} != --skip-offload ]]; then
    OFFLOAD_TESTS=0 bash offload.sh > "$logs/offload.txt" 2>&1
    # offload.sh's rows are a 52-character name, a space, the value.
    while read -r line; do
        name="${line:0:52}"
        row "offload: ${name%"${name##*[! ]}"}" "${line:53}"
    done < <(sed -n '/^== summary/,$p' "$logs/offload.txt" | tail -n +2)
fi

echo
echo "== summary ($(head -n 1 "$logs/gpu.txt")) =="
printf '%s\n' "${rows[@]}"
