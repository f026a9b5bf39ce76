#!/usr/bin/env bash
# tools/check_layers.sh — the layering checks, as CI runs them (tools/test.sh): arrows point down
# only (../shared/DESIGN.md, "Layers"; tools/check_layers.py holds the levels).
#   1. the dependency graph between the folders' libraries;
#   2. the calls their compiled objects make (a call through the public header to a higher layer);
#   3. a planted upward include (tests/layering) must fail the build, on that include;
#   4. the bundle: examples/embed.c builds and runs against bazel-bin/libumtrain.a and .so alone.
# Prints one line per check ("check_layers: ok ..." or "check_layers: FAILED ..."), then
# "N passed, N failed"; exits 1 on a failure. Extra arguments go to every bazel command.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
passed=0
failed=0
result() { if [[ $1 -eq 0 ]]; then passed=$((passed + 1)); echo "check_layers: ok: $2"; else failed=$((failed + 1)); echo "check_layers: FAILED: $2"; fi; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# query (not cquery) sees every branch of every select: the CPU and the CUDA build at once.
bazel query --output=graph 'deps(set(//:umtrain //dist))' > "$work/graph" 2> "$work/query.log"
python3 tools/check_layers.py deps "$work/graph"
result $? "dependency graph"

bazel build "$@" //:umtrain //dist > "$work/build.log" 2>&1 || tail -n 20 "$work/build.log"
bin=$(bazel info "$@" bazel-bin 2> /dev/null)
bazel cquery "$@" 'kind(cc_library, deps(set(//:umtrain //dist)))' > "$work/libraries" 2> "$work/cquery.log"
python3 tools/check_layers.py symbols "$bin" "$work/libraries"
result $? "calls between the libraries' objects"

if bazel build "$@" //tests/layering:memory_includes_core > "$work/planted.log" 2>&1; then
    result 1 "a planted upward include (tests/layering) built"
else
    grep -q 'core/tensor.h' "$work/planted.log"
    result $? "a planted upward include (tests/layering) fails the build: $(grep -m1 -o 'core/tensor.h: No such file or directory' "$work/planted.log")"
fi

libs="-lz -lm -lpthread"
# A CUDA build's bundle needs the CUDA libraries and the C++ runtime of its nvcc objects too.
if nm "$bin/libumtrain.a" 2> /dev/null | grep ' U cudaMalloc' > /dev/null; then
    libs="$libs -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcudnn -lcublas -lcudart -lstdc++"
fi
gcc -std=c11 -Iinclude examples/embed.c "$bin/libumtrain.a" $libs -o "$work/embed_static" 2> "$work/embed.log" &&
    "$work/embed_static" > "$work/static.out" &&
    gcc -std=c11 -Iinclude examples/embed.c -L"$bin" -lumtrain $libs -Wl,-rpath,"$bin" -o "$work/embed_shared" &&
    "$work/embed_shared" > "$work/shared.out" && grep -q 'y = 3.000 x -1.000' "$work/static.out" &&
    cmp -s "$work/static.out" "$work/shared.out"
result $? "examples/embed.c against libumtrain.a and libumtrain.so: $(cat "$work/static.out" 2> /dev/null)"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
