#!/usr/bin/env bash
# tools/gpu_bundle.sh — builds the CUDA binaries here and bundles them, with MNIST and the
# libraries a bare GPU machine lacks, into gpu_bundle/ (git-ignored). On the GPU machine,
#     bash gpu_bundle/run_all.sh
# runs every GPU test, the trainer and the benchmarks, and prints a summary table last.
# UMT_BUNDLE_DIR puts the bundle elsewhere (an absolute path, or relative to the repo root).
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
bundle="${UMT_BUNDLE_DIR:-gpu_bundle}"
tools/setup.sh
tools/fetch_mnist.sh data/mnist

gpu_targets=(//tests/gpu:all //examples:mnist_mlp //examples:mnist_cnn //examples:predict //examples:image_folder
             //examples:mnist_to_png //bench:all)
echo "gpu_bundle: bazel build --config=cuda ${gpu_targets[*]}"
bazel build --config=cuda "${gpu_targets[@]}"

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/data"
for t in $(bazel query 'kind(cc_test, //tests/gpu:all)' 2>/dev/null); do
    cp "bazel-bin/tests/gpu/${t##*:}" "$bundle"/bin/
done
cp bazel-bin/examples/mnist_mlp bazel-bin/examples/mnist_cnn bazel-bin/examples/predict \
    bazel-bin/examples/image_folder bazel-bin/examples/mnist_to_png \
    bazel-bin/bench/mlp_mem_modes "$bundle"/bin/
# cmocka and stb are not on the GPU machine's image; CUDA, cuBLAS, cuDNN and zlib are.
for lib in libcmocka.so.0 libstb.so.0; do
    cp -L "$(ldconfig -p | awk -v lib="$lib" '$1 == lib {print $NF; exit}')" "$bundle"/lib/
done
# Compressed, the four MNIST files travel in 12 MB instead of 55 (the IDX reader inflates them).
for f in data/mnist/*-ubyte; do gzip -9 -c "$f" > "$bundle/data/$(basename "$f").gz"; done
cp tools/gpu_run_all.sh "$bundle"/run_all.sh
cp bench/torch_ref.py bench/input_pipeline.sh "$bundle"/
du -sh "$bundle"
