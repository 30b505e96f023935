#!/usr/bin/env bash
# The Python step of CI: a cached virtualenv outside the clone with the pinned test
# requirements, `pip install ./python` into it (cargo builds the extension), then the whole
# suite. A run in which the torch tests are skipped fails (CARE_REQUIRE_TORCH=1).
#
#   bash python/ci.sh            from the repository root
#
# The virtualenv lives in ${CARE_CI_CACHE:-$HOME/.cache/care-ci}/venv-py-<hash>, where <hash>
# covers requirements-test.txt and the interpreter version; it is built in a temporary
# directory and renamed into place when complete, so an interrupted build is never reused.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
cache="${CARE_CI_CACHE:-$HOME/.cache/care-ci}"
key="$({ cat python/requirements-test.txt; "$py" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)"
venv="$cache/venv-py-$key"
t0=$(date +%s)
if [ ! -x "$venv/bin/python" ]; then
    echo "python/ci.sh: building $venv (cold: torch and its CUDA wheels download, minutes)"
    mkdir -p "$cache"
    tmp="$venv.partial.$$"
    trap 'rm -rf "$tmp"' EXIT
    "$py" -m venv "$tmp"
    "$tmp/bin/python" -m pip install --quiet -r python/requirements-test.txt
    # Everything below runs as `python -m ...`, which works from the renamed directory.
    mv "$tmp" "$venv"
    trap - EXIT
fi
t1=$(date +%s)
# --no-build-isolation: maturin comes from the pinned requirements instead of a fresh
# download per run; the release build reuses the workspace's target directory.
# The maturin backend runs the `maturin` binary from PATH.
PATH="$venv/bin:$PATH" "$venv/bin/python" -m pip install --quiet --no-build-isolation --no-deps --force-reinstall ./python
t2=$(date +%s)
echo "python/ci.sh: venv ready in $((t1 - t0)) s, care-rl built and installed in $((t2 - t1)) s"
CARE_REQUIRE_TORCH=1 "$venv/bin/python" -m pytest python/tests -rs -p no:cacheprovider
