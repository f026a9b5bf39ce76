#!/usr/bin/env bash
# bench/offload.sh — on the GPU machine, from the bundle (tools/gpu_bundle.sh copies it there):
#     bash gpu_bundle/offload.sh
#     bash gpu_bundle/offload.sh lowp      # only the bf16/fp16, micro-batch and --dist section
# The offload tier's GPU tests, examples/big_mlp trained for 10 steps with UMT_DEVICE_BUDGET=2G
# (state 4x the budget) and in GPU memory, their losses compared, the benchmark of both at two
# batch sizes, the same at batch 2048 with saved activations offloaded too (--offload-activations;
# tools/trace_phases.py splits its step), and the memory trace of the offloaded run drawn as an SVG. Logs, the trace and the
# SVG go to $OUT (or /tmp/umt_offload_logs); a refused allocation with a 1G budget shows the pools
# largest first; a summary table comes last.
set -uo pipefail
cd "$(dirname "$0")" || exit 1
export LD_LIBRARY_PATH="$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
logs="${OUT:-/tmp/umt_offload_logs}"
mkdir -p "$logs"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader | tee "$logs/gpu.txt"
rows=()
row() { rows+=("$(printf '%-52s %s' "$1" "$2")"); }
compare() {
    paste <(grep '^step' "$1" | awk '{print $4}') <(grep '^step' "$2" | awk '{print $4}') |
        awk '{d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > w) w = r; n++} END {printf "%d steps, max relative %.2e", n, w}'
}

