"""tools/check_layers.py — umtrain's layers, checked on what the build knows.

    python3 tools/check_layers.py deps EDGES      # EDGES: `bazel query --output=graph` of the libraries
    python3 tools/check_layers.py symbols BIN LIBS   # BIN: bazel-bin after building //:umtrain and //dist;
                                                   # LIBS: the libraries in that build (`bazel cquery`)

Each folder's library has a level (LEVELS below, the order of ../shared/DESIGN.md's picture). A
library may depend on libraries of lower levels only, and on the few sideways neighbours ALSO
names. `deps` checks every edge between umtrain's libraries in the dependency graph; `symbols`
checks what the compiled objects call: every function a library's objects leave undefined must
be defined by that library itself, by a library it may depend on, or outside umtrain (libc, CUDA).
An include of a folder a library may not use fails the build already (its header is absent from
the sandbox); a call through the public header does not, and `symbols` catches that.

Each command also checks itself on a planted violation (PLANTED) and fails unless it is caught.
Prints one line per problem and a summary; exits 1 on any problem.
"""
import os
import re
import subprocess
import sys

# Bottom first. A library may depend on those of a lower level.
LEVELS = {
    "//:api": -1,
    "//core/base:base": 0,
    "//kernels:kernels": 1,
    "//memory:memory": 1,
    "//kernels/cpu:cpu": 2,
    "//kernels/cuda:cuda": 3,
    "//core:core": 4,
    "//core/ops:ops": 5,
    "//core/optim:optim": 5,
    "//core/data:data": 5,
    "//core/step:step": 5,
    "//core/checkpoint:checkpoint": 6,
    "//layers:layers": 6,
    "//offload:offload": 7,
    "//dist:dist": 7,
    "//:umtrain": 8,
}
# Same-level or otherwise notable edges that are allowed: none today (checkpoint sits above optim).
ALSO = set()

# What each check must catch, every time it runs: memory calling into the core's root.
PLANTED_EDGE = ("//memory:memory", "//core:core")
PLANTED_SYMBOL = ("//memory:memory", "umt_tensor_new")


def allowed(frm, to):
    return (frm, to) in ALSO or LEVELS[to] < LEVELS[frm]


def check_edges(edges):
    return [f"{a} depends on {b} (level {LEVELS[a]} on level {LEVELS[b]}: arrows point down only)"
            for a, b in sorted(edges) if not allowed(a, b)]


def graph_edges(text):
    """The edges between umtrain's libraries in `bazel query --output=graph` text."""
    edges = set()
    for a, b in re.findall(r'"([^"]+)"\s*->\s*"([^"]+)"', text):
        for x in a.split("\\n"):
            for y in b.split("\\n"):
                if x in LEVELS and y in LEVELS:
                    edges.add((x, y))
    return edges


def nm(path, undefined):
    """The global symbols an archive's objects define, or leave undefined."""
    flag = "--undefined-only" if undefined else "--defined-only"
    out = subprocess.run(["nm", "-A", "--format=posix", flag, path], capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        fields = line.split()  # "lib.a[member.o]: name type [value size]"
        if len(fields) >= 3 and (fields[2] == "U" if undefined else fields[2] in "TDBRGSVW"):
            names.add(fields[1])
    return names


def archive_of(bin_dir, label):
    package, name = label[2:].split(":")
    path = os.path.join(bin_dir, package, f"lib{name}.pic.a")
    return path if os.path.exists(path) else None


def check_symbols(bin_dir, built, planted=None):
    archives = {label: archive_of(bin_dir, label) for label in LEVELS if label in built}
    archives = {label: path for label, path in archives.items() if path}
    defined = {label: nm(path, False) for label, path in archives.items()}
    owner = {}
    for label, names in defined.items():
        for name in names:
            owner.setdefault(name, label)
    problems = []
    for label, path in sorted(archives.items()):
        needed = nm(path, True) - defined[label]
        if planted and planted[0] == label:
            needed.add(planted[1])
        for name in sorted(needed):
            to = owner.get(name)
            if to and to != label and not allowed(label, to):
                problems.append(f"{label} calls {name} of {to} (level {LEVELS[label]} on level {LEVELS[to]})")
    return problems, len(archives)


def main():
    if len(sys.argv) != (3 if sys.argv[1:2] == ["deps"] else 4) or sys.argv[1] not in ("deps", "symbols"):
        sys.exit(__doc__)
    if sys.argv[1] == "deps":
        edges = graph_edges(open(sys.argv[2]).read())
        problems = check_edges(edges)
        caught = check_edges(edges | {PLANTED_EDGE})
        seen = f"{len(edges)} edges between {len(LEVELS)} libraries"
        count = len(edges)
    else:
        built = {line.split()[0] for line in open(sys.argv[3]) if line.strip()}
        problems, count = check_symbols(sys.argv[2], built)
        caught, _ = check_symbols(sys.argv[2], built, PLANTED_SYMBOL)
        seen = f"the objects of {count} libraries"
    if count == 0:
        problems.append("nothing to check: the graph or the build is empty")
    if len(caught) <= len(problems):
        problems.append(f"the planted violation ({PLANTED_EDGE if sys.argv[1] == 'deps' else PLANTED_SYMBOL}) "
                        "was not caught: the check itself is broken")
    for p in problems:
        print("check_layers:", p)
    print(f"check_layers {sys.argv[1]}: {seen}: {len(problems)} problem(s); a planted upward "
          f"{'dependency' if sys.argv[1] == 'deps' else 'call'} caught")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
