#!/usr/bin/env bash
# Ensure the project venv (<repo>/.venv, made by scripts/setup_python.sh) has TensorBoard, whose event-file reader
# checks our own TensorBoard writer in tests/suite/summary_tensorboard.rs. Idempotent; prints the venv's python on
# success.
set -euo pipefail

TENSORBOARD_VERSION="2.20.0"

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "${script_dir}/../../.." && pwd)"
python="${repo_root}/.venv/bin/python"

if [ ! -x "${python}" ]; then
    bash "${repo_root}/scripts/setup_python.sh" >/dev/null
fi
if ! "${python}" -c "import sys, tensorboard; sys.exit(tensorboard.__version__ != '${TENSORBOARD_VERSION}')" \
    2>/dev/null; then
    echo "setup_tensorboard: installing tensorboard==${TENSORBOARD_VERSION} into ${repo_root}/.venv" >&2
    "${python}" -m pip install --quiet --disable-pip-version-check "tensorboard==${TENSORBOARD_VERSION}" >&2
fi
echo "${python}"
