#!/usr/bin/env bash
# tools/train.sh — the one command that trains on a fresh machine: installs what is missing,
# fetches MNIST into data/mnist (checksums verified), builds and runs the MNIST trainer.
# Extra arguments go to the trainer, e.g. tools/train.sh --epochs 5 --optimizer adam
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/fetch_mnist.sh data/mnist
bazel build //examples:mnist_mlp
exec bazel-bin/examples/mnist_mlp --data-dir data/mnist "$@"
