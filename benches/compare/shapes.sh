#!/usr/bin/env bash
# `care validate` / `care score` end to end on each command-line input shape vs the Python
# baselines, in one run (one Markdown table: MB/s, speed-ups, 2-thread scaling, peak RSS).
#
#   bash benches/compare/shapes.sh [MB] [shapes.py args]   # MB per file (default 64)
#
# e.g. `bash benches/compare/shapes.sh 256 --shapes text --no-python` for the scaling check.
# Shapes: care_benches::SHAPES (benches/src/lib.rs). Files go to target/care-compare/.
set -euo pipefail
cd "$(dirname "$0")/../.."
MB="${1:-64}"
shift || true
# Absolute: pip runs the build backend (maturin, found on PATH) from another directory.
VENV="$(realpath -m "${VENV:-.venv-bench}")"
DATA="${CARGO_TARGET_DIR:-target}/care-compare"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -c 'import pydantic' 2>/dev/null ||
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "pydantic>=2.5"
cargo build --release --quiet -p care-cli -p care-benches --bin care --bin care-bench-gen
GEN="${CARGO_TARGET_DIR:-target}/release/care-bench-gen"
mkdir -p "$DATA"
for shape in objects text pretty mixed30 score-scores score-judge score-group8; do
    f="$DATA/shape-$shape.jsonl"
    if [ ! -f "$DATA/shape-$shape.$MB" ] || [ ! -f "$f" ]; then
        "$GEN" shape "$f" "$MB" "$shape" >&2
        rm -f "$DATA/shape-$shape".[0-9]*
        touch "$DATA/shape-$shape.$MB"
    fi
done
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(lscpu | sed -n 's/^Model name: *//p'); $(nproc) cores; $(git rev-parse --short HEAD)" >&2
exec "$VENV/bin/python" benches/compare/shapes.py --data "$DATA" "$@"
