#!/usr/bin/env bash
# bench/offload_trace.sh — on the GPU machine: does the memory picture explain an offloaded step?
#
#     bash bench/offload_trace.sh BINDIR OUTDIR [MIN_COVERAGE]
#
# BINDIR holds big_mlp built with --config=cuda (bazel-bin/examples, or a bundle's bin/ from
# tools/gpu_bundle.sh). examples/big_mlp (8 x 8192^2, Adam, fp32: 8 GiB of state) is trained 10
# steps at UMT_DEVICE_BUDGET=2G, batch 512, with UMT_MEM_TRACE, in the two ways its CPU threads
# update offloaded parameters: `--update-on auto` (after backward; this host's threads chosen when
# faster than the GPU's streamed update) and `--update-on backward` (during backward, beside the
# GPU's update ring, the CPU's count searched). Each trace is drawn by tools/mem_trace_svg.py
# (step 5) into OUTDIR, with every whole step's coverage printed; the script fails (exit 1) when
# the lanes of step 5 cover less than MIN_COVERAGE (0.95) of it in either run.
set -uo pipefail
[[ $# -ge 2 ]] || { echo "usage: $0 BINDIR OUTDIR [MIN_COVERAGE]" >&2; exit 2; }
bin=$(cd "$1" && pwd) || exit 2
out="$2"
minimum="${3:-0.95}"
mkdir -p "$out" || exit 2
here=$(cd "$(dirname "$0")" && pwd)
# The drawer: in the tree (bench/../tools), or beside this script in a bundle.
tool="$here/../tools/mem_trace_svg.py"
[[ -e $tool ]] || tool="$here/mem_trace_svg.py"
[[ -e $tool ]] || { echo "offload_trace: no mem_trace_svg.py in $here/../tools or $here" >&2; exit 2; }
[[ -x $bin/big_mlp ]] || { echo "offload_trace: no $bin/big_mlp (build it with --config=cuda)" >&2; exit 2; }
# A bundle's libraries (tools/gpu_bundle.sh puts them in lib/ beside bin/).
[[ -d $bin/../lib ]] && export LD_LIBRARY_PATH="$bin/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

status=0
for where in auto backward; do
    trace="$out/big_mlp_2G_512_${where}_trace.json"
    log="$out/big_mlp_2G_512_${where}.log"
    UMT_DEVICE_BUDGET=2G UMT_MEM_TRACE="$trace" timeout 150 "$bin/big_mlp" --steps 10 --batch 512 \
        --update-on "$where" > "$log" 2>&1
    rc=$?
    echo "== UMT_DEVICE_BUDGET=2G UMT_MEM_TRACE=$trace big_mlp --steps 10 --batch 512 --update-on $where (exit $rc) =="
    grep -E '^offload:|^step' "$log"
    [[ $rc -eq 0 ]] || { tail -n 20 "$log"; status=1; continue; }
    for step in 2 3 4 6 7 8; do
        python3 "$tool" "$trace" --step "$step" -o /dev/null | sed -n 1p
    done
    python3 "$tool" "$trace" --step 5 -o "$out/big_mlp_2G_512_${where}_memory.svg" --min-coverage "$minimum" || status=1
done
[[ $status -eq 0 ]] && echo "offload_trace: step 5 covered at least $minimum in both runs" ||
    echo "offload_trace: FAILED (a run failed, or step 5's lanes cover less than $minimum)"
exit $status
