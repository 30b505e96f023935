//! Compiles kernels/cuda/*.cu as host C++ against the fiber emulator (csrc/cuda_emu.h).

fn main() {
    for p in [
        "csrc/cuda_emu.h",
        "csrc/launch.cpp",
        "csrc/selftest.cpp",
        "../cuda/common.cuh",
        "../cuda/advantages.cu",
        "../cuda/grpo_loss.cu",
        "csrc/logsoftmax.cpp",
        "../cuda/logsoftmax.cu",
        "csrc/returns.cpp",
        "../cuda/returns.cu",
    ] {
        println!("cargo:rerun-if-changed={p}");
    }
    // CARE_EMU_UBSAN=1: build the emulated kernels with UBSan (shift, overflow, float-cast and
    // alignment checks that abort on the first report), a manual check of the kernel C++.
    println!("cargo:rerun-if-env-changed=CARE_EMU_UBSAN");
    let ubsan = std::env::var("CARE_EMU_UBSAN").is_ok_and(|v| v == "1");
    let mut build = cc::Build::new();
    if ubsan {
        build
            .flag("-fsanitize=undefined,float-cast-overflow")
            .flag("-fno-sanitize-recover=all");
        println!("cargo:rustc-link-lib=ubsan");
    }
    build
        .cpp(true)
        .std("c++17")
        .file("csrc/launch.cpp")
        .file("csrc/selftest.cpp")
        .file("csrc/logsoftmax.cpp")
        .file("csrc/returns.cpp")
        // logsoftmax.cu reads 16-byte vectors through a cast of the element pointer, as CUDA
        // code does; the host compiler must not use type-based alias analysis on that.
        .flag_if_supported("-fno-strict-aliasing")
        // The kernels' float semantics must match the device: no fast-math, no contraction
        // into FMA that the host CPU might do differently from the GPU in the tests' margins.
        .flag_if_supported("-ffp-contract=off")
        .flag_if_supported("-fno-fast-math")
        .warnings(true)
        // Optimized even in debug test builds: the fiber scheduler runs millions of switches.
        .opt_level(2)
        .compile("care_kernels_emu");
}
