#!/usr/bin/env bash
# Installs what rlf-comm's `mpi` feature needs when it is missing: an MPI with its headers and `mpirun` (Debian's
# OpenMPI) and libclang (rsmpi generates its bindings with bindgen). Idempotent; needs root (or sudo) only when
# something is missing.
# Usage: bash scripts/setup_mpi.sh
set -euo pipefail

have_mpi() {
    command -v mpirun >/dev/null 2>&1 && command -v mpicc >/dev/null 2>&1 &&
        [ -n "$(find /usr/lib /usr/lib64 /usr/local/lib \( -name 'libclang.so*' -o -name 'libclang-[0-9]*.so*' \) \
            -print -quit 2>/dev/null)" ]
}

if have_mpi; then
    exit 0
fi
packages=(libopenmpi-dev openmpi-bin libclang-dev)
sudo=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "setup_mpi: install ${packages[*]} (Debian's names) as root, then run this again" >&2
        exit 1
    fi
    sudo=(sudo)
fi
echo "setup_mpi: installing ${packages[*]} ..." >&2
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${packages[@]}" >/dev/null
have_mpi || { echo "setup_mpi: ${packages[*]} installed, but mpirun, mpicc or libclang is still missing" >&2; exit 1; }
