# Sourced by python/ci.sh and the scripts that need the CI's Python (the libtorch example):
# defines `care_ci_venv`, which prints the path of the cached test virtualenv (the pinned
# requirements of python/requirements-test.txt, torch included), building it on first use.
#
# The virtualenv lives in ${CARE_CI_CACHE:-$HOME/.cache/care-ci}/venv-py-<hash>, where <hash>
# covers requirements-test.txt and the interpreter version ($PYTHON, default python3); it is
# built in a temporary directory and renamed into place when complete, so an interrupted build
# is never reused. Progress goes to stderr; stdout is the path only.
care_ci_venv() {
    local root py cache key venv tmp
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    py="${PYTHON:-python3}"
    cache="${CARE_CI_CACHE:-$HOME/.cache/care-ci}"
    key="$({ cat "$root/python/requirements-test.txt"; "$py" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)"
    venv="$cache/venv-py-$key"
    if [ ! -x "$venv/bin/python" ]; then
        echo "python/venv.sh: building $venv (cold: torch and its CUDA wheels download, minutes)" >&2
        mkdir -p "$cache"
        tmp="$venv.partial.$$"
        rm -rf "$tmp"
        "$py" -m venv "$tmp" >&2 || { rm -rf "$tmp"; return 1; }
        "$tmp/bin/python" -m pip install --quiet -r "$root/python/requirements-test.txt" >&2 \
            || { rm -rf "$tmp"; return 1; }
        # Everything runs as `python -m ...`, which works from the renamed directory.
        mv "$tmp" "$venv"
    fi
    echo "$venv"
}
