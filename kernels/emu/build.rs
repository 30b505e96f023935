//! Compiles kernels/cuda/*.cu as host C++ against the fiber emulator (csrc/cuda_emu.h).

fn main() {
    for p in [
        "csrc/cuda_emu.h",
        "csrc/launch.cpp",
        "../cuda/common.cuh",
        "../cuda/advantages.cu",
        "../cuda/grpo_loss.cu",
    ] {
        println!("cargo:rerun-if-changed={p}");
    }
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file("csrc/launch.cpp")
        // The kernels' float semantics must match the device: no fast-math, no contraction
        // into FMA that the host CPU might do differently from the GPU in the tests' margins.
        .flag_if_supported("-ffp-contract=off")
        .flag_if_supported("-fno-fast-math")
        .warnings(true)
        // Optimized even in debug test builds: the fiber scheduler runs millions of switches.
        .opt_level(2)
        .compile("care_kernels_emu");
}
