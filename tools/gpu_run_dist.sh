#!/usr/bin/env bash
# gpu_bundle/run_dist.sh (copied from tools/gpu_run_dist.sh) — on a machine with 2+ GPUs: the
# data-parallelism checks of issue 7. The MPI library on the machine, the 2-GPU tests, the MNIST
# CNN on 1 GPU and with --gpus N (same recipe), under mpirun (MPI build, and the plain build
# through Open MPI's environment), then bench/dist_bench.sh. Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")" || exit 1
export LD_LIBRARY_PATH="$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
logs="${OUT:-/tmp/umt_dist_logs}"
mkdir -p "$logs"
gpus=${GPUS:-2}
step() { echo; echo "== $* ($(date +%T))"; }

step machine
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
nvidia-smi topo -m 2>&1 | head -n 4

step MPI and NCCL on this machine
mpirun=$(command -v mpirun)
echo "mpirun: ${mpirun:-none}"; [[ -n $mpirun ]] && "$mpirun" --version 2>&1 | head -n 2
ldconfig -p | grep -E 'libmpi\.so|libnccl\.so' || echo "(no libmpi/libnccl in ldconfig)"
if ! ldconfig -p | grep -q 'libmpi\.so\.40' && [[ -n $mpirun ]]; then
    mpi_lib="$(dirname "$(dirname "$(readlink -f "$mpirun")")")/lib"
    echo "libmpi.so.40 from mpirun's own prefix: $mpi_lib"; ls "$mpi_lib" | grep -E '^libmpi\.so' | head -n 3
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$mpi_lib"
fi
ldd bin/mnist_cnn_mpi | grep -E 'mpi|nccl|not found'

step GPU tests of data parallelism
timeout 240 bin/test_dist_gpu 2>&1 | tail -n 40

run_cnn() { # name, args...
    local name=$1; shift
    timeout 150 "$@" > "$logs/$name.log" 2>&1
    echo "$name (exit $?): $(grep 'test accuracy' "$logs/$name.log" | awk '{printf "%s ", $NF}')"
    grep 'trained in' "$logs/$name.log" | tail -n 1
}
step MNIST CNN: 1 GPU against $gpus GPUs, 5 epochs, the example recipe \(bf16, the default\)
run_cnn cnn_1gpu_b64 bin/mnist_cnn --device cuda --data-dir data --epochs 5 --log-every 1000
run_cnn cnn_${gpus}gpu_b$((64 / gpus)) bin/mnist_cnn --gpus "$gpus" --data-dir data --epochs 5 --batch-size $((64 / gpus)) --log-every 1000
run_cnn cnn_${gpus}gpu_b64 bin/mnist_cnn --gpus "$gpus" --data-dir data --epochs 5 --log-every 1000
run_cnn cnn_${gpus}gpu_b$((64 / gpus))_fp16 bin/mnist_cnn --gpus "$gpus" --data-dir data --epochs 5 --batch-size $((64 / gpus)) --log-every 1000 --precision fp16

step mpirun -np $gpus
mpi_flags=(--allow-run-as-root -np "$gpus" -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH)
run_cnn cnn_mpirun_mpi_b$((64 / gpus)) "$mpirun" "${mpi_flags[@]}" bin/mnist_cnn_mpi --data-dir data --epochs 2 --batch-size $((64 / gpus)) --log-every 1000
tail -n 3 "$logs/cnn_mpirun_mpi_b$((64 / gpus)).log"
run_cnn cnn_mpirun_env_b$((64 / gpus)) "$mpirun" "${mpi_flags[@]}" bin/mnist_cnn --data-dir data --epochs 2 --batch-size $((64 / gpus)) --log-every 1000
tail -n 3 "$logs/cnn_mpirun_env_b$((64 / gpus)).log"
run_cnn cnn_${gpus}gpu_b$((64 / gpus))_2ep bin/mnist_cnn --gpus "$gpus" --data-dir data --epochs 2 --batch-size $((64 / gpus)) --log-every 1000

step "benchmark (ours and DDP, fp32 and bf16)"
timeout 420 bash bench/dist_bench.sh bin data . "$gpus" 100 2>&1 | tee "$logs/dist_bench.txt"
step done
