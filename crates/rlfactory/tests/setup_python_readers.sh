#!/usr/bin/env bash
# Ensure the project venv has the independent readers tests/suite/experiment.rs checks our files with: TensorBoard's event
# reader (via rlf-experiment's setup script) and the `safetensors` package. Idempotent; prints the venv's python.
set -euo pipefail

SAFETENSORS_VERSION="0.8.0"

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "${script_dir}/../../.." && pwd)"
python="$(bash "${repo_root}/crates/rlf-experiment/tests/setup_tensorboard.sh")"
if ! "${python}" -c "import sys, safetensors; sys.exit(safetensors.__version__ != '${SAFETENSORS_VERSION}')" 2>/dev/null; then
    echo "setup_python_readers: installing safetensors==${SAFETENSORS_VERSION} into ${repo_root}/.venv" >&2
    "${python}" -m pip install --quiet --disable-pip-version-check "safetensors==${SAFETENSORS_VERSION}" >&2
fi
echo "${python}"
