#!/usr/bin/env bash
# gpu_bundle/run_dist.sh (copied from tools/gpu_run_dist.sh) — the data-parallelism checks of
# issues 7 and 25. Logs go to $OUT. GPUS (default: the GPUs nvidia-smi lists) says how many to use.
#
# One GPU is enough for the first part: the GPU tests' cases of one rank (a one-rank all-reduce in
# bf16; one rank's all-reduces captured in the step graph, bit for bit against eager steps), and
# mnist_cnn --dist on against no data parallelism, the graph on (the same checkpoint bytes in f32).
# With 2+ GPUs, then: the MPI library on the machine, the 2-GPU tests (graph on and off, the
# killed and the hung rank), the MNIST CNN on 1 GPU and with --gpus N (the same recipe, graph on
# and off), the network transport forced on one host (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1,
# 2 epochs against the default transports), under mpirun (MPI build, and the plain build through
# Open MPI's environment), then bench/dist_bench.sh with DDP (graph on and off, f32 and bf16
# reduction, the network transport: NET=1).
# PARTS picks some of them (each fits a 10-minute session): one, tests, cnn, net, mpirun, bench
# (default: all of them); BENCH_DTYPES, BENCH_BATCHES narrow the benchmark (bench/dist_bench.sh).
set -uo pipefail
cd "$(dirname "$0")" || exit 1
export LD_LIBRARY_PATH="$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
logs="${OUT:-/tmp/umt_dist_logs}"
mkdir -p "$logs"
gpus=${GPUS:-$(nvidia-smi -L | wc -l)}
parts=" ${PARTS:-one tests cnn net mpirun bench} "
step() { echo; echo "== $* ($(date +%T))"; }
want() { [[ $parts == *" $1 "* ]]; }

step machine
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
nvidia-smi topo -m 2>&1 | head -n 4

if want one; then
    step "one GPU: a rank's all-reduces in the step graph"
    timeout 600 bin/test_step_graph 2>&1 | grep -E '^\[|one rank|--dist on|eager runs' | tail -n 30
    timeout 300 bin/test_dist_gpu 2>&1 | grep -E '^\[|bf16 on one rank' | tail -n 20
    for precision in fp32 bf16; do
        for dist in auto on; do
            timeout 300 bin/mnist_cnn --device cuda --data-dir data --epochs 1 --precision "$precision" --dist "$dist" \
                --save "$logs/dist_$dist.ckpt" > "$logs/cnn_graph_dist_${dist}_$precision.log" 2>&1
        done
        same="checkpoints DIFFER"
        cmp -s "$logs/dist_auto.ckpt" "$logs/dist_on.ckpt" && same="checkpoints equal"
        echo "mnist_cnn 1 epoch $precision, graph on: --dist on vs auto: $same;" \
            "$(grep -h 'step graph:' "$logs/cnn_graph_dist_on_$precision.log" | head -n 1)"
        grep -h 'step graph off\|runs eagerly\|capturing again' "$logs/cnn_graph_dist_on_$precision.log" | sort -u
    done
    rm -f "$logs"/dist_*.ckpt
fi
if (( gpus < 2 )); then
    step "done: the rest needs 2 GPUs (this machine has $gpus)"
    exit 0
fi

step MPI and NCCL on this machine
mpirun=$(command -v mpirun)
echo "mpirun: ${mpirun:-none}"; [[ -n $mpirun ]] && "$mpirun" --version 2>&1 | head -n 2
ldconfig -p | grep -E 'libmpi\.so|libnccl\.so' || echo "(no libmpi/libnccl in ldconfig)"
if ! ldconfig -p | grep -q 'libmpi\.so\.40' && [[ -n $mpirun ]]; then
    mpi_lib="$(dirname "$(dirname "$(readlink -f "$mpirun")")")/lib"
    echo "libmpi.so.40 from mpirun's own prefix: $mpi_lib"; ls "$mpi_lib" | grep -E '^libmpi\.so' | head -n 3
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$mpi_lib"
fi
[[ -e bin/mnist_cnn_mpi ]] && ldd bin/mnist_cnn_mpi | grep -E 'mpi|nccl|not found'

