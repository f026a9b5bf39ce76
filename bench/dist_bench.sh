#!/usr/bin/env bash
# bench/dist_bench.sh — data-parallel speed: umtrain's mnist_cnn --bench against PyTorch DDP
# (bench/torch_ddp.py under torchrun), on 1 and N GPUs of this machine, in one run.
#
#     bash bench/dist_bench.sh BIN_DIR DATA_DIR TORCH_DIR [GPUS] [STEPS]
#
# umtrain runs in fp32 and bf16 (--precision), its whole step one CUDA graph per rank (the
# all-reduces captured with it); DDP in fp32 (TF32 off) and bf16 autocast. The environment adds
# configurations, each a space-separated list (defaults in brackets):
#   BATCHES  per-GPU batches [64 512 4096]
#   DTYPES   precisions, both sides [fp32 bf16]
#   GRAPHS   umtrain's --graph [on]; "on off" times every step launched op by op too
#   REDUCES  umtrain's --reduce [f32]; "f32 bf16" adds the all-reduces in half the bytes
#   BUCKETS  umtrain's --bucket-mb [auto]; "auto 1 8" chooses the bucket size by measurement
#   NET=1    adds N GPUs with NCCL's peer-to-peer and shared-memory transports off
#            (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1): the network transport between the ranks of
#            one host, as between nodes; NCCL's log must say "via NET" (checked, else the row says
#            so). MPIRUN=1 starts those ranks with mpirun -np N instead of --gpus N.
#   DDP=0    leaves PyTorch out.
# Prints every measured line, then a table: images/s over all GPUs, scaling efficiency = N-GPU
# rate / (N x 1-GPU rate), and umtrain / DDP in the same dtype.
set -uo pipefail
bin=$1 data=$2 torch_dir=$3 gpus=${4:-2} steps=${5:-200}
batches=${BATCHES:-64 512 4096} dtypes=${DTYPES:-fp32 bf16} graphs=${GRAPHS:-on} reduces=${REDUCES:-f32}
buckets=${BUCKETS:-auto}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
results=$(mktemp) log=$(mktemp) rate=0

# One umtrain run: N BATCH ARGS...; its images/s in $rate (0 when it failed), its output in $log.
# With via_mpirun=1 the N ranks come from mpirun (NCCL's variables passed on), else from --gpus N.
ours() {
    local n=$1 b=$2; shift 2
    local run=("$bin/mnist_cnn" --gpus "$n")
    [[ ${via_mpirun:-0} == 1 ]] && run=(mpirun --allow-run-as-root -np "$n" -x NCCL_P2P_DISABLE -x NCCL_SHM_DISABLE
                                        -x NCCL_DEBUG -x NCCL_NVLS_ENABLE "$bin/mnist_cnn")
    timeout 180 "${run[@]}" --device cuda --data-dir "$data" --bench "$steps" --batch-size "$b" "$@" > "$log" 2>&1
    local line
    line=$(grep '^bench:' "$log")
    rate=$(sed -n 's/.*: \([0-9]*\) images\/s.*/\1/p' <<< "$line")
    rate=${rate:-0}
    echo "n=$n b=$b $*: ${line:-FAILED: $(tail -n 2 "$log" | tr '\n' ' ')}"
    grep -E '^mnist_cnn: gradients all-reduced|step graph off|runs eagerly|capturing again' "$log" | sort -u |
        sed 's/^/    /'
}

for dtype in $dtypes; do
    for graph in $graphs; do
        for b in $batches; do
            base="ours-$dtype-graph-$graph"
            ours 1 "$b" --precision "$dtype" --graph "$graph"
            one=$rate
            for reduce in $reduces; do
                for bucket in $buckets; do
                    label=$base
                    [[ $reduce != f32 ]] && label+="-reduce-$reduce"
                    [[ $bucket != auto ]] && label+="-bucket-${bucket}MB"
                    ours "$gpus" "$b" --precision "$dtype" --graph "$graph" --reduce "$reduce" --bucket-mb "$bucket"
                    printf '%s 1 %s %s\n%s %s %s %s\n' "$label" "$b" "$one" "$label" "$gpus" "$b" "$rate" >> "$results"
                done
            done
            [[ ${NET:-0} == 1 ]] || continue
            via_mpirun=${MPIRUN:-0} NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO \
                ours "$gpus" "$b" --precision "$dtype" --graph "$graph"
            echo "    NCCL's transports: $(grep -o 'via [A-Za-z/]*' "$log" | sort | uniq -c | tr -s ' \n' ' ')"
            label="$base-net"
            grep -q 'via NET' "$log" || { label="$base-NOT-net"; echo "    NOT the network transport: not measured"; }
            printf '%s 1 %s %s\n%s %s %s %s\n' "$label" "$b" "$one" "$label" "$gpus" "$b" "$rate" >> "$results"
        done
    done
done

if [[ ${DDP:-1} != 0 ]]; then
    for dtype in $dtypes; do
        for n in 1 "$gpus"; do
            (cd "$torch_dir" && timeout 300 torchrun --standalone --nproc_per_node "$n" torch_ddp.py --steps "$steps" \
                --batches "$(tr ' ' ',' <<< "$batches")" --dtype "$dtype" 2>&1) | grep '^torch ddp' |
                tee -a /dev/stderr | awk -v d="$dtype" '{print "ddp-" d, $5, $7, $8}' | tr -d ':' >> "$results"
        done
    done 2>&1
fi

python3 - "$results" "$gpus" <<'PY'
import sys
rows, order = {}, []
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) != 4:
        continue
    label, n, b, rate = parts[0], int(parts[1]), int(parts[2]), float(parts[3] or 0)
    rows[(label, n, b)] = rate
    if label not in order:
        order.append(label)
n = int(sys.argv[2])
print(f"\n{'configuration':<44}{'batch/GPU':>10}{'1 GPU':>12}{f'{n} GPUs':>12}{'efficiency':>12}"
      f"{'ours/DDP (1 GPU)':>18}{f'ours/DDP ({n})':>15}")
for label in order:
    for b in sorted({key[2] for key in rows if key[0] == label}):
        one, many = rows.get((label, 1, b)), rows.get((label, n, b))
        eff = f"{many / (n * one):.3f}" if one and many else "-"
        ratios = []
        dtype = label.split("-")[1]
        for gpus, mine in ((1, one), (n, many)):
            d = rows.get((f"ddp-{dtype}", gpus, b))
            ratios.append(f"{mine / d:.2f}" if label.startswith("ours") and mine and d else "")
        print(f"{label:<44}{b:>10}{one or 0:>12.0f}{many or 0:>12.0f}{eff:>12}{ratios[0]:>18}{ratios[1]:>15}")
PY
rm -f "$results" "$log"
