// Helpers shared by the care kernels (advantages.cu, grpo_loss.cu, logsoftmax.cu, returns.cu).
//
// No system headers on purpose: NVRTC compiles these sources without include paths (the CUDA 13
// NVRTC no longer intercepts <cuda_fp16.h>), and the host emulator (kernels/emu/cuda_emu.h)
// compiles the very same text as C++. So the fixed-width types, the bf16/f16 widening and narrowing
// and the reductions are all written here with plain integer and float operations.
#pragma once

typedef unsigned char care_u8;
typedef unsigned short care_u16;
typedef unsigned int care_u32;
typedef int care_i32;
typedef unsigned long long care_u64;

// Storage types of the 16-bit log-prob dtypes. They carry only the bits (the layout of
// `__nv_bfloat16`/`__half` and of Rust's `half::bf16`/`half::f16`); arithmetic is always in float.
struct care_bf16 {
    care_u16 bits;
};
struct care_f16 {
    care_u16 bits;
};

#define CARE_FULL_MASK 0xffffffffu
#define CARE_WARP 32

// ---- dtype widening / narrowing ------------------------------------------------------------

__device__ __forceinline__ float care_bf16_to_f32(care_u16 h) {
    // bf16 is the top half of an f32: widening is exact.
    return __uint_as_float(((care_u32)h) << 16);
}

__device__ __forceinline__ float care_f16_to_f32(care_u16 h) {
    care_u32 sign = ((care_u32)(h & 0x8000u)) << 16;
    care_u32 exp = (h >> 10) & 0x1fu;
    care_u32 mant = h & 0x3ffu;
    if (exp == 0) {
        // Zero or subnormal: mant * 2^-24, exact in f32.
        float v = (float)mant * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 31) {
        // Inf or NaN; the payload is kept (shifted into the f32 mantissa).
        return __uint_as_float(sign | 0x7f800000u | (mant << 13));
    }
    return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

__device__ __forceinline__ care_u16 care_f32_to_bf16(float f) {
    care_u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (care_u16)((u >> 16) | 0x40u); // quiet NaN, keep sign
    }
    // Round to nearest, ties to even.
    u += 0x7fffu + ((u >> 16) & 1u);
    return (care_u16)(u >> 16);
}

__device__ __forceinline__ care_u16 care_f32_to_f16(float f) {
    care_u32 u = __float_as_uint(f);
    care_u32 sign = (u >> 16) & 0x8000u;
    care_u32 a = u & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return (care_u16)(sign | 0x7e00u); // NaN
    }
    if (a >= 0x477ff000u) {
        // |f| >= 65520 rounds to infinity (65504 is the largest finite half).
        return (care_u16)(sign | 0x7c00u);
    }
    if (a < 0x38800000u) {
        // Result is subnormal (or zero): value / 2^-24, rounded to nearest even.
        if (a < 0x33000000u) {
            return (care_u16)sign; // below half of the smallest subnormal: +-0
        }
        care_u32 e = a >> 23;               // biased f32 exponent, 102..112
        care_u32 m = (a & 0x7fffffu) | 0x800000u;
        care_u32 shift = 126u - e;          // so that m >> shift is the subnormal mantissa
        care_u32 q = m >> shift;
        care_u32 rem = m & ((1u << shift) - 1u);
        care_u32 half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) {
            q += 1u;
        }
        return (care_u16)(sign | q);
    }
    // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
    care_u32 r = a - 0x38000000u; // exponent bias 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);
    return (care_u16)(sign | (r >> 13));
}

__device__ __forceinline__ float care_load(const float* p, care_u32 i) { return p[i]; }
__device__ __forceinline__ float care_load(const care_bf16* p, care_u32 i) {
    return care_bf16_to_f32(p[i].bits);
}
__device__ __forceinline__ float care_load(const care_f16* p, care_u32 i) {
    return care_f16_to_f32(p[i].bits);
}

__device__ __forceinline__ void care_store(float* p, care_u32 i, float v) { p[i] = v; }
__device__ __forceinline__ void care_store(care_bf16* p, care_u32 i, float v) {
    p[i].bits = care_f32_to_bf16(v);
}
__device__ __forceinline__ void care_store(care_f16* p, care_u32 i, float v) {
    p[i].bits = care_f32_to_f16(v);
}

// ---- scalar helpers --------------------------------------------------------------------------

// NaN-propagating clamp (fminf/fmaxf would silently replace a NaN by a bound).
__device__ __forceinline__ float care_clamp(float x, float lo, float hi) {
    return x < lo ? lo : (x > hi ? hi : x);
}

__device__ __forceinline__ bool care_isfinite(float x) {
    return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u;
}

