#!/usr/bin/env bash
# Install libtorch (the CPU-only part of the torch==2.13.0 wheel) into <repo>/.libtorch for tch =0.26.0.
#
# Idempotent: does nothing when the pinned version is already there. Prints the environment to use:
#   eval "$(scripts/setup_libtorch.sh)"
# exports LIBTORCH (and LIBTORCH_BYPASS_VERSION_CHECK only if the installed version is not the one tch expects).
# The rlfactory crate's build.rs puts $LIBTORCH/lib and the NVIDIA runtime lib dirs in the binaries' rpath,
# so nothing needs LD_LIBRARY_PATH.
set -euo pipefail

TORCH_VERSION="2.13.0"
CUDA_RUNTIME_VERSION="13.0.96"
CUDA_CUPTI_VERSION="13.0.85"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${RLF_LIBTORCH_DIR:-$repo/.libtorch}"
python="${PYTHON:-python3}"

installed_version() {
    local f="$target/torch/version.py"
    [[ -f "$f" ]] || return 1
    sed -n "s/^__version__ = '\([^'+]*\).*'$/\1/p" "$f"
}

if [[ "$(installed_version || true)" != "$TORCH_VERSION" ]] || [[ ! -f "$target/torch/lib/libtorch_cpu.so" ]]; then
    echo "setup_libtorch: installing torch==$TORCH_VERSION into $target (about 1.2 GB) ..." >&2
    rm -rf "$target.partial"
    "$python" -m pip install --quiet --disable-pip-version-check --no-deps --target "$target.partial" \
        "torch==$TORCH_VERSION" \
        "nvidia-cuda-runtime==$CUDA_RUNTIME_VERSION" \
        "nvidia-cuda-cupti==$CUDA_CUPTI_VERSION" >&2
    rm -rf "$target"
    mv "$target.partial" "$target"
    echo "setup_libtorch: done" >&2
fi

echo "export LIBTORCH=$target/torch"
if [[ "$(installed_version)" != "$TORCH_VERSION" ]]; then
    echo "export LIBTORCH_BYPASS_VERSION_CHECK=1"
fi
