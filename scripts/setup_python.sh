#!/usr/bin/env bash
# Create (idempotently) the project-local Python venv used by rlf-env's `python` feature (the Gymnasium and
# PettingZoo bridges).
#
# Usage:
#   scripts/setup_python.sh            # create/update .venv, then print the variables to export
#   source scripts/setup_python.sh     # same, and export them into the current shell
#
# The venv lives at <repo>/.venv. It is created with the interpreter that rlf-env links against
# (`python3` on PATH, or $RLFACTORY_PYTHON), which must be built with --enable-shared.
# gymnasium is pinned to the version that recorded crates/rlf-env/tests/data/classic_control_public.jsonl,
# pettingzoo to the one that recorded crates/rlf-env/tests/data/connect_four_public.jsonl.

GYMNASIUM_VERSION="0.29.1"
# gymnasium 0.29.1 predates NumPy 2 (its Acrobot uses `np.float_`, removed in NumPy 2.0).
NUMPY_VERSION="1.26.4"
PETTINGZOO_VERSION="1.24.3"
# PettingZoo's MPE and classic envs import pygame when their module is imported (for rendering), though
# pettingzoo itself does not depend on it; its `mpe` and `classic` extras pin this version (we install
# pygame alone: the `classic` extra would also pull chess, rlcard and OpenSpiel).
PYGAME_VERSION="2.3.0"
# Pixel envs: ALE with its ROMs in the wheel (0.9.0 is the last release for gymnasium 0.29; its envs register when
# `ale_py` is imported), MinAtar and VizDoom. MinAtar's and VizDoom's declared dependencies are left out (--no-deps):
# MinAtar's plotting stack (matplotlib, pandas, seaborn, scipy) is for its own examples, and VizDoom's pygame-ce would
# replace PettingZoo's pygame (both are the `pygame` module); neither is needed to step.
ALE_PY_VERSION="0.9.0"
# `enjoy --save_video` encodes with ffmpeg; this package ships a static one (with libx264), found through the venv.
IMAGEIO_FFMPEG_VERSION="0.8.1"
MINATAR_VERSION="1.0.15"
VIZDOOM_VERSION="1.3.2"

_rlf_setup_python() {
    local script_dir repo_root venv python site_packages pins
    script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)" || return 1
    repo_root="$(cd "${script_dir}/.." && pwd)" || return 1
    venv="${repo_root}/.venv"
    python="${RLFACTORY_PYTHON:-python3}"

    if [ ! -x "${venv}/bin/python" ]; then
        echo "setup_python: creating ${venv} with $(command -v "${python}")" >&2
        "${python}" -m venv "${venv}" || return 1
        # Keep the venv out of git without touching the repository's own ignore file.
        printf '*\n' >"${venv}/.gitignore"
    fi
    pins=("gymnasium==${GYMNASIUM_VERSION}" "numpy==${NUMPY_VERSION}" "pettingzoo==${PETTINGZOO_VERSION}"
        "pygame==${PYGAME_VERSION}" "ale-py==${ALE_PY_VERSION}"
        "imageio-ffmpeg==${IMAGEIO_FFMPEG_VERSION}")
    loose=("MinAtar==${MINATAR_VERSION}" "vizdoom==${VIZDOOM_VERSION}")
    # Installed versions come from the packages' metadata (importing pygame would print its banner); a
    # missing package raises, which fails the check too.
    if ! "${venv}/bin/python" -c "
import sys
from importlib.metadata import version
sys.exit(any(version(name) != wanted for name, wanted in (pin.split('==') for pin in sys.argv[1:])))
" "${pins[@]}" "${loose[@]}" 2>/dev/null; then
        echo "setup_python: installing ${pins[*]} ${loose[*]}" >&2
        "${venv}/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}" || return 1
        "${venv}/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "${loose[@]}" || return 1
    fi
    site_packages="$("${venv}/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
        || return 1
    # MinAtar's Gymnasium plugin imports MinAtar on every `import gymnasium`, which logs warnings about its
    # plotting packages to stderr (a one-line error would become three): the bridge registers MinAtar's envs itself.
    rm -f "${site_packages}"/MinAtar-*.dist-info/entry_points.txt

    RLF_VIRTUAL_ENV="${venv}"
    RLF_PYTHONPATH="${site_packages}"
    RLF_PYO3_PYTHON="$("${python}" -c 'import sys; print(sys.executable)')" || return 1
}

if _rlf_setup_python; then
    if [ "${BASH_SOURCE[0]}" != "$0" ]; then
        export VIRTUAL_ENV="${RLF_VIRTUAL_ENV}"
        export PYTHONPATH="${RLF_PYTHONPATH}${PYTHONPATH:+:${PYTHONPATH}}"
        export PYO3_PYTHON="${RLF_PYO3_PYTHON}"
        echo "setup_python: exported VIRTUAL_ENV, PYTHONPATH, PYO3_PYTHON" >&2
    else
        echo "export VIRTUAL_ENV=\"${RLF_VIRTUAL_ENV}\""
        echo "export PYTHONPATH=\"${RLF_PYTHONPATH}\""
        echo "export PYO3_PYTHON=\"${RLF_PYO3_PYTHON}\""
    fi
    unset RLF_VIRTUAL_ENV RLF_PYTHONPATH RLF_PYO3_PYTHON
else
    echo "setup_python: failed" >&2
    if [ "${BASH_SOURCE[0]}" != "$0" ]; then
        return 1
    fi
    exit 1
fi
