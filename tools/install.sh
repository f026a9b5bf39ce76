#!/usr/bin/env bash
# tools/install.sh PREFIX [--cuda] [BAZEL FLAGS...] — builds umtrain with Bazel and installs it for
# programs built outside Bazel:
#
#   PREFIX/include/umtrain.h              the public API (include/umtrain.h)
#   PREFIX/include/umt_dist.h             data parallelism's (dist/umt_dist.h)
#   PREFIX/lib/libumtrain.a, libumtrain.so   the whole framework, data parallelism included, in one
#                                         archive and one shared library (//:install_archive, //:install_shared)
#   PREFIX/lib/pkgconfig/umtrain.pc       its flags, for pkg-config
#
# The default build is the CPU one; --cuda builds with --config=cuda (nvcc and the libraries of
# /usr/local/cuda), so the libraries also call cudart, cuBLAS, cuDNN and NCCL. umtrain.pc's Libs are
# what this build links, read from the shared library just built (the libraries it needs, and
# where the CUDA ones live), so they match it: a CPU build's are zlib and libm, a CUDA build's add
# the CUDA libraries and the C++ runtime. Then, from anywhere:
#
#   PKG_CONFIG_PATH=PREFIX/lib/pkgconfig cc embed.c $(pkg-config --cflags --libs umtrain)
#
# links against libumtrain.so (found at run time through the rpath in Libs). Extra arguments go to
# bazel build. Prints what it installed; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: tools/install.sh PREFIX [--cuda] [BAZEL FLAGS...]" >&2; exit 2; }
[[ $# -ge 1 && $1 != -* ]] || usage
mkdir -p "$1"
prefix="$(cd "$1" && pwd)"
shift
flags=()
build="CPU"
for arg in "$@"; do
    if [[ $arg == --cuda ]]; then flags+=(--config=cuda); build="CUDA"; else flags+=("$arg"); fi
done

bazel build "${flags[@]}" //:install_archive //:install_shared
bin="$(bazel info "${flags[@]}" bazel-bin 2> /dev/null)"
mkdir -p "$prefix/include" "$prefix/lib/pkgconfig"
install -m 644 include/umtrain.h dist/umt_dist.h "$prefix/include/"
install -m 644 "$bin/install/libumtrain.a" "$prefix/lib/"
install -m 755 "$bin/install/libumtrain.so" "$prefix/lib/"

# The libraries the shared library needs (all but libc and the loader), and the folders its rpath
# names (where the CUDA libraries live): the link line of this build.
so="$prefix/lib/libumtrain.so"
needed=$(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[lib\([^].]*\)\.so.*/\1/p' | { grep -v -x -e c -e ld-linux-x86-64 || true; } |
         sed 's/^/-l/' | tr '\n' ' ')
folders=$(readelf -d "$so" | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]/\2/p' | tr ':' '\n' | sed '/^$/d' |
          sed 's/.*/-L& -Wl,-rpath,&/' | tr '\n' ' ')
version="0.0.0"
commit=$(git rev-parse --short HEAD 2> /dev/null || true)
[[ -n $commit ]] && version="0.0.0+git.$commit"
cat > "$prefix/lib/pkgconfig/umtrain.pc" << EOF
# umtrain, installed by tools/install.sh: the $build build.
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: umtrain
Description: A minimal deep-learning training framework in C ($build build)
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lumtrain ${folders}${needed% }
EOF
echo "install.sh: the $build build of umtrain into $prefix:"
echo "  include/umtrain.h include/umt_dist.h lib/libumtrain.a lib/libumtrain.so lib/pkgconfig/umtrain.pc"
echo "  Libs: $(sed -n 's/^Libs: //p' "$prefix/lib/pkgconfig/umtrain.pc")"
echo "  PKG_CONFIG_PATH=$prefix/lib/pkgconfig cc embed.c \$(pkg-config --cflags --libs umtrain)"