# bf16 and fp16 through the tier (issue 24, "big_mlp in bf16 at a 2 GiB budget"): the tier's GPU
# tests beyond fp32; 10 steps offloaded against in GPU memory in the same precision (bf16
# tolerance), micro-batches against the whole batch, one-rank data parallelism against none (the
# same losses); then the benchmark at batch 512 and 2048 with each term of the floor: the
# in-memory step, the link's bytes at the bandwidth measured in the run, and the offloaded update
# at its measured speed (auto times both ways); floor / step last.
lowp_section() {
    local log="$logs/lowp" rc r1 r2 r3
    mkdir -p "$log"
    timeout 200 bin/test_cuda_offload_precision > "$log/test_cuda_offload_precision.log" 2>&1
    rc=$?
    [[ $rc -ne 0 ]] && tail -n 40 "$log/test_cuda_offload_precision.log"
    row "test_cuda_offload_precision" \
        "$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log/test_cuda_offload_precision.log" | tail -n 1) passed (exit $rc)"
    for precision in bf16 fp16; do
        UMT_DEVICE_BUDGET=2G timeout 100 bin/big_mlp --precision $precision --steps 10 > "$log/${precision}_offload.log" 2>&1
        r1=$?
        UMT_DEVICE_BUDGET=2G timeout 100 bin/big_mlp --precision $precision --steps 10 --update-on backward \
            > "$log/${precision}_backward.log" 2>&1
        r2=$?
        timeout 100 bin/big_mlp --precision $precision --no-offload --steps 10 > "$log/${precision}_memory.log" 2>&1
        r3=$?
        row "big_mlp $precision 2G offloaded (auto) vs memory" \
            "$(compare "$log/${precision}_offload.log" "$log/${precision}_memory.log") (exit $r1, $r3)"
        row "big_mlp $precision 2G offloaded (backward) vs memory" \
            "$(compare "$log/${precision}_backward.log" "$log/${precision}_memory.log") (exit $r2)"
    done
    UMT_DEVICE_BUDGET=2G timeout 100 bin/big_mlp --precision bf16 --steps 10 --bf16-gradients-home \
        > "$log/bf16_bf16_gradients.log" 2>&1
    rc=$?
    row "big_mlp bf16 2G --bf16-gradients-home vs memory" \
        "$(compare "$log/bf16_bf16_gradients.log" "$log/bf16_memory.log") (exit $rc)"
    grep -h '^offload:' "$log/fp16_backward.log" | head -n 2
    UMT_DEVICE_BUDGET=2G timeout 100 bin/big_mlp --precision bf16 --steps 10 --batch 256 --grad-accum 2 \
        > "$log/bf16_accum.log" 2>&1
    rc=$?
    row "big_mlp bf16 2G: 2 x 256 micro-batches vs 512" "$(compare "$log/bf16_accum.log" "$log/bf16_offload.log") (exit $rc)"
    UMT_DEVICE_BUDGET=2G timeout 100 bin/big_mlp --steps 10 > "$log/fp32_offload.log" 2>&1
    for precision in fp32 bf16; do
        UMT_DEVICE_BUDGET=2G timeout 100 bin/big_mlp --precision $precision --steps 10 --dist on \
            > "$log/${precision}_dist.log" 2>&1
        rc=$?
        row "big_mlp $precision 2G --dist on vs off (1 rank)" \
            "$(compare "$log/${precision}_dist.log" "$log/${precision}_offload.log") (exit $rc)"
    done
    for batch in 512 2048; do
        local mem="$log/bench_memory_bf16_$batch.log" off="$log/bench_offload_bf16_$batch.log" extra=""
        local step_ms memory_ms link_ms update_ms
        timeout 100 bin/big_mlp --precision bf16 --no-offload --bench 4 --batch $batch > "$mem" 2>&1
        UMT_DEVICE_BUDGET=2G timeout 100 bin/big_mlp --precision bf16 --bench 4 --batch $batch > "$off" 2>&1
        if ! grep -q '^bench: step' "$off"; then # saved activations past what 2G leaves: they go out too
            extra=" --offload-activations"
            UMT_DEVICE_BUDGET=2G timeout 100 bin/big_mlp --precision bf16 --bench 4 --batch $batch $extra > "$off" 2>&1
        fi
        grep -E '^bench' "$off"
        step_ms=$(grep '^bench: step' "$off" | awk '{print $3}')
        memory_ms=$(grep '^bench: step' "$mem" | awk '{print $3}')
        link_ms=$(grep -o 'link-bound floor [0-9.]*' "$off" | awk '{print $3}')
        # After backward (auto) the update is timed both ways; in backward (big_mlp's default) it
        # runs beside the link, and the CPU threads' count is what the search kept.
        update_ms=$(grep -o 'gpu streamed [0-9.]* ms, cpu threads [0-9.]*' "$off" | awk '{print ($3 < $7 ? $3 : $7)}')
        [[ -z $update_ms ]] && update_ms=$(sed -n 's/^bench: update term: .*: \([0-9.]*\) ms$/\1/p' "$off")
        grep -h '^offload: streamed parameters updated by CPU threads' "$off"
        row "big_mlp bf16 -b $batch 2G$extra: step" "${step_ms:-?} ms offloaded, ${memory_ms:-?} ms in memory ($(
            awk -v a="${step_ms:-0}" -v b="${memory_ms:-0}" 'BEGIN {printf "%.2fx", (b > 0 ? a / b : 0)}'))"
        row "  floor terms" "in-memory step ${memory_ms:-?} ms, link bytes ${link_ms:-?} ms, update ${update_ms:-?} ms"
        row "  floor / step" "$(awk -v s="${step_ms:-0}" -v m="${memory_ms:-0}" -v l="${link_ms:-0}" -v u="${update_ms:-0}" \
            'BEGIN {f = m; if (l > f) f = l; if (u > f) f = u; printf "%.2f (floor %.1f ms)", (s > 0 ? f / s : 0), f}')"
        # The host's memory, which the CPU's update and the link share: the least time their rates
        # alone and at once leave for the step's work (big_mlp's bench, umt_offload_host_memory_measure).
        local least
        least=$(sed -n 's/^bench: .*take at least \([0-9.]*\) ms = \([0-9.]*\) of the step.*is \([0-9.]*\) of that$/\1 ms = \2 of the step; the link-and-update floor is \3 of it/p' "$off")
        [[ -n $least ]] && row "  least time, host memory shared" "$least"
    done
}
if [[ ${1:-} == lowp ]]; then
    lowp_section
    echo
    echo "== summary ($(head -n 1 "$logs/gpu.txt")) =="
    printf '%s\n' "${rows[@]}"
    exit 0
fi

