#!/usr/bin/env bash
# bench/speed.sh — umtrain against PyTorch on one GPU, in one run, with the floor.
#
#     bash gpu_bundle/bench/speed.sh            # on the GPU machine, from the bundle (builds nothing)
#     PRECISION=fp32 STEPS_SCALE=0.5 bash gpu_bundle/bench/speed.sh
#     PRECISION=fp32 TF32=1 bash gpu_bundle/bench/speed.sh    # mnist_cnn --tf32 against PyTorch's TF32 defaults
#
# For batch 64, 512 and 4096 (BATCHES) in bf16 (PRECISION): `mnist_cnn --bench` with data on the
# GPU, then bench/torch_ref.py in eager mode and under torch.compile (modes "default" and
# "reduce-overhead"), same network, dtype, batch and timing; torch_ref.py --floor measures the
# matrix rate and the copy bandwidth in the same run. bench/speed_table.py prints the table:
# images/s, our ratio to each PyTorch mode, and the floor (FLOPs and bytes per image over the
# measured rates) with our percentage of it. Logs go to $OUT (or /tmp/umt_speed).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=bench/common.sh
source "$here/common.sh"
logs="${OUT:-/tmp/umt_speed}"
mkdir -p "$logs"
precision="${PRECISION:-bf16}"
batches="${BATCHES:-64 512 4096}"
modes="${MODES:-eager,default,reduce-overhead}"
scale="${STEPS_SCALE:-1}"
ours_tf32=() torch_tf32=()
if [[ ${TF32:-0} == 1 ]]; then ours_tf32=(--tf32); torch_tf32=(--tf32-default); fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$logs/speed_gpu.txt"
: > "$logs/speed_ours.log"
for batch in $batches; do
    echo "== ours batch $batch" >> "$logs/speed_ours.log"
    timeout 120 "$bundle/bin/mnist_cnn" --device cuda --data-dir "$bundle/data" \
        --bench "$(steps_for "$batch" "$scale")" --batch-size "$batch" --precision "$precision" "${ours_tf32[@]}" \
        >> "$logs/speed_ours.log" 2>&1
done
batch_list=$(echo $batches | tr ' ' ',')
timeout 400 python3 "$bundle/torch_ref.py" --dtype "$precision" --batches "$batch_list" --modes "$modes" --floor "${torch_tf32[@]}" \
    --steps "$(steps_for 512 "$scale")" > "$logs/speed_torch.log" 2>&1
tail -n 3 "$logs/speed_torch.log"
python3 "$here/speed_table.py" --precision "$precision" --gpu "$(cat "$logs/speed_gpu.txt")" \
    "$logs/speed_ours.log" "$logs/speed_torch.log" | tee "$logs/speed_table.md"
