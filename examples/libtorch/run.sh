#!/usr/bin/env bash
# Builds the libtorch GRPO trainer (examples/libtorch/grpo_trainer.cpp) against the C++
# headers and libraries inside a PyTorch pip package and libcare.a, then trains it on the CPU;
# the trainer exits non-zero unless the mean reward rose.
#
#   bash examples/libtorch/run.sh [steps]
#
# PyTorch: $CARE_TORCH_PYTHON (a python with torch), else the CI virtualenv that python/ci.sh
# builds (python/venv.sh: same path, built on first use). The compile flags follow the package:
# its include and lib directories, the _GLIBCXX_USE_CXX11_ABI it was built with, and C++20
# (which PyTorch's headers require since 2.10).
set -euo pipefail
cd "$(dirname "$0")/../.."
steps="${1:-300}"
if [ -n "${CARE_TORCH_PYTHON:-}" ]; then
    py="$CARE_TORCH_PYTHON"
else
    # shellcheck source=python/venv.sh
    source python/venv.sh
    py="$(care_ci_venv)/bin/python"
fi
eval "$("$py" - <<'EOF'
import os, shlex, torch
root = os.path.dirname(torch.__file__)
print("torch_inc=" + shlex.quote(os.path.join(root, "include")))
print("torch_lib=" + shlex.quote(os.path.join(root, "lib")))
print("cxx11_abi=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI))
print("torch_version=" + shlex.quote(torch.__version__))
EOF
)"
cargo build -q -p libcare
target="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)"
out="$target/debug/examples/libtorch"
mkdir -p "$out"
exe="$out/grpo_trainer"
# Rebuild only when an input changed (a libtorch translation unit takes a while to compile).
if [ ! -x "$exe" ] || [ -n "$(find examples/libtorch/grpo_trainer.cpp include/care.hpp \
        include/care.h "$target/debug/libcare.a" -newer "$exe" 2>/dev/null)" ] \
        || ! grep -qx "$torch_version $cxx11_abi" "$exe.torch" 2>/dev/null; then
    echo "libtorch: building grpo_trainer against torch $torch_version (CXX11 ABI $cxx11_abi)"
    t0=$(date +%s)
    "${CXX:-c++}" -std=c++20 -O1 -Wall -Wextra -Werror -D_GLIBCXX_USE_CXX11_ABI="$cxx11_abi" \
        -Iinclude -isystem "$torch_inc" -isystem "$torch_inc/torch/csrc/api/include" \
        examples/libtorch/grpo_trainer.cpp \
        "$target/debug/libcare.a" \
        -L"$torch_lib" -Wl,--no-as-needed -ltorch_cpu -lc10 -Wl,--as-needed \
        -Wl,-rpath,"$torch_lib" -lpthread -ldl -lm -lrt -lutil -lgcc_s \
        -o "$exe"
    echo "$torch_version $cxx11_abi" > "$exe.torch"
    echo "libtorch: built in $(($(date +%s) - t0)) s"
fi
t0=$(date +%s)
"$exe" cli/data/rubric_sft_1.json "$steps"
echo "libtorch: trained $steps steps in $(($(date +%s) - t0)) s"
