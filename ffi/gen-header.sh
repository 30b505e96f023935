#!/usr/bin/env bash
# Generates include/care.h from ffi/src with the pinned cbindgen (installed on first use into a
# cache directory, outside the repository). `--verify` fails when the committed header differs.
set -euo pipefail
cd "$(dirname "$0")/.."
CBINDGEN_VERSION=0.29.4
tools="${CARE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/care-tools}/cbindgen-$CBINDGEN_VERSION"
cbindgen="$tools/bin/cbindgen"
if ! [ -x "$cbindgen" ] || [ "$("$cbindgen" --version)" != "cbindgen $CBINDGEN_VERSION" ]; then
  cargo install cbindgen --version "=$CBINDGEN_VERSION" --locked --root "$tools"
fi
if [ "${1:-}" = "--verify" ]; then
  "$cbindgen" --config ffi/cbindgen.toml --crate care-ffi --quiet --verify --output include/care.h ffi
else
  "$cbindgen" --config ffi/cbindgen.toml --crate care-ffi --quiet --output include/care.h ffi
fi
