#!/usr/bin/env bash
# tools/gpu_bundle.sh — builds the CUDA binaries here and bundles them, with MNIST and the
# libraries a bare GPU machine lacks, into gpu_bundle/ (git-ignored). On the GPU machine,
#     bash gpu_bundle/run_all.sh
# runs every GPU test, the trainer and the benchmarks, and prints a summary table last;
#     bash gpu_bundle/run_dist.sh
# runs the data-parallel checks and benchmark (2+ GPUs).
# UMT_BUNDLE_DIR puts the bundle elsewhere (an absolute path, or relative to the repo root).
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
bundle="${UMT_BUNDLE_DIR:-gpu_bundle}"
tools/setup.sh
tools/fetch_mnist.sh data/mnist

# The trainer with MPI (--define=umt_mpi=1), when Open MPI's headers are here (libopenmpi-dev);
# built first, because the build below relinks bazel-bin/examples/mnist_cnn without MPI.
mpi_binary=""
if [[ -e /usr/include/x86_64-linux-gnu/mpi/mpi.h ]]; then
    echo "gpu_bundle: bazel build --config=cuda --define=umt_mpi=1 //examples:mnist_cnn"
    bazel build --config=cuda --define=umt_mpi=1 //examples:mnist_cnn
    mpi_binary=$(mktemp)
    cp -f bazel-bin/examples/mnist_cnn "$mpi_binary"
fi

gpu_targets=(//tests/gpu:all //examples:mnist_mlp //examples:mnist_cnn //examples:mnist_cnn_minimal //examples:predict
             //examples:image_folder //examples:mnist_to_png //examples:big_mlp //examples:sweep //bench:all)
echo "gpu_bundle: bazel build --config=cuda ${gpu_targets[*]}"
bazel build --config=cuda "${gpu_targets[@]}"

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/data"
for t in $(bazel query 'kind(cc_test, //tests/gpu:all)' 2>/dev/null); do
    cp "bazel-bin/tests/gpu/${t##*:}" "$bundle"/bin/
done
cp bazel-bin/examples/mnist_mlp bazel-bin/examples/mnist_cnn bazel-bin/examples/mnist_cnn_minimal bazel-bin/examples/predict \
    bazel-bin/examples/image_folder bazel-bin/examples/mnist_to_png bazel-bin/examples/big_mlp bazel-bin/examples/sweep \
    bazel-bin/bench/mlp_mem_modes bazel-bin/bench/cpu_update bazel-bin/bench/host_contention "$bundle"/bin/
# cmocka is not on the GPU machine's image; CUDA, cuBLAS, cuDNN and zlib are (stb is compiled in).
for lib in libcmocka.so.0; do
    cp -L "$(ldconfig -p | awk -v lib="$lib" '$1 == lib {print $NF; exit}')" "$bundle"/lib/
done
# The GPU timeline's injection library (bench/kernel_timeline.sh), and CUPTI in case the machine's
# CUDA has none.
cp bazel-bin/bench/libumt_timeline.so "$bundle"/lib/
cp -L /usr/local/cuda/lib64/libcupti.so.13 "$bundle"/lib/
# Compressed, the four MNIST files travel in 12 MB instead of 55 (the IDX reader inflates them).
for f in data/mnist/*-ubyte; do gzip -9 -c "$f" > "$bundle/data/$(basename "$f").gz"; done
cp tools/gpu_run_all.sh "$bundle"/run_all.sh
# Two builds' deterministic results, for a bit-for-bit comparison (tools/gpu_golden.sh).
cp tools/gpu_golden.sh "$bundle"/golden.sh
cp bench/torch_ref.py bench/input_pipeline.sh tools/kernel_profile.sh "$bundle"/
# The offload tier: big_mlp's losses and benchmark, and the trace drawn as an SVG (bench/offload.sh,
# bench/offload_trace.sh).
cp bench/offload.sh bench/offload_trace.sh tools/mem_trace_svg.py tools/trace_phases.py "$bundle"/
# The curves of a --metrics file (tools/plot_metrics.py).
cp tools/plot_metrics.py "$bundle"/
# Data parallelism: tools/gpu_run_dist.sh runs its checks and bench/dist_bench.sh (with DDP).
cp tools/gpu_run_dist.sh "$bundle"/run_dist.sh
cp bench/torch_ddp.py "$bundle"/
mkdir -p "$bundle/bench"
cp bench/dist_bench.sh bench/speed.sh bench/speed_table.py bench/graph_speed.sh bench/common.sh bench/plan_accuracy.sh \
    bench/sweep.sh bench/kernel_timeline.sh bench/kernel_timeline.py "$bundle"/bench/
if [[ -n $mpi_binary ]]; then mv "$mpi_binary" "$bundle"/bin/mnist_cnn_mpi; chmod +x "$bundle"/bin/mnist_cnn_mpi; fi
du -sh "$bundle"
