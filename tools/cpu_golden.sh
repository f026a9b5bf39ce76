#!/usr/bin/env bash
# tools/cpu_golden.sh BIN OUTDIR — the CPU twin of tools/gpu_golden.sh: deterministic results of
# the example binaries in BIN (mnist_mlp, mnist_cnn, embed) on the CPU, written to OUTDIR, so that
# two builds can be compared bit for bit with `diff -r` (a refactor must leave them as they were).
# Short runs (a few thousand images); MNIST from data/mnist. Timings are cut; each checkpoint's
# sha256 stands for every parameter and optimizer state.
set -uo pipefail
bin="$(cd "$1" && pwd)"
out="$2"
data="${DATA_DIR:-data/mnist}"
mkdir -p "$out"
results() { sed -n -e 's/ images\/s .*//p' -e '/test accuracy/p' "$1"; }

run() {
    local name="$1"; shift
    "$@" > "$out/$name.log" 2>&1
    local rc=$?
    { echo "== $name (exit $rc)"; results "$out/$name.log"
      [[ -e "$out/$name.ckpt" ]] && echo "checkpoint sha256 $(sha256sum < "$out/$name.ckpt" | cut -c1-64)"; } >> "$out/cpu.txt"
    rm -f "$out/$name.ckpt"
}
: > "$out/cpu.txt"
run mlp "$bin/mnist_mlp" --device cpu --data-dir "$data" --epochs 2 --train-limit 6000 --log-every 20
run cnn "$bin/mnist_cnn" --device cpu --data-dir "$data" --epochs 1 --train-limit 1024 --log-every 4 \
    --save "$out/cnn.ckpt"
# --lr given: builds from before --optimizer brought its own default rate (Adam's 0.001) compare too.
run cnn_unfused_adam "$bin/mnist_cnn" --device cpu --data-dir "$data" --epochs 1 --train-limit 512 --log-every 2 \
    --fuse off --optimizer adam --lr 0.001 --save "$out/cnn_unfused_adam.ckpt"
{ echo "== embed"; "$bin/embed"; } >> "$out/cpu.txt"
cat "$out/cpu.txt"