# run_all.sh has run every GPU test already: it sets OFFLOAD_TESTS=0.
for t in $([[ ${OFFLOAD_TESTS:-1} == 0 ]] || echo test_cuda_offload test_cuda_memory); do
    timeout 150 bin/$t > "$logs/$t.log" 2>&1
    rc=$?
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$logs/$t.log" | tail -n 1)
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$logs/$t.log" | tail -n 1)
    [[ $rc -ne 0 ]] && tail -n 40 "$logs/$t.log"
    row "$t" "${p:-0} passed, ${f:-$([[ $rc -eq 0 ]] && echo 0 || echo 1)} failed (exit $rc)"
done
[[ -e $logs/test_cuda_offload.log ]] && grep -E 'relative|measured' "$logs/test_cuda_offload.log" | head -n 12

# Ten steps offloaded (auto updates, with the trace; updates in backward) and in GPU memory.
UMT_DEVICE_BUDGET=2G UMT_MEM_TRACE="$logs/big_mlp_trace.json" UMT_MEM_REPORT=1 timeout 100 bin/big_mlp --steps 10 \
    > "$logs/big_mlp_offload.log" 2>&1
rc1=$?
UMT_DEVICE_BUDGET=2G timeout 100 bin/big_mlp --steps 10 --update-on backward > "$logs/big_mlp_offload_backward.log" 2>&1
rc3=$?
UMT_MEM_REPORT=1 timeout 100 bin/big_mlp --no-offload --steps 10 > "$logs/big_mlp_memory.log" 2>&1
rc2=$?
cat "$logs/big_mlp_offload.log"
grep '^step' "$logs/big_mlp_offload_backward.log"
tail -n 14 "$logs/big_mlp_memory.log"
row "big_mlp 10 steps: 2G offloaded (auto) vs in memory" "$(compare "$logs/big_mlp_offload.log" "$logs/big_mlp_memory.log") (exit $rc1, $rc2)"
row "big_mlp 10 steps: 2G offloaded (backward) vs memory" "$(compare "$logs/big_mlp_offload_backward.log" "$logs/big_mlp_memory.log") (exit $rc3)"
row "big_mlp losses offloaded (first, last)" "$(grep '^step' "$logs/big_mlp_offload.log" | sed -n '1p;$p' | awk '{print $4}' | tr '\n' ' ')"
python3 mem_trace_svg.py "$logs/big_mlp_trace.json" --step 5 -o "$logs/big_mlp_memory.svg" > "$logs/svg.log" 2>&1
row "mem_trace_svg.py (step 5)" "$(tail -n 1 "$logs/svg.log")"

# Saved activations offloaded too: at batch 2048 big_mlp's activations (2.1 GiB) alone pass what a
# 2G budget leaves (without the flag the plan is refused); with it, the same losses as in memory.
UMT_DEVICE_BUDGET=2G timeout 60 bin/big_mlp --batch 2048 --steps 1 > "$logs/big_mlp_2048_refused.log" 2>&1
row "big_mlp b2048 2G, activations in memory" "exit $? ($(grep -o 'placement plan: even' "$logs/big_mlp_2048_refused.log"))"
UMT_DEVICE_BUDGET=2G UMT_MEM_TRACE="$logs/big_mlp_act_trace.json" timeout 100 bin/big_mlp --batch 2048 --steps 10 \
    --offload-activations > "$logs/big_mlp_act.log" 2>&1
rc4=$?
timeout 100 bin/big_mlp --batch 2048 --no-offload --steps 10 > "$logs/big_mlp_memory_2048.log" 2>&1
rc5=$?
grep 'placement plan' "$logs/big_mlp_act.log"
row "big_mlp b2048 10 steps 2G, activations out vs memory" "$(compare "$logs/big_mlp_act.log" "$logs/big_mlp_memory_2048.log") (exit $rc4, $rc5)"
python3 trace_phases.py "$logs/big_mlp_act_trace.json" > "$logs/phases_act.txt" 2>&1
row "trace_phases.py (b2048, activations out), step 5" "$(grep '^step 5' "$logs/phases_act.txt" | cut -d';' -f1,5,6)"

