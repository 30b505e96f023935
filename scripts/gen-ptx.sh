#!/usr/bin/env bash
# Regenerate (no argument), check (--check) or assemble (--ptxas) the checked-in PTX of care-kernels.
# Installs the pinned NVRTC and ptxas wheels into the gitignored .venv-ptx on first use, so it works
# on a fresh machine with Python 3 and PyPI access; no CUDA toolkit or GPU is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${CARE_PTX_VENV:-.venv-ptx}"
PINS=(nvidia-cuda-nvrtc-cu12==12.2.140 nvidia-cuda-nvcc-cu12==12.2.140)
if ! "$VENV/bin/python" -c 'import nvidia.cuda_nvrtc, nvidia.cuda_nvcc' 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "${PINS[@]}"
fi
exec "$VENV/bin/python" scripts/gen-ptx.py "$@"
