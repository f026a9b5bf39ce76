#!/usr/bin/env bash
# bench/plan_accuracy.sh — the memory plan's prediction against what a real run reports: for each
# configuration, `--dry-run` prints the plan (each pool's predicted peak), then the same command
# trains one epoch (big_mlp: a few steps) with UMT_MEM_REPORT=1, whose report at the end gives each
# pool's peak. Prints one row per pool: predicted, reported, their ratio; FAILS (exit 1) when a pool
# is off by more than 10% (issue 24, "Dry run").
#
#     bash bench/plan_accuracy.sh bazel-bin/examples                   # on the GPU machine
#     bash gpu_bundle/bench/plan_accuracy.sh gpu_bundle/bin gpu_bundle/data   # from the bundle
#     DEVICE=cpu LIMITS="--train-limit 640 --test-limit 1000" BATCHES="64 256" BIG_MLP=0 \
#         bash bench/plan_accuracy.sh bazel-bin/examples               # what the CPU reports
#
# Arguments: the folder holding mnist_cnn and big_mlp, then the MNIST folder (default data/mnist).
# Environment: DEVICE (cuda), BATCHES (64 4096 32768), LIMITS (extra mnist_cnn flags, e.g. limits),
# BIG_MLP (1: also big_mlp, CUDA only), BIG_MLP_ARGS (--no-offload --steps 3: the offload tier
# places the state at its first step, after the plan), SLACK_BYTES (2 MiB): a pool within this
# many bytes of the report passes whatever its ratio. The slack covers what no dry step allocates:
# the step's small host values (core/step_values.c: a ring of 16 slots of at least 64 KiB in the
# staging pool, and one slot in the inputs pool) appear at the first step, and grow by doubling.
# Logs go to $OUT (or /tmp/umt_plan_accuracy).
set -uo pipefail
bin="${1:?usage: plan_accuracy.sh BIN_DIR [MNIST_DIR]}"
data="${2:-data/mnist}"
device="${DEVICE:-cuda}"
batches="${BATCHES:-64 4096 32768}"
limits="${LIMITS:-}"
slack="${SLACK_BYTES:-2097152}"
logs="${OUT:-/tmp/umt_plan_accuracy}"
mkdir -p "$logs"
failed=0

# compare NAME PLAN_FILE REPORT_FILE: one row per pool; returns 1 when a pool is off.
compare() {
    python3 - "$1" "$2" "$3" "$slack" << 'PY'
import sys
name, plan_path, report_path, slack = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
pools = ["weights", "grads", "optim", "activations", "workspace", "dataset", "staging", "offload", "inputs",
         "stream"]
predicted, reported = {}, {}
for line in open(plan_path):
    f = line.split()
    # the plan's table: "  <pool> <place> <peak bytes> <readable>"
    if line.startswith("  ") and len(f) >= 3 and f[0] in pools and f[2].isdigit():
        predicted[f[0]] = int(f[2])
for line in open(report_path):
    f = line.split()
    # UMT_MEM_REPORT: "<pool> <place> <capacity B> <peak B> <allocations>"
    if len(f) == 5 and f[0] in pools and f[3].isdigit():
        reported[f[0]] = int(f[3])
if not reported:
    print(f"{name}: no UMT_MEM_REPORT in {report_path}")
    sys.exit(1)
bad = 0
for pool in pools:
    p, r = predicted.get(pool, 0), reported.get(pool, 0)
    if p == 0 and r == 0:
        continue
    ratio = p / r if r else float("inf")
    ok = abs(p - r) <= 0.10 * r or abs(p - r) <= slack
    bad += not ok
    print(f"| {name} | {pool} | {p} | {r} | {ratio:.3f} | {'ok' if ok else 'OFF'} |")
sys.exit(1 if bad else 0)
PY
}

# check NAME COMMAND...: the plan of `COMMAND --dry-run`, then COMMAND's report after its run.
check() {
    local name=$1
    shift
    local plan="$logs/$name.plan" run="$logs/$name.run"
    if ! "$@" --dry-run > "$plan" 2>&1; then
        echo "| $name | dry run failed: see $plan |"
        failed=1
        return
    fi
    if ! UMT_MEM_REPORT=1 "$@" > "$run" 2>&1; then
        echo "| $name | run failed: see $run |"
        failed=1
        return
    fi
    compare "$name" "$plan" "$run" || failed=1
}

echo "| run | pool | predicted B | reported B | ratio | |"
echo "|---|---|---|---|---|---|"
for b in $batches; do
    # shellcheck disable=SC2086
    check "mnist_cnn-$b" "$bin/mnist_cnn" --device "$device" --data-dir "$data" --epochs 1 --batch-size "$b" $limits
done
if [[ ${BIG_MLP:-1} == 1 ]]; then
    # shellcheck disable=SC2086
    check big_mlp "$bin/big_mlp" ${BIG_MLP_ARGS:---no-offload --steps 3}
fi
if [[ $failed == 0 ]]; then
    echo "plan_accuracy: every pool within 10% (or $slack bytes)"
else
    echo "plan_accuracy: FAILED"
fi
exit $failed
