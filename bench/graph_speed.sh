#!/usr/bin/env bash
# bench/graph_speed.sh — the MNIST CNN's training speed with the whole-step CUDA graph off and on.
#
#     bash gpu_bundle/bench/graph_speed.sh                          # on the GPU machine, from the bundle
#     BASE=/path/to/older/mnist_cnn PRECISION=fp32 bash gpu_bundle/bench/graph_speed.sh
#
# For batch 64, 512 and 4096 (BATCHES): `mnist_cnn --bench N --graph off`, then `--graph on`
# (and an older trainer given as BASE, run without the flag it may not know), REPEATS runs of
# each, interleaved, data on the GPU, PRECISION (default bf16). Prints one markdown row per batch
# with every run's images/s; logs go to $OUT (or /tmp/umt_graph_speed).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=bench/common.sh
source "$here/common.sh"
logs="${OUT:-/tmp/umt_graph_speed}"
mkdir -p "$logs"
precision="${PRECISION:-bf16}"
repeats="${REPEATS:-2}"
log="$logs/graph_speed.log"
: > "$log"

# images/s of one bench run, or "failed".
bench() {
    local out
    out=$(timeout 120 "$@" --device cuda --data-dir "$bundle/data" --precision "$precision" 2>&1)
    echo "$out" >> "$log"
    echo "$out" | awk '/^bench:/ {print $(NF-3); found=1} END {if (!found) print "failed"}'
}

header="| batch |"
[[ -n ${BASE:-} ]] && header+=" before |"
echo "$header --graph off | --graph on |"
echo "|---:|$([[ -n ${BASE:-} ]] && echo '---:|')---:|---:|"
for batch in ${BATCHES:-64 512 4096}; do
    base_runs="" off_runs="" on_runs=""
    for ((r = 0; r < repeats; r++)); do
        args=(--bench "$(steps_for "$batch")" --batch-size "$batch")
        [[ -n ${BASE:-} ]] && base_runs+="$(bench "$BASE" "${args[@]}") "
        off_runs+="$(bench "$bundle/bin/mnist_cnn" "${args[@]}" --graph off) "
        on_runs+="$(bench "$bundle/bin/mnist_cnn" "${args[@]}" --graph on) "
    done
    row="| $batch |"
    [[ -n ${BASE:-} ]] && row+=" ${base_runs% } |"
    echo "$row ${off_runs% } | ${on_runs% } |"
done
