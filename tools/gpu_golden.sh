#!/usr/bin/env bash
# tools/gpu_golden.sh BUNDLE OUTDIR — on the GPU machine: the deterministic results of one bundle
# (tools/gpu_bundle.sh), written to OUTDIR, so that two builds can be compared bit for bit with
# `diff -r`: a refactor must leave every one of them as it was.
#
#   mnist_cnn.txt   5 epochs in fp32, bf16 and fp16: every progress line's loss and learning rate,
#                   each epoch's test accuracy, fp16's loss scale; the sha256 of each epoch-5
#                   checkpoint (every parameter, buffer and optimizer state, bit for bit)
#   mnist_mlp.txt   2 epochs: losses and accuracies
#   big_mlp.txt     10 steps each (losses to 9 digits): offloaded at 2G (auto, updates in
#                   backward), in GPU memory, and at batch 2048 with saved activations offloaded
#
# Timings are cut from every line; nothing else is. Each run's exit code is kept.
set -uo pipefail
bundle="$(cd "$1" && pwd)"
out="$2"
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0

# Progress lines without their images/s; accuracy and loss-scale lines as they are.
results() { sed -n -e 's/ images\/s .*//p' -e '/test accuracy/p' -e '/loss scale/p' "$1" | grep -v '^epoch [0-9]* trained'; }

: > "$out/mnist_cnn.txt"
for precision in fp32 bf16 fp16; do
    log="$out/mnist_cnn_$precision.log"
    "$bundle/bin/mnist_cnn" --device cuda --data-dir "$bundle/data" --epochs 5 --precision "$precision" \
        --save "$out/cnn_$precision.ckpt" > "$log" 2>&1
    rc=$?
    { echo "== mnist_cnn $precision (exit $rc)"; results "$log" | grep '^epoch'
      echo "checkpoint sha256 $(sha256sum < "$out/cnn_$precision.ckpt" | cut -c1-64)"; } >> "$out/mnist_cnn.txt"
    rm -f "$out/cnn_$precision.ckpt"
done

log="$out/mnist_mlp.log"
"$bundle/bin/mnist_mlp" --device cuda --data-dir "$bundle/data" --epochs 2 > "$log" 2>&1
rc=$?
{ echo "== mnist_mlp (exit $rc)"; results "$log" | grep '^epoch'; } > "$out/mnist_mlp.txt"

# big_mlp prints "step N loss X (T ms)": the time goes.
big() {
    local name="$1"; shift
    local log="$out/big_mlp_$name.log"
    timeout 120 "$@" > "$log" 2>&1
    local rc=$?
    { echo "== big_mlp $name (exit $rc)"; sed -n 's/^\(step [0-9]* loss [^ ]*\).*/\1/p' "$log"; } >> "$out/big_mlp.txt"
}
: > "$out/big_mlp.txt"
UMT_DEVICE_BUDGET=2G big offload_auto "$bundle/bin/big_mlp" --steps 10 --update-on auto
UMT_DEVICE_BUDGET=2G big offload_backward "$bundle/bin/big_mlp" --steps 10 --update-on backward
big memory "$bundle/bin/big_mlp" --no-offload --steps 10
UMT_DEVICE_BUDGET=2G big offload_activations_2048 "$bundle/bin/big_mlp" --batch 2048 --steps 10 --offload-activations
big memory_2048 "$bundle/bin/big_mlp" --batch 2048 --no-offload --steps 10

cat "$out/mnist_cnn.txt" "$out/mnist_mlp.txt" "$out/big_mlp.txt"
