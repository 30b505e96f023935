#!/usr/bin/env bash
# The Python step of CI: a cached virtualenv outside the clone with the pinned test
# requirements, `pip install ./python` into it (cargo builds the extension), then the whole
# suite. A run in which the torch tests are skipped fails (CARE_REQUIRE_TORCH=1).
#
#   bash python/ci.sh            from the repository root
#
# The virtualenv: python/venv.sh (path, cache key and atomic build in one place).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=python/venv.sh
source python/venv.sh
t0=$(date +%s)
venv="$(care_ci_venv)"
t1=$(date +%s)
# --no-build-isolation: maturin comes from the pinned requirements instead of a fresh
# download per run; the release build reuses the workspace's target directory.
# The maturin backend runs the `maturin` binary from PATH.
PATH="$venv/bin:$PATH" "$venv/bin/python" -m pip install --quiet --no-build-isolation --no-deps --force-reinstall ./python
t2=$(date +%s)
echo "python/ci.sh: venv ready in $((t1 - t0)) s, care-rl built and installed in $((t2 - t1)) s"
# The reward-function and trainer tests (TRL's GRPOTrainer, OpenRLHF's and verl's calling
# conventions) run `care serve` and the stub LLM (the test double, `stub_llm`) as processes.
cargo build -p care-cli --bin care
cargo build -p care-loop --example stub_llm
CARE_REQUIRE_TORCH=1 "$venv/bin/python" -m pytest python/tests -rs -p no:cacheprovider