if want tests; then
    step GPU tests of data parallelism
    timeout 420 bin/test_dist_gpu 2>&1 | tail -n 50
fi

run_cnn() { # name, args...
    local name=$1; shift
    timeout 300 "$@" > "$logs/$name.log" 2>&1
    echo "$name (exit $?): $(grep 'test accuracy' "$logs/$name.log" | awk '{printf "%s ", $NF}')"
    grep -h 'trained in\|step graph:\|gradients all-reduced' "$logs/$name.log" | sort -u | tail -n 4
    grep -h 'step graph off\|capturing again\|via NET' "$logs/$name.log" | sort -u | head -n 4
}
b=$((64 / gpus))
if want cnn; then
    step MNIST CNN: 1 GPU against $gpus GPUs, 5 epochs, the example recipe \(bf16, the default\), graph on and off
    run_cnn cnn_1gpu_b64 bin/mnist_cnn --device cuda --data-dir data --epochs 5 --log-every 1000
    run_cnn cnn_${gpus}gpu_b${b} bin/mnist_cnn --gpus "$gpus" --data-dir data --epochs 5 --batch-size $b \
        --log-every 1000
    run_cnn cnn_${gpus}gpu_b${b}_graph_off bin/mnist_cnn --gpus "$gpus" --data-dir data --epochs 5 --batch-size $b \
        --log-every 1000 --graph off
    run_cnn cnn_${gpus}gpu_b64 bin/mnist_cnn --gpus "$gpus" --data-dir data --epochs 5 --log-every 1000
    run_cnn cnn_${gpus}gpu_b${b}_fp16 bin/mnist_cnn --gpus "$gpus" --data-dir data --epochs 5 --batch-size $b \
        --log-every 1000 --precision fp16
fi

if want net; then
    step "the network transport on one host (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1), 2 epochs against the default"
    run_cnn cnn_${gpus}gpu_b${b}_2ep bin/mnist_cnn --gpus "$gpus" --data-dir data --epochs 2 --batch-size $b \
        --log-every 1000
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO run_cnn cnn_${gpus}gpu_b${b}_2ep_net bin/mnist_cnn \
        --gpus "$gpus" --data-dir data --epochs 2 --batch-size $b --log-every 1000
fi

if want mpirun; then
    step mpirun -np $gpus
    if [[ -n $mpirun ]]; then
        mpi_flags=(--allow-run-as-root -np "$gpus" -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH)
        [[ -e bin/mnist_cnn_mpi ]] && run_cnn cnn_mpirun_mpi_b$b "$mpirun" "${mpi_flags[@]}" bin/mnist_cnn_mpi \
            --data-dir data --epochs 2 --batch-size $b --log-every 1000
        run_cnn cnn_mpirun_env_b$b "$mpirun" "${mpi_flags[@]}" bin/mnist_cnn --data-dir data --epochs 2 \
            --batch-size $b --log-every 1000
        NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO run_cnn cnn_mpirun_env_b${b}_net "$mpirun" \
            "${mpi_flags[@]}" -x NCCL_P2P_DISABLE -x NCCL_SHM_DISABLE -x NCCL_DEBUG bin/mnist_cnn --data-dir data \
            --epochs 2 --batch-size $b --log-every 1000
    else
        echo "no mpirun on this machine: the --gpus runs above stand for it (the same ranks, the same transports)"
    fi
fi

if want bench; then
    step "benchmark (ours and DDP; graph on and off; f32 and bf16 reduction; the network transport)"
    DTYPES=${BENCH_DTYPES:-fp32 bf16} BATCHES=${BENCH_BATCHES:-64 512 4096} GRAPHS="on off" REDUCES="f32 bf16" \
        NET=1 MPIRUN=$([[ -n $mpirun ]] && echo 1 || echo 0) \
        timeout 3000 bash bench/dist_bench.sh bin data . "$gpus" 100 2>&1 | tee "$logs/dist_bench.txt"
fi
step done
