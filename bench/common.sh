# shellcheck shell=bash
# bench/common.sh — what the bundle's GPU benchmarks share (bench/speed.sh, bench/graph_speed.sh),
# sourced from the bundle's bench/: the bundle's folder, its libraries on the loader's path, and
# the timed steps per batch size.
bundle="$(dirname "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)")"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# About a second of timed work per batch size; given a scale (STEPS_SCALE), that many times
# as much, and at least 20 steps.
steps_for() {
    local steps
    case $1 in 64) steps=1000 ;; 512) steps=400 ;; *) steps=100 ;; esac
    if [[ -z ${2:-} ]]; then echo "$steps"; return; fi
    python3 -c "print(max(20, int($steps * $2)))"
}
