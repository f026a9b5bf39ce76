#!/usr/bin/env bash
# bench/dist_bench.sh — data-parallel speed: umtrain's mnist_cnn --bench against PyTorch DDP
# (bench/torch_ddp.py under torchrun), on 1 and N GPUs of this machine, in one run.
#
#     bash bench/dist_bench.sh BIN_DIR DATA_DIR TORCH_DIR [GPUS] [STEPS]
#
# Per-GPU batches 512 and 4096. umtrain runs in fp32 and bf16 (--precision); DDP in fp32 (TF32
# off) and bf16 autocast. Prints every measured line, then a table: images/s over all GPUs,
# scaling efficiency = N-GPU rate / (N x 1-GPU rate), and umtrain / DDP in the same dtype.
set -uo pipefail
bin=$1 data=$2 torch_dir=$3 gpus=${4:-2} steps=${5:-200}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
results=$(mktemp)
for dtype in fp32 bf16; do
    for b in 512 4096; do
        for n in 1 "$gpus"; do
            line=$(timeout 120 "$bin/mnist_cnn" --device cuda --data-dir "$data" --bench "$steps" --batch-size "$b" \
                --gpus "$n" --precision "$dtype" | grep '^bench:')
            echo "$dtype $line"
            echo "ours $dtype $n $b $(sed -n 's/.*: \([0-9]*\) images\/s.*/\1/p' <<< "$line")" >> "$results"
        done
    done
done
for dtype in fp32 bf16; do
    for n in 1 "$gpus"; do
        (cd "$torch_dir" && timeout 150 torchrun --standalone --nproc_per_node "$n" torch_ddp.py --steps "$steps" \
            --batches 512,4096 --dtype "$dtype" 2>&1) | grep '^torch ddp' | tee -a /dev/stderr |
            awk -v d="$dtype" '{print "ddp", d, $5, $7, $8}' | tr -d ':' >> "$results"
    done
done 2>&1
python3 - "$results" "$gpus" <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    who, dtype, n, b, rate = line.split()
    rows[(who, dtype, int(n), int(b))] = float(rate)
n = int(sys.argv[2])
print(f"\n{'who':<16}{'batch/GPU':>10}{'1 GPU':>12}{f'{n} GPUs':>12}{'efficiency':>12}{'ours/DDP (1 GPU)':>18}{f'ours/DDP ({n})':>15}")
for who, dtype in (("ours", "fp32"), ("ours", "bf16"), ("ddp", "fp32"), ("ddp", "bf16")):
    for b in (512, 4096):
        one, many = rows.get((who, dtype, 1, b)), rows.get((who, dtype, n, b))
        eff = f"{many / (n * one):.3f}" if one and many else "-"
        ratios = []
        for gpus, mine in ((1, one), (n, many)):
            d = rows.get(("ddp", dtype, gpus, b))
            ratios.append(f"{mine / d:.2f}" if who == "ours" and mine and d else "")
        print(f"{who + ' ' + dtype:<16}{b:>10}{one or 0:>12.0f}{many or 0:>12.0f}{eff:>12}{ratios[0]:>18}{ratios[1]:>15}")
PY
rm -f "$results"
