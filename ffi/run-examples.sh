#!/usr/bin/env bash
# Builds libcare, the C and C++ examples (static and shared, ASan + UBSan) and checks that each
# prints what the Rust API computes for the same GRPO step (ffi/examples/reference.rs). Lines
# starting with "gpu" depend on the machine and are not compared. The C rollout example
# (examples/c/rollout_step.c) asserts its own numbers instead.
set -euo pipefail
cd "$(dirname "$0")/.."
fixtures="${CARE_FIXTURES:-cli/data}"  # the bundled copies of the paper fixtures
cargo build -q -p libcare
cargo build -q -p care-ffi --example reference
bin="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/debug"
make -s -C examples/c all LIBDIR="$bin"
make -s -C examples/cpp all LIBDIR="$bin"
# protect_shadow_gap=0 lets the CUDA driver map device memory under ASan; the driver's own
# process-lifetime allocations are suppressed in the leak check.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:protect_shadow_gap=0}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/ffi/lsan-suppressions.txt}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for rubric in "$fixtures"/rubric_sft_1.json "$fixtures"/rubric_sft_2.json; do
  "$bin/examples/reference" "$rubric" > "$tmp/want"
  for exe in "$bin"/examples/c/grpo_step_static "$bin"/examples/c/grpo_step_shared \
             "$bin"/examples/cpp/grpo_step_static "$bin"/examples/cpp/grpo_step_shared; do
    "$exe" "$rubric" > "$tmp/got"
    if ! diff -u "$tmp/want" <(grep -v '^gpu' "$tmp/got"); then
      echo "run-examples: $exe $rubric differs from the Rust API" >&2
      exit 1
    fi
    grep '^gpu' "$tmp/got" | sed "s|^|  $(basename "$(dirname "$exe")")/$(basename "$exe"): |"
  done
done
# The rollout example checks its own numbers against the formulas and exits 1 on a mismatch.
for exe in "$bin"/examples/c/rollout_step_static "$bin"/examples/c/rollout_step_shared; do
  "$exe" | sed "s|^|  c/$(basename "$exe"): |"
done
echo "run-examples: C and C++ examples match the Rust API and their own checks (static and shared, ASan + UBSan)"
