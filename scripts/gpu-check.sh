#!/usr/bin/env bash
# GPU check of care-kernels, in two halves:
#
#   scripts/gpu-check.sh prepare [DIR]   on the CPU build machine (Rust, no GPU): builds the
#                                        release test binaries of care-kernels, care-kernels-emu
#                                        and care-ffi (the PTX is embedded) and the release
#                                        libcare.so, strips them and puts them with this script,
#                                        the header, the C/C++ examples, a paper rubric,
#                                        python/care_torch and benches/gpu/compare_torch.py into
#                                        DIR (default target/gpu-check), checked to stay under
#                                        60 MiB.
#   scripts/gpu-check.sh run OUTDIR      on the GPU machine (NVIDIA driver, CUDA tools, PyTorch,
#                                        no Rust), from inside the prepared DIR: runs every
#                                        `gpu_*` test with CARE_REQUIRE_GPU=1 (a missing GPU
#                                        fails), the same tests under compute-sanitizer memcheck,
#                                        racecheck and synccheck, the C and C++ examples against
#                                        libcare.so (their GPU step checks itself against the
#                                        CPU), and benches/gpu/compare_torch.py (JSON rows in
#                                        OUTDIR/compare_torch.json); one log per step and
#                                        summary.txt in OUTDIR. Exit 0 only if every step passed.
#
# CARE_GPU_CASES (default 256 for the plain run, 16 under the sanitizers, which are slow) sets
# how many random cases each GPU property test runs.
set -uo pipefail

