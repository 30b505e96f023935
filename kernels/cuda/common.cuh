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

// On the device one cvt.f32.f16 (exact: every f16, subnormals included, is a normal f32); the
// host emulator runs the bit-exact software widening below.
__device__ __forceinline__ float care_f16_to_f32(care_u16 h) {
#if defined(__CUDACC__)
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
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
#endif
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

__device__ __forceinline__ bool care_isfinite_d(double x) {
    return (__double_as_longlong(x) & 0x7ff0000000000000ll) != 0x7ff0000000000000ll;
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

// Reductions over aligned segments of `width` lanes (a power of two, at most 32): lane l meets
// only lanes l ^ o with o < width, so the segments of a warp reduce side by side. Every lane of
// the warp calls them.
template <typename T>
__device__ __forceinline__ T care_seg_sum(T v, care_u32 width) {
    for (care_u32 o = width / 2u; o > 0u; o >>= 1) {
        v += __shfl_xor_sync(CARE_FULL_MASK, v, (int)o);
    }
    return v;
}

template <typename T>
__device__ __forceinline__ T care_seg_min(T v, care_u32 width) {
    for (care_u32 o = width / 2u; o > 0u; o >>= 1) {
        T w = __shfl_xor_sync(CARE_FULL_MASK, v, (int)o);
        v = w < v ? w : v;
    }
    return v;
}

template <typename T>
__device__ __forceinline__ T care_seg_max(T v, care_u32 width) {
    for (care_u32 o = width / 2u; o > 0u; o >>= 1) {
        T w = __shfl_xor_sync(CARE_FULL_MASK, v, (int)o);
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

// ---- deterministic cross-block merges ---------------------------------------------------------
// Statistics that span blocks are merged through slots, never through float atomics on one
// address: each block writes its partial result into its own slot of the caller's workspace and
// takes a ticket; the block that takes the last ticket reads every slot in slot order and
// finishes the reduction. The merge order is fixed (slot 0, 1, 2, ...) whatever order the blocks
// ran in, so the result is the same bit for bit on every run. The kernels that merge this way
// launch at most CARE_STAT_SLOTS blocks.
#define CARE_STAT_SLOTS 1024

// Called by every thread of the block after thread 0 wrote the block's slot; true in every
// thread of the last block to arrive. `*arrivals` is zeroed by the launch plan before the launch.
__device__ __forceinline__ bool care_last_block(care_u32* arrivals) {
    __shared__ care_u32 s_last;
    __syncthreads(); // thread 0's slot write precedes its fence and ticket; s_last is free
    if (threadIdx.x == 0) {
        __threadfence(); // the slot is visible to every block before the ticket is
        const care_u32 nblocks = gridDim.x * gridDim.y * gridDim.z;
        s_last = atomicAdd(arrivals, 1u) == nblocks - 1u ? 1u : 0u;
    }
    __syncthreads();
    const bool last = s_last != 0u;
    if (last) {
        __threadfence(); // the other blocks' slots, published before their tickets
    }
    return last;
}

// Count, mean and centered sum of squares (M2) of some values, with a non-finite flag: the
// per-block partials of the multi-block moments (whitening, batch std).
struct CareMoments {
    double count;
    double mean;
    double m2;
    care_u32 bad; // a non-finite counted value
    care_u32 pad0;
};

// Chan's merge of two partials: exact for equal means, no cancellation of E[x^2] - E[x]^2.
__device__ __forceinline__ CareMoments care_moments_merge(CareMoments a, CareMoments b) {
    if (b.count == 0.0) {
        a.bad |= b.bad;
        return a;
    }
    if (a.count == 0.0) {
        b.bad |= a.bad;
        return b;
    }
    CareMoments r;
    r.count = a.count + b.count;
    const double d = b.mean - a.mean;
    r.mean = a.mean + d * (b.count / r.count);
    r.m2 = a.m2 + b.m2 + d * d * (a.count * (b.count / r.count));
    r.bad = a.bad | b.bad;
    r.pad0 = 0;
    return r;
}

// The last block's merge of `nslots` slots (written by other blocks during the launch): thread
// t folds slots t, t + blockDim.x, ... in order, then a fixed tree over the threads (t with
// t + s for s = 1, 2, 4, ...) in `tree` (blockDim.x <= 256 entries of shared memory). The result
// is valid in thread 0; every thread of the block calls it. A fixed order for a given geometry,
// so the same bits on every run.
__device__ __forceinline__ CareMoments care_moments_merge_slots(const CareMoments* slots,
                                                                care_u32 nslots,
                                                                CareMoments* tree) {
    CareMoments acc;
    acc.count = 0.0;
    acc.mean = 0.0;
    acc.m2 = 0.0;
    acc.bad = 0;
    acc.pad0 = 0;
    for (care_u32 i = threadIdx.x; i < nslots; i += blockDim.x) {
        // volatile: written by other blocks during this launch, never from a cached line.
        const volatile CareMoments* q = &slots[i];
        CareMoments v;
        v.count = q->count;
        v.mean = q->mean;
        v.m2 = q->m2;
        v.bad = q->bad;
        v.pad0 = 0;
        acc = care_moments_merge(acc, v);
    }
    tree[threadIdx.x] = acc;
    for (care_u32 s = 1; s < blockDim.x; s <<= 1) {
        __syncthreads();
        if (threadIdx.x % (2u * s) == 0u && threadIdx.x + s < blockDim.x) {
            tree[threadIdx.x] = care_moments_merge(tree[threadIdx.x], tree[threadIdx.x + s]);
        }
    }
    __syncthreads();
    return tree[0];
}

// ---- selective log-softmax row primitives ------------------------------------------------------
// Shared by logsoftmax.cu (forward, backward) and the fused logits-to-loss pass of grpo_loss.cu:
// the parameter struct, 16-byte vectors of each dtype, the online (max, sum-exp) state in the
// log2 domain and its merges, and the per-element gradient.

#define CARE_LSM_STATUS_BAD_TARGET 1u
// A counted row without a softmax: a NaN or +inf logit, one whose scaled value overflows to
// +inf, or every logit -inf. Its log-sum-exp is not finite (NaN reaches s through exp2, +inf
// makes the running max +inf, all -inf leaves s == 0), so one test per row finds all three.
#define CARE_LSM_STATUS_NON_FINITE 2u

#define CARE_LOG2E 1.4426950408889634f
#define CARE_LN2 0.6931471805599453f
#define CARE_NEG_FLT_MAX (-3.402823466e38f)

// Fixed-count loops over vector lanes must unroll, or their arrays go to local memory; the host
// emulator's compiler gets no pragma (it would warn about an unknown one).
#if defined(__CUDACC__)
#define CARE_UNROLL _Pragma("unroll")
#else
#define CARE_UNROLL
#endif

// z2 = x * scale rounded to f32 on its own, never contracted into an FMA with the subtraction
// that follows: then the row's max element has z2 - m == 0 exactly and contributes exactly 1,
// so V = 1 gives logp = 0 and entropy = 0 exactly, and the same z2 is used everywhere (max,
// sum, target, backward). NVRTC contracts a * b - c by default; __fmul_rn opts out. The host
// emulator is built with -ffp-contract=off.
#if defined(__CUDACC__)
#define CARE_MUL_RN(a, b) __fmul_rn((a), (b))
#else
#define CARE_MUL_RN(a, b) ((a) * (b))
#endif

// Mirrored by `care_kernels::params::LogSoftmaxParams` (layout checked against this file by the
// emulator tests).
struct CareLsmParams {
    const void* logits;      // T, row i at logits + i * stride
    const void* targets;     // [n] int32 or int64 (targets_i64)
    const care_u8* mask;     // [n] or null (every row counts)
    float* logp;             // forward: [n] output
    float* entropy;          // forward: [n] output or null; backward: [n] input (with dentropy)
    float* lse;              // forward: [n] output or null; backward: [n] input (required)
    const float* dlogp;      // backward: [n] or null (0)
    const float* dentropy;   // backward: [n] or null (no entropy term)
    void* dlogits;           // backward: T, row i at dlogits + i * dstride (may be `logits`)
    care_u32* status;        // device word or null; CARE_LSM_STATUS_* bits are OR-ed in
    care_u64 n;              // rows
    care_u64 stride;         // elements between logits rows (>= vocab)
    care_u64 dstride;        // elements between dlogits rows (>= vocab)
    care_u32 vocab;          // V >= 1
    care_u32 targets_i64;    // 1: targets are int64
    care_u32 block_team;     // 1: one block per row; 0: one warp per row
    float inv_temp;          // 1 / T
};

// 2^x. On the device one MUFU.EX2 (ex2.approx.ftz): a result below 2^-126 becomes 0, which
// changes no row sum (each is >= 1, the max element contributes exactly 1) and no gradient
// beyond the tolerance, while the non-ftz exp2f adds four instructions of range fix-up around the
// MUFU per element (seen in the sm_90 SASS). The host emulator uses exp2f (within 2 ulp of it).
__device__ __forceinline__ float care_exp2(float x) {
#if defined(__CUDACC__)
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);
#endif
}

// Two floats to packed 16-bit values (element 2k in the low half), round to nearest even. On the
// device one cvt.rn.{bf16x2,f16x2}.f32 (sm_80+; the upper half comes from the first operand);
// the emulator uses the bit-exact software rounding of common.cuh (NaN payloads may differ).
__device__ __forceinline__ care_u32 care_pack_bf16x2(float lo, float hi) {
#if defined(__CUDACC__)
    care_u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (care_u32)care_f32_to_bf16(lo) | ((care_u32)care_f32_to_bf16(hi) << 16);
#endif
}
__device__ __forceinline__ care_u32 care_pack_f16x2(float lo, float hi) {
#if defined(__CUDACC__)
    care_u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (care_u32)care_f32_to_f16(lo) | ((care_u32)care_f32_to_f16(hi) << 16);
#endif
}

// ---- 16-byte vectors ---------------------------------------------------------------------------

struct alignas(16) CareVec16 {
    care_u32 w[4];
};

template <typename T>
struct CareLsmVec;
template <>
struct CareLsmVec<float> {
    static const int N = 4;
    __device__ static __forceinline__ void unpack(const CareVec16& v, float* out) {
        CARE_UNROLL
        for (int k = 0; k < 4; ++k) out[k] = __uint_as_float(v.w[k]);
    }
    __device__ static __forceinline__ void pack(const float* in, CareVec16& v) {
        CARE_UNROLL
        for (int k = 0; k < 4; ++k) v.w[k] = __float_as_uint(in[k]);
    }
};
template <>
struct CareLsmVec<care_bf16> {
    static const int N = 8;
    __device__ static __forceinline__ void unpack(const CareVec16& v, float* out) {
        // Little-endian: element 2k is the low half of word k.
        CARE_UNROLL
        for (int k = 0; k < 4; ++k) {
            out[2 * k] = __uint_as_float(v.w[k] << 16);
            out[2 * k + 1] = __uint_as_float(v.w[k] & 0xffff0000u);
        }
    }
    __device__ static __forceinline__ void pack(const float* in, CareVec16& v) {
        CARE_UNROLL
        for (int k = 0; k < 4; ++k) {
            v.w[k] = care_pack_bf16x2(in[2 * k], in[2 * k + 1]);
        }
    }
};
template <>
struct CareLsmVec<care_f16> {
    static const int N = 8;
    __device__ static __forceinline__ void unpack(const CareVec16& v, float* out) {
        CARE_UNROLL
        for (int k = 0; k < 4; ++k) {
            out[2 * k] = care_f16_to_f32((care_u16)(v.w[k] & 0xffffu));
            out[2 * k + 1] = care_f16_to_f32((care_u16)(v.w[k] >> 16));
        }
    }
    __device__ static __forceinline__ void pack(const float* in, CareVec16& v) {
        CARE_UNROLL
        for (int k = 0; k < 4; ++k) {
            v.w[k] = care_pack_f16x2(in[2 * k], in[2 * k + 1]);
        }
    }
};

// L2 eviction priority of 16-byte accesses (sm_80+: createpolicy and .L2::cache_hint). The fused
// logits-to-loss pass loads a row with evict_last, so that it stays in L2 until its second touch
// however the gradient's own lines come and go, and re-reads it and writes the gradient with
// evict_first (neither is needed again). Only hints: the host emulator ignores them.
#define CARE_L2_NORMAL 0
#define CARE_L2_LAST 1
#define CARE_L2_FIRST 2

#if defined(__CUDACC__)
template <int H>
__device__ __forceinline__ care_u64 care_l2_policy() {
    care_u64 pol;
    if (H == CARE_L2_LAST) {
        asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    } else {
        asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    }
    return pol;
}
#endif

template <int H>
__device__ __forceinline__ CareVec16 care_ld16(const CareVec16* p) {
#if defined(__CUDACC__)
    if (H != CARE_L2_NORMAL) {
        CareVec16 v;
        asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                     : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
                     : "l"(p), "l"(care_l2_policy<H>()));
        return v;
    }
#endif
    return *p;
}

template <int H>
__device__ __forceinline__ void care_st16(CareVec16* p, const CareVec16& v) {
#if defined(__CUDACC__)
    if (H != CARE_L2_NORMAL) {
        asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;"
                     :
                     : "l"(p), "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]), "r"(v.w[3]),
                       "l"(care_l2_policy<H>())
                     : "memory");
        return;
    }
#endif
    *p = v;
}

// Elements before the first 16-byte boundary of a row (the scalar head), or `vocab` when the row
// cannot be vectorized at all (a pointer not aligned to its own element size).
template <typename T>
__device__ __forceinline__ care_u32 care_lsm_head(const void* row, care_u32 vocab) {
    care_u32 mis = (care_u32)((care_u64)row & 15u);
    if (mis % (care_u32)sizeof(T) != 0) {
        return vocab;
    }
    care_u32 head = mis == 0 ? 0u : (16u - mis) / (care_u32)sizeof(T);
    return head < vocab ? head : vocab;
}

// ---- the online state ----------------------------------------------------------------------------

struct CareLsmState {
    float m; // running max of z2 (starts at -FLT_MAX)
    float s; // sum 2^(z2 - m)
    float t; // sum 2^(z2 - m) * (z2 - m)   (entropy only)
};

// Adds raw logits x[0..K) to the state: one compare chain for the block max (scale = log2(e)/T
// > 0 keeps the order of x and z2 the same), one rescale when it grows, then 2^(z2 - m) per
// element.
template <bool ENT, int K>
__device__ __forceinline__ void care_lsm_add(CareLsmState& st, const float* x, float scale) {
    float vx = x[0];
    CARE_UNROLL
    // fmaxf (one FMNMX) ignores a NaN here; the NaN still reaches s through its own exp2.
    for (int k = 1; k < K; ++k) vx = fmaxf(vx, x[k]);
    float vm = CARE_MUL_RN(vx, scale);
    if (vm > st.m) {
        float a = care_exp2(st.m - vm);
        if (ENT) {
            // (m_old - m_new) * s with s == 0 at the start: keep the product finite.
            float dm = st.m - vm;
            dm = dm > -1e30f ? dm : -1e30f;
            st.t = a * (st.t + dm * st.s);
        }
        st.s *= a;
        st.m = vm;
    }
    CARE_UNROLL
    for (int k = 0; k < K; ++k) {
        float d = CARE_MUL_RN(x[k], scale) - st.m;
        float e = care_exp2(d);
        st.s += e;
        if (ENT) {
            // A -inf logit has e == 0 and d == -inf; clamp d so that the product is 0, not NaN.
            st.t += e * (d > -1e30f ? d : -1e30f);
        }
    }
}

template <bool ENT>
__device__ __forceinline__ CareLsmState care_lsm_merge(CareLsmState a, CareLsmState b) {
    CareLsmState r;
    r.m = a.m > b.m ? a.m : b.m;
    float fa = care_exp2(a.m - r.m);
    float fb = care_exp2(b.m - r.m);
    r.s = fa * a.s + fb * b.s;
    r.t = 0.0f;
    if (ENT) {
        float da = a.m - r.m, db = b.m - r.m;
        da = da > -1e30f ? da : -1e30f;
        db = db > -1e30f ? db : -1e30f;
        r.t = fa * (a.t + da * a.s) + fb * (b.t + db * b.s);
    }
    return r;
}

template <bool ENT>
__device__ __forceinline__ CareLsmState care_lsm_warp_merge(CareLsmState st) {
    for (int o = CARE_WARP / 2; o > 0; o >>= 1) {
        CareLsmState other;
        other.m = __shfl_xor_sync(CARE_FULL_MASK, st.m, o);
        other.s = __shfl_xor_sync(CARE_FULL_MASK, st.s, o);
        other.t = ENT ? __shfl_xor_sync(CARE_FULL_MASK, st.t, o) : 0.0f;
        st = care_lsm_merge<ENT>(st, other);
    }
    return st;
}

__device__ __forceinline__ bool care_lsm_counted(const CareLsmParams& p, care_u64 row) {
    return p.mask == 0 || p.mask[row] != 0;
}

// The row's target as a vocabulary index, or -1 when it is outside 0..V.
__device__ __forceinline__ long long care_lsm_target(const CareLsmParams& p, care_u64 row) {
    long long y = p.targets_i64 != 0 ? ((const long long*)p.targets)[row]
                                     : (long long)((const care_i32*)p.targets)[row];
    return (y >= 0 && y < (long long)p.vocab) ? y : -1;
}

// The team's share of one row: lanes `lane` of `team` threads; vectors loaded with L2 hint H.
template <typename T, bool ENT, int H = CARE_L2_NORMAL>
__device__ __forceinline__ CareLsmState care_lsm_row_state(const CareLsmParams& p, const T* row,
                                                           care_u32 lane, care_u32 team) {
    typedef CareLsmVec<T> V;
    const float scale = p.inv_temp * CARE_LOG2E;
    CareLsmState st;
    st.m = CARE_NEG_FLT_MAX;
    st.s = 0.0f;
    st.t = 0.0f;
    const care_u32 vocab = p.vocab;
    const care_u32 head = care_lsm_head<T>(row, vocab);
    for (care_u32 j = lane; j < head; j += team) {
        float x = care_load(row, j);
        care_lsm_add<ENT, 1>(st, &x, scale);
    }
    const care_u32 nvec = (vocab - head) / V::N;
    const CareVec16* vrow = (const CareVec16*)(row + head);
    // Two independent 16-byte loads in flight per thread before any arithmetic.
    care_u32 k = lane;
    for (; k + team < nvec; k += 2 * team) {
        CareVec16 a = care_ld16<H>(vrow + k);
        CareVec16 b = care_ld16<H>(vrow + k + team);
        float za[V::N], zb[V::N];
        V::unpack(a, za);
        V::unpack(b, zb);
        care_lsm_add<ENT, V::N>(st, za, scale);
        care_lsm_add<ENT, V::N>(st, zb, scale);
    }
    if (k < nvec) {
        const CareVec16 a = care_ld16<H>(vrow + k); // to registers first, then unpacked
        float za[V::N];
        V::unpack(a, za);
        care_lsm_add<ENT, V::N>(st, za, scale);
    }
    for (care_u32 j = head + nvec * V::N + lane; j < vocab; j += team) {
        float x = care_load(row, j);
        care_lsm_add<ENT, 1>(st, &x, scale);
    }
    return st;
}


struct CareLsmRowGrad {
    float scale;  // log2(e) / T
    float lse2;   // lse in log2 units
    float cg;     // g / T
    float ce;     // e / T (entropy term)
    float h;      // entropy (natural log)
    care_u32 y;   // target index, or 0xffffffff (never a column: V <= 2^32 - 1)
};

template <bool ENT>
__device__ __forceinline__ float care_lsm_grad(const CareLsmRowGrad& r, float x, care_u32 j) {
    float d2 = CARE_MUL_RN(x, r.scale) - r.lse2; // log2 p
    float pj = care_exp2(d2);
    float g = r.cg * ((j == r.y ? 1.0f : 0.0f) - pj);
    if (ENT) {
        // p log p -> 0: clamp log p so that a -inf logit gives 0, not 0 * -inf.
        float lp = d2 * CARE_LN2;
        lp = lp > -1e30f ? lp : -1e30f;
        g -= r.ce * pj * (lp + r.h);
    }
    return g;
}

// The gradient of one 16-byte vector of logits (elements j0, j0 + 1, ...), stored as one
// 16-byte vector.
template <typename T, bool ENT, int H = CARE_L2_NORMAL>
__device__ __forceinline__ void care_lsm_grad_vec(const CareLsmRowGrad& r, const CareVec16& in,
                                                  care_u32 j0, CareVec16* out) {
    typedef CareLsmVec<T> V;
    float z[V::N];
    V::unpack(in, z);
    CARE_UNROLL
    for (int q = 0; q < V::N; ++q) z[q] = care_lsm_grad<ENT>(r, z[q], j0 + (care_u32)q);
    CareVec16 o;
    V::pack(z, o);
    care_st16<H>(out, o);
}

// Zeros in elements 0..vocab of a row, with 16-byte stores past the scalar head.
template <typename T>
__device__ __forceinline__ void care_lsm_zero_row(T* drow, care_u32 vocab, care_u32 lane,
                                                  care_u32 team) {
    typedef CareLsmVec<T> V;
    const care_u32 head = care_lsm_head<T>(drow, vocab);
    for (care_u32 j = lane; j < head; j += team) {
        care_store(drow, j, 0.0f);
    }
    const care_u32 nvec = (vocab - head) / V::N;
    CareVec16* vd = (CareVec16*)(drow + head);
    CareVec16 zero;
    zero.w[0] = zero.w[1] = zero.w[2] = zero.w[3] = 0u;
    for (care_u32 k = lane; k < nvec; k += team) {
        vd[k] = zero;
    }
    for (care_u32 j = head + nvec * V::N + lane; j < vocab; j += team) {
        care_store(drow, j, 0.0f);
    }
}

// One row's state over a whole block (the block-team mode): each warp merges its lanes with
// shuffles, then warp 0 merges the warps' states from shared memory (`sm`: 3 x 32 floats). The
// result is valid in lane 0 of warp 0 (warp 0 holds it). Every thread of the block calls it;
// the leading barrier protects `sm` from the previous row's readers.
template <typename T, bool ENT, int H = CARE_L2_NORMAL>
__device__ __forceinline__ CareLsmState care_lsm_block_state(const CareLsmParams& p, const T* xrow,
                                                             float (*sm)[CARE_WARP]) {
    const care_u32 lane = threadIdx.x & (CARE_WARP - 1);
    const care_u32 warp = threadIdx.x / CARE_WARP;
    const care_u32 nwarps = blockDim.x / CARE_WARP;
    CareLsmState st = care_lsm_row_state<T, ENT, H>(p, xrow, threadIdx.x, blockDim.x);
    st = care_lsm_warp_merge<ENT>(st);
    __syncthreads();
    if (lane == 0) {
        sm[0][warp] = st.m;
        sm[1][warp] = st.s;
        sm[2][warp] = st.t;
    }
    __syncthreads();
    CareLsmState w;
    w.m = CARE_NEG_FLT_MAX;
    w.s = 0.0f;
    w.t = 0.0f;
    if (warp == 0) {
        w.m = lane < nwarps ? sm[0][lane] : CARE_NEG_FLT_MAX;
        w.s = lane < nwarps ? sm[1][lane] : 0.0f;
        w.t = lane < nwarps ? sm[2][lane] : 0.0f;
        w = care_lsm_warp_merge<ENT>(w);
    }
    return w;
}

// The row's target index (-1 outside 0..V) and its logit, loaded before the row's pass, so that
// both loads are in flight while the row streams in instead of a round trip after it.
struct CareLsmTarget {
    long long y;
    float x;
};

template <typename T>
__device__ __forceinline__ CareLsmTarget care_lsm_fetch_target(const CareLsmParams& p,
                                                               care_u64 row, const T* xrow) {
    CareLsmTarget t;
    t.y = care_lsm_target(p, row);
    t.x = t.y >= 0 ? care_load(xrow, (care_u32)t.y) : 0.0f;
    return t;
}

// The gradient of one row from its end back to its start, in the logits dtype: the fused loss
// pass writes it right after the row's forward pass, and walking backwards re-reads first the
// logits it loaded last, the ones most likely still in L2. Vectorized when the logits and
// dlogits rows share their offset from a 16-byte boundary (always in place). Read before write:
// each element is read and overwritten by the same thread.
template <typename T>
__device__ __forceinline__ void care_lsm_grad_row_reverse(const CareLsmRowGrad& r, const T* xrow,
                                                          T* drow, care_u32 vocab, care_u32 lane,
                                                          care_u32 team) {
    typedef CareLsmVec<T> V;
    care_u32 head = care_lsm_head<T>(xrow, vocab);
    if (head != care_lsm_head<T>(drow, vocab) ||
        ((care_u64)xrow & 15u) != ((care_u64)drow & 15u)) {
        head = vocab;
    }
    const care_u32 nvec = (vocab - head) / V::N;
    for (care_u32 j = head + nvec * V::N + lane; j < vocab; j += team) {
        care_store(drow, j, care_lsm_grad<false>(r, care_load(xrow, j), j));
    }
    const CareVec16* vx = (const CareVec16*)(xrow + head);
    CareVec16* vd = (CareVec16*)(drow + head);
    // Rounds of `team` vectors from the last round down, two rounds (two loads) at a time.
    const int F = CARE_L2_FIRST;
    care_u32 round = (nvec + team - 1) / team;
    for (; round >= 2; round -= 2) {
        const care_u32 k1 = (round - 1) * team + lane, k0 = (round - 2) * team + lane;
        if (k1 < nvec) {
            const CareVec16 a = care_ld16<F>(vx + k1);
            const CareVec16 b = care_ld16<F>(vx + k0);
            care_lsm_grad_vec<T, false, F>(r, a, head + k1 * V::N, vd + k1);
            care_lsm_grad_vec<T, false, F>(r, b, head + k0 * V::N, vd + k0);
        } else {
            const CareVec16 b = care_ld16<F>(vx + k0);
            care_lsm_grad_vec<T, false, F>(r, b, head + k0 * V::N, vd + k0);
        }
    }
    if (round == 1 && lane < nvec) {
        const CareVec16 a = care_ld16<F>(vx + lane);
        care_lsm_grad_vec<T, false, F>(r, a, head + lane * V::N, vd + lane);
    }
    for (care_u32 j = lane; j < head; j += team) {
        care_store(drow, j, care_lsm_grad<false>(r, care_load(xrow, j), j));
    }
}