__device__ __forceinline__ bool care_isnan(float x) {
    return (__float_as_uint(x) & 0x7fffffffu) > 0x7f800000u;
}

// Narrowing to f32 as the CPU reference does (`care_core::grpo::narrow_f32`): a finite double
// beyond the f32 range saturates at +-FLT_MAX instead of becoming +-inf, so finite inputs give
// finite outputs; +-inf and NaN pass through.
__device__ __forceinline__ float care_narrow(double x) {
    const double f32_max = 3.4028234663852886e38, f64_max = 1.7976931348623157e308;
    if (x > f32_max && x <= f64_max) {
        return 3.40282347e38f;
    }
    if (x < -f32_max && x >= -f64_max) {
        return -3.40282347e38f;
    }
    return (float)x;
}

// For f32 arithmetic on finite inputs: an overflow to +-inf saturates at +-FLT_MAX, matching
// `care_narrow` of the reference's f64 value. Callers apply it only when the inputs were finite.
__device__ __forceinline__ float care_saturate(float x) {
    return (care_isfinite(x) || care_isnan(x)) ? x : (x > 0.0f ? 3.40282347e38f : -3.40282347e38f);
}

// Double addition and multiplication rounded to nearest, each on its own: the compiler never
// contracts these intrinsics into an FMA, so a chain of them rounds exactly as the CPU reference's
// `a + b * c` does (Rust never contracts), and a reverse scan written with them equals the
// reference bit for bit.
__device__ __forceinline__ double care_dadd(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double care_dmul(double a, double b) { return __dmul_rn(a, b); }

// ---- reductions ------------------------------------------------------------------------------
// All reductions require every lane of the warp (and, for block reductions, every thread of the
// block) to call them: the launch code only uses block sizes that are multiples of 32.

template <typename T>
__device__ __forceinline__ T care_warp_sum(T v) {
    for (int o = CARE_WARP / 2; o > 0; o >>= 1) {
        v += __shfl_xor_sync(CARE_FULL_MASK, v, o);
    }
    return v;
}

template <typename T>
__device__ __forceinline__ T care_warp_min(T v) {
    for (int o = CARE_WARP / 2; o > 0; o >>= 1) {
        T w = __shfl_xor_sync(CARE_FULL_MASK, v, o);
        v = w < v ? w : v;
    }
    return v;
}

template <typename T>
__device__ __forceinline__ T care_warp_max(T v) {
    for (int o = CARE_WARP / 2; o > 0; o >>= 1) {
        T w = __shfl_xor_sync(CARE_FULL_MASK, v, o);
        v = w > v ? w : v;
    }
    return v;
}

// Block-wide reductions through `scratch` (32 entries of shared memory). Every thread gets the
// result. The leading barrier protects `scratch` from a previous call that may still be reading it.
template <typename T>
__device__ __forceinline__ T care_block_sum(T v, T* scratch) {
    care_u32 lane = threadIdx.x & (CARE_WARP - 1);
    care_u32 warp = threadIdx.x / CARE_WARP;
    care_u32 nwarps = (blockDim.x + CARE_WARP - 1) / CARE_WARP;
    v = care_warp_sum(v);
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = v;
    }
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : (T)0;
    return care_warp_sum(v);
}

template <typename T>
__device__ __forceinline__ T care_block_min(T v, T* scratch, T identity) {
    care_u32 lane = threadIdx.x & (CARE_WARP - 1);
    care_u32 warp = threadIdx.x / CARE_WARP;
    care_u32 nwarps = (blockDim.x + CARE_WARP - 1) / CARE_WARP;
    v = care_warp_min(v);
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = v;
    }
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : identity;
    return care_warp_min(v);
}

template <typename T>
__device__ __forceinline__ T care_block_max(T v, T* scratch, T identity) {
    care_u32 lane = threadIdx.x & (CARE_WARP - 1);
    care_u32 warp = threadIdx.x / CARE_WARP;
    care_u32 nwarps = (blockDim.x + CARE_WARP - 1) / CARE_WARP;
    v = care_warp_max(v);
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = v;
    }
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : identity;
    return care_warp_max(v);
}

// Atomic min/max of non-negative floats: for x >= 0 the IEEE bit patterns order like the values,
// so an unsigned integer atomic is exact. Callers pass only finite non-negative values (ratios).
__device__ __forceinline__ void care_atomic_min_nonneg(float* addr, float v) {
    atomicMin((care_u32*)addr, __float_as_uint(v));
}
__device__ __forceinline__ void care_atomic_max_nonneg(float* addr, float v) {
    atomicMax((care_u32*)addr, __float_as_uint(v));
}