cmd="${1:-}"
case "$cmd" in
prepare)
    set -e
    root="$(cd "$(dirname "$0")/.." && pwd)"
    dir="${2:-$root/target/gpu-check}"
    rm -rf "$dir"
    mkdir -p "$dir/bin"
    cd "$root"
    # One JSON line per artifact; keep the test executables of the two kernel crates.
    cargo test --release -p care-kernels -p care-kernels-emu -p care-ffi --no-run --message-format=json \
        | jq -r 'select(.reason == "compiler-artifact" and .executable != null and .profile.test == true)
                 | "\(.target.name) \(.executable)"' \
        | while read -r name exe; do
            cp "$exe" "$dir/bin/$name"
            strip "$dir/bin/$name"
        done
    cp "$root/scripts/gpu-check.sh" "$dir/gpu-check.sh"
    # libcare for the examples and the PyTorch benchmark, with what they need around it, in the
    # repository's layout (compare_torch.py finds python/ relative to itself).
    cargo build --release -p libcare
    mkdir -p "$dir/lib" "$dir/include" "$dir/examples" "$dir/python" "$dir/benches/gpu"
    cp "$root/target/release/libcare.so" "$dir/lib/" && strip "$dir/lib/libcare.so"
    cp "$root/include/care.h" "$dir/include/"
    cp -r "$root/examples/c" "$root/examples/cpp" "$dir/examples/"
    cp "$root/cli/data/rubric_sft_1.json" "$dir/"
    cp -r "$root/python/care_torch" "$dir/python/"
    find "$dir/python" -name __pycache__ -prune -exec rm -rf {} +
    cp "$root/benches/gpu/compare_torch.py" "$dir/benches/gpu/"
    git -C "$root" rev-parse HEAD > "$dir/COMMIT" 2>/dev/null || true
    size=$(du -sb "$dir" | cut -f1)
    echo "gpu-check: prepared $dir ($((size / 1024 / 1024)) MiB): $(ls "$dir/bin" | tr '\n' ' ')"
    glibc=$(objdump -T "$dir"/bin/* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1)
    echo "gpu-check: the binaries need ${glibc:-an unknown glibc} or newer and libstdc++ on the GPU machine"
    if [ "$size" -gt $((60 * 1024 * 1024)) ]; then
        echo "gpu-check: $dir is over 60 MiB" >&2
        exit 1
    fi
    ;;
run)
    out="${2:?usage: gpu-check.sh run OUTDIR}"
    here="$(cd "$(dirname "$0")" && pwd)"
    mkdir -p "$out"
    out="$(cd "$out" && pwd)"
    summary="$out/summary.txt"
    : > "$summary"
    for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do
        [ -x "$d/compute-sanitizer" ] && PATH="$PATH:$d"
    done
    export PATH
    {
        echo "gpu-check $(cat "$here/COMMIT" 2>/dev/null || echo unknown-commit) on $(hostname) at $(date -u +%FT%TZ)"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
        compute-sanitizer --version 2>&1 | tail -n 1 | sed 's/^/compute-sanitizer: /'
    } >> "$summary"
    failed=0
    step() { # name, log, command...
        local name="$1" log="$2"
        shift 2
        local start=$SECONDS
        "$@" > "$out/$log" 2>&1
        local rc=$?
        local verdict=PASS
        [ $rc -eq 0 ] || { verdict="FAIL (exit $rc)"; failed=1; }
        printf '%-44s %-16s %4ss  %s\n' "$name" "$verdict" "$((SECONDS - start))" "$log" >> "$summary"
    }
    export CARE_REQUIRE_GPU=1
    for bin in "$here"/bin/*; do
        name="$(basename "$bin")"
        # Only binaries that have GPU tests (the list filter prints "N tests").
        if ! "$bin" gpu_ --list 2>/dev/null | grep -q ': test'; then
            continue
        fi
        CARE_GPU_CASES="${CARE_GPU_CASES:-256}" \
            step "$name: gpu tests" "$name.gpu.log" "$bin" gpu_ --test-threads=1 --nocapture
        for tool in memcheck racecheck synccheck; do
            CARE_GPU_CASES="${CARE_GPU_CASES_SANITIZER:-16}" \
                step "$name: compute-sanitizer $tool" "$name.$tool.log" \
                compute-sanitizer --tool "$tool" --error-exitcode 1 --print-limit 50 \
                "$bin" gpu_ --test-threads=1
        done
    done
    # The examples on the GPU path (they compare the GPU step with the CPU and fail on a
    # mismatch), built here against the shared libcare; no sanitizers (ASan and the CUDA driver
    # need special settings).
    mkdir -p "$out/examples"
    step "C example: build" "example_c.build.log" \
        cc -std=c11 -O1 -Wall -Wextra -I"$here/include" "$here/examples/c/grpo_step.c" \
        -L"$here/lib" -lcare -ldl -lm -Wl,-rpath,"$here/lib" -o "$out/examples/grpo_step_c"
    step "C example: run (GPU step when present)" "example_c.log" \
        "$out/examples/grpo_step_c" "$here/rubric_sft_1.json"
    step "C++ example: build" "example_cpp.build.log" \
        c++ -std=c++17 -O1 -Wall -Wextra -pthread -I"$here/include" "$here/examples/cpp/grpo_step.cpp" \
        -L"$here/lib" -lcare -ldl -Wl,-rpath,"$here/lib" -o "$out/examples/grpo_step_cpp"
    step "C++ example: run (GPU step when present)" "example_cpp.log" \
        "$out/examples/grpo_step_cpp" "$here/rubric_sft_1.json"
    # care kernels vs torch eager vs torch.compile (issue 8's GPU tables).
    CARE_LIB="$here/lib/libcare.so" step "compare_torch.py (care vs torch)" "compare_torch.log" \
        timeout "${CARE_COMPARE_TIMEOUT:-900}" python3 "$here/benches/gpu/compare_torch.py" \
        --out "$out/compare_torch.json"
    if [ $failed -eq 0 ]; then echo "result: PASS" >> "$summary"; else echo "result: FAIL" >> "$summary"; fi
    cat "$summary"
    exit $failed
    ;;
*)
    sed -n '2,20p' "$0"
    exit 2
    ;;
esac
