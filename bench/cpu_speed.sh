#!/usr/bin/env bash
# bench/cpu_speed.sh — the CPU backend against PyTorch's CPU, side by side in one run (issue 28).
#
#     bash bench/cpu_speed.sh                         # from the repository; builds mnist_cnn first
#     ROUNDS=5 STEPS=200 THREADS="1 2 4" bash bench/cpu_speed.sh
#
# The MNIST CNN (examples/mnist_cnn, `--device cpu --bench STEPS --batch-size BATCH`: 20 warm-up
# steps, then STEPS timed, data resident) at each thread count of THREADS (UMT_CPU_THREADS), and
# bench/torch_ref.py --device cpu (the same network, Adadelta, fp32 eager, 20 warm-up steps, then
# STEPS timed) at the same counts (torch.set_num_threads). The machine may be shared, so the runs
# are interleaved, ROUNDS times over: ours at each count, then PyTorch at each count, and again.
# Prints every run (with the load average after it: the rest of the machine's work), then a table:
# each configuration's images/s per round and median, and our ratio to PyTorch at each count.
# Logs go to $OUT (or /tmp/umt_cpu_speed).
# PYTHON is the interpreter that has torch (default: Debian's /usr/bin/python3, where
# `apt-get install python3-torch` puts PyTorch 1.13).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
logs="${OUT:-/tmp/umt_cpu_speed}"
rounds="${ROUNDS:-3}"
steps="${STEPS:-100}"
batch="${BATCH:-64}"
threads="${THREADS:-1 2}"
python="${PYTHON:-/usr/bin/python3}"
data="${DATA_DIR:-data/mnist}"
bin="${BIN:-}"
mkdir -p "$logs"

if [[ -z $bin ]]; then
    bazel build //examples:mnist_cnn > "$logs/build.log" 2>&1 || { cat "$logs/build.log"; exit 1; }
    bin=bazel-bin/examples/mnist_cnn
fi
if ! "$python" -c "import torch" 2> /dev/null; then
    echo "cpu_speed.sh: $python has no torch (apt-get install python3-torch)"
    exit 1
fi

{
    echo "machine: $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
    changes=$(git diff --quiet HEAD || echo ' (+ changes)')
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)$changes"
    echo "torch: $("$python" -c 'import torch; print(torch.__version__)')"
    echo "batch $batch, $steps timed steps after 20 warm-up steps, $rounds rounds"
} | tee "$logs/cpu_speed_machine.txt"

# The load average over the last minute, after a run: how much else the machine was doing.
load() { echo "(load $(cut -d' ' -f1 /proc/loadavg))"; }

: > "$logs/cpu_speed_runs.txt"
for round in $(seq 1 "$rounds"); do
    for n in $threads; do
        rate=$(UMT_CPU_THREADS=$n "$bin" --device cpu --data-dir "$data" --bench "$steps" --batch-size "$batch" 2>&1 |
            tee "$logs/ours_${n}_round$round.log" | sed -n 's/.*: \([0-9]*\) images\/s.*/\1/p')
        echo "round $round ours $n ${rate:-failed} $(load)" | tee -a "$logs/cpu_speed_runs.txt"
    done
    for n in $threads; do
        rate=$("$python" bench/torch_ref.py --device cpu --threads "$n" --batches "$batch" --steps "$steps" 2>&1 |
            tee "$logs/torch_${n}_round$round.log" | sed -n 's/.*: \([0-9]*\) images\/s.*/\1/p')
        echo "round $round torch $n ${rate:-failed} $(load)" | tee -a "$logs/cpu_speed_runs.txt"
    done
done

# The table: rows per configuration, a column per round, the median; then ours / torch per count.
python3 - "$logs/cpu_speed_runs.txt" "$rounds" <<'EOF' | tee "$logs/cpu_speed_table.md"
import statistics
import sys

runs, rounds = {}, int(sys.argv[2])
for line in open(sys.argv[1]):
    _, r, who, n, rate = line.split()[:5]
    runs.setdefault((who, int(n)), {})[int(r)] = float(rate) if rate != "failed" else float("nan")
header = "| images/s | " + " | ".join(f"round {r}" for r in range(1, rounds + 1)) + " | median |"
print(header)
print("|---|" + "---:|" * (rounds + 1))
for (who, n), by_round in sorted(runs.items()):
    name = ("umtrain" if who == "ours" else "PyTorch") + f", {n} thread{'s' if n > 1 else ''}"
    values = [by_round.get(r, float("nan")) for r in range(1, rounds + 1)]
    print(f"| {name} | " + " | ".join(f"{v:.0f}" for v in values) + f" | {statistics.median(values):.0f} |")
for (who, n), ours in sorted(runs.items()):
    if who != "ours" or ("torch", n) not in runs:
        continue
    theirs = runs[("torch", n)]
    ratios = [ours[r] / theirs[r] for r in range(1, rounds + 1) if r in ours and r in theirs]
    print(f"| umtrain / PyTorch, {n} thread{'s' if n > 1 else ''} | " + " | ".join(f"{x:.2f}x" for x in ratios)
          + f" | {statistics.median(ratios):.2f}x |")
EOF
