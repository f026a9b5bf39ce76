#!/usr/bin/env bash
# tools/train.sh — the one command that trains on a fresh machine: installs what is missing,
# fetches MNIST into data/mnist (checksums verified), builds and runs the MNIST CNN trainer
# (on CUDA when this machine has nvcc and a GPU, else on the CPU), saving mnist_cnn.ckpt.
# Extra arguments go to the trainer, e.g. tools/train.sh --epochs 14
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
tools/setup.sh
tools/fetch_mnist.sh data/mnist
config=()
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    config=(--config=cuda)
fi
bazel build "${config[@]}" //examples:mnist_cnn //examples:predict
exec bazel-bin/examples/mnist_cnn --data-dir data/mnist --save mnist_cnn.ckpt "$@"
