#!/usr/bin/env bash
# tools/test.sh — the one command that runs every CPU test: installs what is missing, runs the
# unit tests, then the bad-input tests again under AddressSanitizer + UBSan, then the layering
# checks (tools/check_layers.sh), and ends with one line "N passed, N failed" counting the test
# cases of every run.
# GPU tests carry the tag "gpu" and are left out here (tools/gpu_run.sh runs them).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
tools/setup.sh || exit 1

passed=0
failed=0

# Adds up the cmocka case counts from the logs of the targets of one bazel run.
count_cases() {
    local logs="$1" targets="$2" target log p f
    for target in $targets; do
        log="$logs/${target#//}"
        log="${log/://}/test.log"
        p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" 2>/dev/null | tail -n 1)
        f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" 2>/dev/null | tail -n 1)
        # A test binary that crashed or never ran reports nothing: count it as one failure.
        if [[ -z "$p" && -z "$f" ]]; then f=1; fi
        passed=$((passed + ${p:-0}))
        failed=$((failed + ${f:-0}))
    done
}

# Runs the tests of //tests/... except those carrying one of the given tags (a regex).
run_suite() {
    local skip="$1"; shift
    local targets
    targets=$(bazel query "tests(//tests/...) except attr(tags, '\\b($skip)\\b', tests(//tests/...))" 2>/dev/null)
    [[ -n "$targets" ]] || { echo "test.sh: no tests left after skipping $skip" >&2; failed=$((failed + 1)); return; }
    echo "== bazel test $* (all but $skip) =="
    # shellcheck disable=SC2086
    bazel test "$@" $targets
    count_cases "$(bazel info "$@" bazel-testlogs 2>/dev/null)" "$targets"
}

# The layering (tools/check_layers.sh): each of its checks counts as one case.
run_layer_checks() {
    echo "== tools/check_layers.sh =="
    local out p f
    out=$(bash tools/check_layers.sh 2>&1)
    echo "$out"
    p=$(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1/p' <<< "$out")
    f=$(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\2/p' <<< "$out")
    [[ -n "$p" ]] || f=1
    passed=$((passed + ${p:-0}))
    failed=$((failed + ${f:-0}))
}

# Every CPU test, then all but the slow ones again under the sanitizers (bad inputs above all),
# then the layering.
run_suite "gpu"
run_suite "gpu|slow" --config=asan
run_layer_checks

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
