#!/usr/bin/env bash
# GPU check of care, in two halves:
#
#   scripts/gpu-check.sh prepare [DIR]   on the CPU build machine (Rust, no GPU): builds the
#                                        release test binaries of care-kernels, care-kernels-emu
#                                        and care-ffi (the PTX is embedded) and the release
#                                        libcare.so, strips them, builds the abi3 wheel of
#                                        care-rl (`pip wheel ./python`, stripped) and fetches the
#                                        pinned pytest wheels, and puts them with this script,
#                                        the header, the C/C++ examples, a paper rubric, the
#                                        care_rl.torch tests and benches/gpu/compare_torch.py
#                                        into DIR (default target/gpu-check), checked to stay
#                                        under 60 MiB.
#   scripts/gpu-check.sh run OUTDIR      on the GPU machine (NVIDIA driver, CUDA tools, Python
#                                        with PyTorch and numpy, no Rust), from inside the
#                                        prepared DIR: installs the care-rl wheel (and pytest)
#                                        with `pip install --no-deps --target OUTDIR/pylib`, runs
#                                        the care_rl.torch tests with CARE_REQUIRE_GPU=1 (their
#                                        CUDA tests once more under compute-sanitizer memcheck),
#                                        every `gpu_*` test of the Rust binaries with
#                                        CARE_REQUIRE_GPU=1 (a missing GPU fails), the same tests
#                                        under compute-sanitizer memcheck, racecheck and synccheck, the
#                                        C and C++ examples against libcare.so (their GPU step
#                                        checks itself against the CPU), and
#                                        benches/gpu/compare_torch.py (JSON rows in
#                                        OUTDIR/compare_torch.json), and, when Nsight Compute's
#                                        ncu is installed, its DRAM bytes, throughput and
#                                        registers per launch of the care kernels
#                                        (OUTDIR/ncu.csv); one log per step and summary.txt in
#                                        OUTDIR. Exit 0 only if every step passed.
#
# CARE_GPU_CASES (default 256 for the plain run, 16 under the sanitizers, which are slow) sets
# how many random cases each GPU property test runs. PYTHON (default python3) is the
# interpreter with PyTorch on the GPU machine, and the one whose pip builds the wheel here
# (default: the CI virtualenv of python/ci.sh, which has the pinned maturin).
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
    # libcare for the C/C++ examples, with what they need around it.
    cargo build --release -p libcare
    mkdir -p "$dir/lib" "$dir/include" "$dir/examples" "$dir/python/tests" "$dir/benches/gpu" \
        "$dir/wheels"
    cp "$root/target/release/libcare.so" "$dir/lib/" && strip "$dir/lib/libcare.so"
    cp "$root/include/care.h" "$root/include/care.hpp" "$dir/include/"
    cp -r "$root/examples/c" "$root/examples/cpp" "$dir/examples/"
    cp "$root/cli/data/rubric_sft_1.json" "$dir/"
    # care_rl: the abi3 wheel (one wheel for every CPython >= 3.9), built by the pinned maturin
    # of the CI virtualenv (python/venv.sh) and stripped; the GPU machine installs it with
    # --no-deps (torch and numpy are its own). pytest's wheels (the version CI pins) come along
    # in case the machine has no pytest: the pure-Python builds (--platform any), since the
    # machine's CPython may differ from this one (tomli also has per-version compiled wheels).
    if [ -n "${PYTHON:-}" ]; then
        py="$PYTHON"
    else
        # shellcheck source=python/venv.sh
        source "$root/python/venv.sh"
        py="$(care_ci_venv)/bin/python"
    fi
    # MATURIN_PEP517_ARGS: what maturin's PEP 517 backend adds to its build (pip has no other
    # way to pass it options). --strip drops the symbol table too (the release profile already
    # leaves out debug info): the wheel carried to the device stays small.
    PATH="$(dirname "$py"):$PATH" MATURIN_PEP517_ARGS="--strip" "$py" -m pip wheel --quiet \
        --no-deps --no-build-isolation -w "$dir/wheels" "$root/python"
    pytest_pin="$(grep -o '^pytest==[0-9.]*' "$root/python/requirements-test.txt")"
    "$py" -m pip download --quiet --only-binary=:all: --platform any --implementation py \
        --no-deps -d "$dir/wheels" \
        "$pytest_pin" iniconfig packaging pluggy pygments exceptiongroup tomli typing_extensions
    # The care_rl.torch tests (they need only conftest.py) and the PyTorch comparison.
    cp "$root/python/tests/conftest.py" "$root/python/tests/test_torch_ops.py" "$dir/python/tests/"
    cp "$root/benches/gpu/compare_torch.py" "$dir/benches/gpu/"
    git -C "$root" rev-parse HEAD > "$dir/COMMIT" 2>/dev/null || true
    size=$(du -sb "$dir" | cut -f1)
    echo "gpu-check: prepared $dir ($((size / 1024 / 1024)) MiB): $(ls "$dir/bin" | tr '\n' ' ')"
    echo "gpu-check: wheels: $(cd "$dir/wheels" && ls | tr '\n' ' ')"
    du -sh "$dir"/* | sed 's|^|gpu-check:   |'

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
    export CARE_REQUIRE_GPU=1 CARE_REQUIRE_TORCH=1
    py="${PYTHON:-python3}"
    # care_rl from the shipped wheel (and pytest, in case the machine has none), next to, not
    # into, the machine's Python: torch and numpy stay the machine's own.
    step "care_rl: pip install --no-deps the wheels" "pip_install.log" \
        "$py" -m pip install --no-deps --no-index --target "$out/pylib" "$here"/wheels/*.whl
    export PYTHONPATH="$out/pylib${PYTHONPATH:+:$PYTHONPATH}"
    step "care_rl.torch: tests (CUDA required)" "care_rl_torch.log" \
        "$py" -m pytest "$here/python/tests/test_torch_ops.py" -rs -p no:cacheprovider
    # The CUDA tests of the ops under memcheck: the kernels on buffers that PyTorch allocated,
    # through the DLPack glue. PYTORCH_NO_CUDA_MEMORY_CACHING gives every tensor its own
    # cudaMalloc, so an access past a tensor is past an allocation; graph capture needs the
    # caching allocator and stays out of this run.
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 step "care_rl.torch: compute-sanitizer memcheck" \
        "care_rl_torch.memcheck.log" \
        compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 50 \
        "$py" -m pytest "$here/python/tests/test_torch_ops.py" -k "cuda and not graph" -rs \
        -p no:cacheprovider
    for bin in "$here"/bin/*; do
        name="$(basename "$bin")"
        # Only binaries that have GPU tests (the list filter prints "N tests"). The list is read
        # whole first: `grep -q` in the pipe would exit at the first match, the binary would
        # die of SIGPIPE writing the rest, and pipefail would then skip a binary that has tests.
        listed="$("$bin" gpu_ --list 2>/dev/null || true)"
        if ! grep -q ': test' <<< "$listed"; then
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
    # care kernels vs torch eager vs torch.compile, through care_rl (the installed wheel).
    step "compare_torch.py (care vs torch)" "compare_torch.log" \
        timeout "${CARE_COMPARE_TIMEOUT:-900}" "$py" "$here/benches/gpu/compare_torch.py" \
        --out "$out/compare_torch.json"
    # Counters per launch of the care kernels (Nsight Compute, when installed): DRAM bytes read
    # and written, DRAM throughput, time and registers per thread, for the bytes model of
    # docs/KERNELS.md and the launch bounds' register budgets. The log-softmax benchmark at its
    # full sizes, two timed runs; the Rust gpu tests print what the driver's JIT made of every
    # entry (care_kernels::cuda::kernel_info) in their own logs.
    if command -v ncu > /dev/null 2>&1; then
        step "ncu: DRAM bytes and registers per launch" "ncu.log" \
            ncu --csv --log-file "$out/ncu.csv" --launch-count 80 \
            --kernel-name 'regex:^(logsoftmax_|logits_loss_|grpo_loss_|group_advantages|whiten_|batch_std)' \
            --metrics dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,launch__registers_per_thread,launch__block_size,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active \
            "$py" "$here/benches/gpu/compare_torch.py" --only logsoftmax --iters 2 --no-compile
    else
        echo "ncu: not found on PATH; no DRAM counters recorded" >> "$summary"
    fi
    if [ $failed -eq 0 ]; then echo "result: PASS" >> "$summary"; else echo "result: FAIL" >> "$summary"; fi
    cat "$summary"
    exit $failed
    ;;
*)
    sed -n '2,/^set -uo pipefail$/p' "$0" | sed '$d'
    exit 2
    ;;
esac