# Refusals print the pools, largest first: a plan that cannot fit 1G (the offload tier holds the
# model), and a plain run past the same budget (the weights pool refuses a layer).
for run in "offload" "no-offload"; do
    log="$logs/refusal_1G_$run.log"
    flag=""
    [[ $run == no-offload ]] && flag="--no-offload"
    UMT_DEVICE_BUDGET=1G timeout 60 bin/big_mlp --steps 1 $flag > "$log" 2>&1
    rc=$?
    echo "== UMT_DEVICE_BUDGET=1G big_mlp --steps 1 $flag (exit $rc) =="
    grep -A12 'pools, largest first' "$log" | head -n 14
    grep 'big_mlp:' "$log" | tail -n 1
    row "1G big_mlp $flag: refused, pools printed" "$(grep -A1 'pools, largest first' "$log" | tail -n 1 | awk '{print "largest:", $1, $3, "bytes"}') (exit $rc)"
done

# The CPU threads' update kernel on this host (bench/cpu_update): what `auto` weighs against the GPU.
row "cpu_update (adam, 16 M elements, all cores)" "$(bin/cpu_update 16 3 | tail -n 1 | sed 's/.*elements, //')"

# The benchmark: offloaded at 2G (batch 512: the first step's activations fill the rest) and at 4G
# (batch 2048), updates in backward (CPU threads beside the ring as measured, and the ring alone)
# and auto (gpu or cpu after backward, both timed), beside GPU memory.
for run in "2G 512 backward auto" "2G 512 backward 0" "2G 512 auto 0" "4G 2048 backward auto" "4G 2048 backward 0" \
           "4G 2048 auto 0"; do
    read -r budget batch where host <<< "$run"
    log="$logs/bench_offload_${budget}_${batch}_${where}_$host.log"
    UMT_DEVICE_BUDGET=$budget timeout 80 bin/big_mlp --bench 4 --batch "$batch" --update-on "$where" \
        --host-updates "$host" > "$log" 2>&1
    grep -E '^bench' "$log"
    label="$where"
    [[ $where == backward ]] && label="backward, cpu $host"
    row "big_mlp -b $batch offloaded ($budget, $label)" "$(grep '^bench: step' "$log" | awk '{print $3, $4}'); $(grep 'floor /' "$log" | sed 's/.*per step //')"
    [[ $where == auto ]] && row "  updates timed" "$(grep 'update measured' "$log" | sed 's/.*measured: //')"
    [[ $host == auto ]] && row "  the CPU's share" "$(grep -o 'the CPU takes.*' "$log")"
done
for where in auto backward; do
    log="$logs/bench_offload_2G_2048_activations_$where.log"
    UMT_DEVICE_BUDGET=2G timeout 80 bin/big_mlp --bench 4 --batch 2048 --update-on "$where" --offload-activations > "$log" 2>&1
    grep -E '^bench' "$log"
    row "big_mlp -b 2048 2G $where, activations offloaded" "$(grep '^bench: step' "$log" | awk '{print $3, $4}'); $(grep 'floor /' "$log" | sed 's/.*per step //')"
    row "  of which activations" "$(grep 'saved activations' "$log" | sed 's/.*activations //')"
done
# A batch large enough that compute should hide the link: 8192 (its activations need the 8G budget).
log="$logs/bench_offload_8G_8192_backward.log"
UMT_DEVICE_BUDGET=8G timeout 80 bin/big_mlp --bench 3 --batch 8192 --update-on backward > "$log" 2>&1
grep -E '^bench' "$log"
row "big_mlp -b 8192 offloaded (8G, backward, cpu auto)" "$(grep '^bench: step' "$log" | awk '{print $3, $4}'); $(grep 'floor /' "$log" | sed 's/.*per step //')"
for batch in 512 2048 8192; do
    log="$logs/bench_memory_$batch.log"
    timeout 80 bin/big_mlp --no-offload --bench 4 --batch "$batch" > "$log" 2>&1
    row "big_mlp --bench 4 -b $batch in GPU memory" "$(grep '^bench: step' "$log" | awk '{print $3, $4}')"
done

lowp_section

echo
echo "== summary ($(head -n 1 "$logs/gpu.txt")) =="
printf '%s\n' "${rows[@]}"
