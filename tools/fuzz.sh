#!/usr/bin/env bash
# tools/fuzz.sh — coverage-guided fuzzing of the readers of untrusted files: IDX files,
# checkpoints and images (tests/fuzz/ has the targets and the rules they check). Each target is
# built for libFuzzer with clang, AddressSanitizer and UBSan, writes its seeds, and runs; a broken
# rule or a memory error stops it and keeps the input.
#
#   tools/fuzz.sh [SECONDS] [TARGET...]   SECONDS per target (default 60); TARGET: idx, checkpoint, image
#
# The corpus grows in fuzz-corpus/<target>/ (git-ignored) from one run to the next. A finding is
# kept as fuzz-corpus/<target>-crash-<hash>: the script ends with status 1, names it and says how
# to replay it. Its fix should come with that file's case in tests/test_idx.c,
# tests/test_checkpoint.c or tests/test_images.c. CI does not fuzz: it runs each target's
# deterministic sweep (//tests/fuzz:test_fuzz_<target>).
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1

seconds="${1:-60}"
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: SECONDS must be a positive whole number, got '$seconds'" >&2; exit 2; }
shift $(($# > 0 ? 1 : 0))
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(idx checkpoint image)
for target in "${targets[@]}"; do
    [[ -f "tests/fuzz/fuzz_$target.c" ]] || { echo "fuzz.sh: no target '$target' (expected idx, checkpoint or image)" >&2; exit 2; }
done

# clang and its libFuzzer runtime (Debian 12: clang 14). 
tools/setup.sh clang libclang-rt-14-dev

# An output base of its own: clang in place of GCC would otherwise throw away the usual build's
# cache, and tools/bazel/fuzz.bazelrc in place of .bazelrc, whose GCC-only flags clang refuses.
fuzz_bazel=(bazel "--output_base=${HOME}/.cache/umtrain-fuzz" --noworkspace_rc --bazelrc=tools/bazel/fuzz.bazelrc)
"${fuzz_bazel[@]}" build --symlink_prefix=/ "${targets[@]/#/\/\/tests\/fuzz:fuzz_}"
bin="$("${fuzz_bazel[@]}" info bazel-bin 2>/dev/null)/tests/fuzz"

status=0
for target in "${targets[@]}"; do
    corpus="fuzz-corpus/$target"
    mkdir -p "$corpus"
    UMT_FUZZ_WRITE_SEEDS="$corpus" "$bin/fuzz_$target"
    echo "== fuzz_$target: $seconds s on $(ls "$corpus" | wc -l) inputs in $corpus =="
    # The log is kept whole in fuzz-corpus/; the terminal gets libFuzzer's progress lines.
    log="fuzz-corpus/$target.log"
    if "$bin/fuzz_$target" "$corpus" -max_total_time="$seconds" -print_final_stats=1 \
        -artifact_prefix="fuzz-corpus/$target-" >"$log" 2>&1; then
        grep -E "^Done|stat::number_of_executed_units|stat::peak_rss" "$log" || true
    else
        status=1
        grep -E "rule broken|ERROR: (AddressSanitizer|libFuzzer)|runtime error|Test unit written" "$log" || tail -n 20 "$log"
        echo "fuzz_$target: FOUND a failing input (log: $log); replay it with: $bin/fuzz_$target <that file>"
    fi
done
exit $status
