#!/usr/bin/env bash
# Fuzz smoke run (CI): every cargo-fuzz target for N seconds (default 30), starting from the
# committed seeds in fuzz/seeds/<target> (copies of the paper fixtures and CLI test lines) and
# growing the gitignored corpus in fuzz/corpus/<target>. Any crash, panic, leak, input slower
# than 10 s or over 2 GB fails the run; the reproducer lands in fuzz/artifacts/<target>/.
#
# usage: bash fuzz/smoke.sh [seconds] [target...]
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-30}"
shift || true
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
cargo +nightly fuzz build
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo +nightly fuzz list)
fi
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  echo "--- fuzz $t for ${secs}s"
  log="$(mktemp)"
  rc=0
  cargo +nightly fuzz run "$t" "corpus/$t" "seeds/$t" -- \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1 || rc=$?
  # libFuzzer's progress lines are noise in a CI log: keep the summary, or the tail on failure.
  grep -E '^(Done|stat::number_of_executed_units)' "$log" || true
  if [ "$rc" -ne 0 ]; then
    tail -60 "$log"
    echo "fuzz target $t failed (exit $rc); reproducer in fuzz/artifacts/$t/" >&2
    exit 1
  fi
  rm -f "$log"
done
