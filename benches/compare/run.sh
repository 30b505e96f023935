#!/usr/bin/env bash
# care vs what Python trainers run today, on the same generated data, in one run.
#
#   bash benches/compare/run.sh [MB]      # MB of JSON Lines per file (default 256)
#
# Makes a venv (.venv-bench, or $VENV) with numpy and pydantic from PyPI and the care_rl package
# of this checkout (pip install ./python, with the maturin that python/pyproject.toml pins),
# builds the release `care` binary and the data generator, writes
# target/care-compare/{validate,score}.jsonl, then runs benches/compare/compare.py, which prints
# a Markdown table with the ratios.
# Extra arguments after MB go to compare.py (e.g. `--only grpo`, `--repeat 5`).
set -euo pipefail
cd "$(dirname "$0")/../.."
MB="${1:-256}"
shift || true
# Absolute: pip runs the build backend (maturin, found on PATH) from another directory.
VENV="$(realpath -m "${VENV:-.venv-bench}")"
DATA="${CARGO_TARGET_DIR:-target}/care-compare"

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
maturin="$(grep -o 'maturin==[0-9.]*' python/pyproject.toml)"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "numpy>=1.26" "pydantic>=2.5" "$maturin"
# care_rl from this checkout: maturin runs cargo (release) in the workspace's target directory.
PATH="$VENV/bin:$PATH" "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    --no-build-isolation --no-deps --force-reinstall ./python

cargo build --release --quiet -p care-cli -p care-benches
GEN="${CARGO_TARGET_DIR:-target}/release/care-bench-gen"
mkdir -p "$DATA"
for kind in validate score; do
    f="$DATA/$kind.jsonl"
    stamp="$DATA/$kind.$MB"
    if [ ! -f "$stamp" ] || [ ! -f "$f" ]; then
        if [ "$kind" = score ]; then
            "$GEN" score-jsonl "$f" "$MB" 6 >&2
        else
            "$GEN" validate-jsonl "$f" "$MB" >&2
        fi
        rm -f "$DATA/$kind".[0-9]*
        touch "$stamp"
    fi
done

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(lscpu | sed -n 's/^Model name: *//p'); $(nproc) cores" >&2
exec "$VENV/bin/python" benches/compare/compare.py --data "$DATA" "$@"
