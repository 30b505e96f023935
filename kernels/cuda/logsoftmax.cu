// Fused selective log-softmax: log-probs of target tokens (and the entropy) straight from logits,
// without materializing the softmax, and the backward pass into dlogits (care_core::logsoftmax is
// the f64 reference; its module documentation is the contract, edge cases included).
//
// Forward, per row: one pass over the logits with an online max / sum-exp in float, in the log2
// domain (z2 = x * log2(e) / T, so every exponential is one ex2), with 16-byte vector loads
// after a scalar head that reaches 16-byte alignment (any row stride and base pointer work).
// The running state per thread is (m, s, t): the max, s = sum 2^(z2 - m) and, for the entropy,
// t = sum 2^(z2 - m) * (z2 - m). States merge exactly (rescaled to the larger max), so the row is
// split over a team of threads and reduced with shuffles (and shared memory in block mode).
// Outputs: logp (f32), entropy (f32, optional) and lse (f32, natural log, optional; the backward
// pass needs it).
//
// Backward, per row: reads the logits once more and writes
//   dlogits_j = (1/T) * (g * ([j == y] - p_j) - e * p_j * (log p_j + H))
// in the logits dtype, into a separate buffer or in place over the logits (same pointer and
// stride). Rows with mask 0 get exact zeros and are not read.
//
// Geometry (see care_kernels::geometry::log_softmax_geometry): a 1-D grid whose teams stride
// over the rows, so N has no limit. A team is one warp (small vocabularies; 8 rows per
// 256-thread block, no barriers) or the whole block (large vocabularies; block_team = 1). The
// running max starts at -FLT_MAX, not -inf: then a -inf logit contributes exp2(-inf) = 0 with
// no special case in the hot loop, an all -inf row ends with s = 0 (lse = -inf, logp = NaN),
// and a NaN or +inf logit turns s into NaN, as the reference specifies.
#include "common.cuh"

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

// The team's share of one row: lanes `lane` of `team` threads.
template <typename T, bool ENT>
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
        CareVec16 a = vrow[k];
        CareVec16 b = vrow[k + team];
        float za[V::N], zb[V::N];
        V::unpack(a, za);
        V::unpack(b, zb);
        care_lsm_add<ENT, V::N>(st, za, scale);
        care_lsm_add<ENT, V::N>(st, zb, scale);
    }
    if (k < nvec) {
        float za[V::N];
        V::unpack(vrow[k], za);
        care_lsm_add<ENT, V::N>(st, za, scale);
    }
    for (care_u32 j = head + nvec * V::N + lane; j < vocab; j += team) {
        float x = care_load(row, j);
        care_lsm_add<ENT, 1>(st, &x, scale);
    }
    return st;
}

// Lane 0 of the team writes the row's outputs from the merged state.
template <typename T, bool ENT>
__device__ __forceinline__ void care_lsm_write_row(const CareLsmParams& p, care_u64 row,
                                                   const T* xrow, CareLsmState st) {
    const float scale = p.inv_temp * CARE_LOG2E;
    float lse2 = st.m + log2f(st.s);
    if (!care_isfinite(lse2) && p.status != 0) {
        atomicOr(p.status, CARE_LSM_STATUS_NON_FINITE);
    }
    long long y = care_lsm_target(p, row);
    float lp;
    if (y < 0) {
        lp = __uint_as_float(0x7fc00000u); // NaN: the reference rejects such a target
        if (p.status != 0) {
            atomicOr(p.status, CARE_LSM_STATUS_BAD_TARGET);
        }
    } else {
        lp = (CARE_MUL_RN(care_load(xrow, (care_u32)y), scale) - lse2) * CARE_LN2;
    }
    p.logp[row] = lp;
    if (p.lse != 0) {
        p.lse[row] = lse2 * CARE_LN2;
    }
    if (ENT) {
        p.entropy[row] = (log2f(st.s) - st.t / st.s) * CARE_LN2;
    }
}

__device__ __forceinline__ void care_lsm_write_masked(const CareLsmParams& p, care_u64 row) {
    p.logp[row] = 0.0f;
    if (p.lse != 0) {
        p.lse[row] = 0.0f;
    }
    if (p.entropy != 0) {
        p.entropy[row] = 0.0f;
    }
}

template <typename T, bool ENT>
__device__ void care_lsm_forward(const CareLsmParams& p) {
    __shared__ float sm_m[CARE_WARP];
    __shared__ float sm_s[CARE_WARP];
    __shared__ float sm_t[CARE_WARP];
    const care_u32 lane = threadIdx.x & (CARE_WARP - 1);
    const care_u32 warp = threadIdx.x / CARE_WARP;
    const care_u32 nwarps = blockDim.x / CARE_WARP;
    if (p.block_team != 0) {
        // One block per row; the row index is uniform over the block, so are the barriers.
        for (care_u64 row = blockIdx.x; row < p.n; row += gridDim.x) {
            if (!care_lsm_counted(p, row)) {
                if (threadIdx.x == 0) {
                    care_lsm_write_masked(p, row);
                }
                continue;
            }
            const T* xrow = (const T*)p.logits + row * p.stride;
            CareLsmState st = care_lsm_row_state<T, ENT>(p, xrow, threadIdx.x, blockDim.x);
            st = care_lsm_warp_merge<ENT>(st);
            __syncthreads(); // the previous row's warp 0 may still read the scratch
            if (lane == 0) {
                sm_m[warp] = st.m;
                sm_s[warp] = st.s;
                sm_t[warp] = st.t;
            }
            __syncthreads();
            if (warp == 0) {
                CareLsmState w;
                w.m = lane < nwarps ? sm_m[lane] : CARE_NEG_FLT_MAX;
                w.s = lane < nwarps ? sm_s[lane] : 0.0f;
                w.t = lane < nwarps ? sm_t[lane] : 0.0f;
                w = care_lsm_warp_merge<ENT>(w);
                if (lane == 0) {
                    care_lsm_write_row<T, ENT>(p, row, xrow, w);
                }
            }
        }
    } else {
        // One warp per row: shuffles only.
        const care_u64 teams = (care_u64)gridDim.x * nwarps;
        for (care_u64 row = (care_u64)blockIdx.x * nwarps + warp; row < p.n; row += teams) {
            if (!care_lsm_counted(p, row)) {
                if (lane == 0) {
                    care_lsm_write_masked(p, row);
                }
                continue;
            }
            const T* xrow = (const T*)p.logits + row * p.stride;
            CareLsmState st = care_lsm_row_state<T, ENT>(p, xrow, lane, CARE_WARP);
            st = care_lsm_warp_merge<ENT>(st);
            if (lane == 0) {
                care_lsm_write_row<T, ENT>(p, row, xrow, st);
            }
        }
    }
}

// ---- backward ------------------------------------------------------------------------------------

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

template <typename T, bool ENT>
__device__ __forceinline__ void care_lsm_backward_row(const CareLsmParams& p, care_u64 row,
                                                      care_u32 lane, care_u32 team) {
    typedef CareLsmVec<T> V;
    T* drow = (T*)p.dlogits + row * p.dstride;
    const care_u32 vocab = p.vocab;
    if (!care_lsm_counted(p, row)) {
        for (care_u32 j = lane; j < vocab; j += team) {
            care_store(drow, j, 0.0f);
        }
        return;
    }
    const T* xrow = (const T*)p.logits + row * p.stride;
    CareLsmRowGrad r;
    r.scale = p.inv_temp * CARE_LOG2E;
    r.lse2 = p.lse[row] * CARE_LOG2E;
    r.cg = p.dlogp != 0 ? p.dlogp[row] * p.inv_temp : 0.0f;
    r.ce = ENT ? p.dentropy[row] * p.inv_temp : 0.0f;
    r.h = ENT ? p.entropy[row] : 0.0f;
    long long y = care_lsm_target(p, row);
    r.y = y < 0 ? 0xffffffffu : (care_u32)y;
    // Vectorized only when both rows share their offset from a 16-byte boundary (always true
    // in place); otherwise every element goes through the scalar loop.
    care_u32 head = care_lsm_head<T>(xrow, vocab);
    if (head != care_lsm_head<T>(drow, vocab) ||
        ((care_u64)xrow & 15u) != ((care_u64)drow & 15u)) {
        head = vocab;
    }
    for (care_u32 j = lane; j < head; j += team) {
        care_store(drow, j, care_lsm_grad<ENT>(r, care_load(xrow, j), j));
    }
    const care_u32 nvec = (vocab - head) / V::N;
    const CareVec16* vx = (const CareVec16*)(xrow + head);
    CareVec16* vd = (CareVec16*)(drow + head);
    for (care_u32 k = lane; k < nvec; k += team) {
        // Read before write: in place, each element is read and then overwritten by the same
        // thread, so no other thread ever sees a gradient where it expects a logit.
        float z[V::N];
        V::unpack(vx[k], z);
        care_u32 j0 = head + k * V::N;
        CARE_UNROLL
        for (int q = 0; q < V::N; ++q) z[q] = care_lsm_grad<ENT>(r, z[q], j0 + (care_u32)q);
        CareVec16 out;
        V::pack(z, out);
        vd[k] = out;
    }
    for (care_u32 j = head + nvec * V::N + lane; j < vocab; j += team) {
        care_store(drow, j, care_lsm_grad<ENT>(r, care_load(xrow, j), j));
    }
}

template <typename T, bool ENT>
__device__ void care_lsm_backward(const CareLsmParams& p) {
    const care_u32 lane = threadIdx.x & (CARE_WARP - 1);
    const care_u32 warp = threadIdx.x / CARE_WARP;
    const care_u32 nwarps = blockDim.x / CARE_WARP;
    if (p.block_team != 0) {
        for (care_u64 row = blockIdx.x; row < p.n; row += gridDim.x) {
            care_lsm_backward_row<T, ENT>(p, row, threadIdx.x, blockDim.x);
        }
    } else {
        const care_u64 teams = (care_u64)gridDim.x * nwarps;
        for (care_u64 row = (care_u64)blockIdx.x * nwarps + warp; row < p.n; row += teams) {
            care_lsm_backward_row<T, ENT>(p, row, lane, CARE_WARP);
        }
    }
}

// Entry points: the entropy variants are template instances chosen by a uniform branch, so the
// hot loop of the plain forward carries no entropy arithmetic. The backward's (1024, 1) bound:
// with (1024) alone, ptxas (12.2, sm_90) capped bwd_bf16 at 32 registers and spilled 28 bytes;
// with a minimum of one block per SM it takes 46 and spills nothing (scripts/gen-ptx.sh --ptxas).
#define CARE_LSM_ENTRY(DT, T)                                                                  \
    extern "C" __global__ void __launch_bounds__(1024) logsoftmax_fwd_##DT(CareLsmParams p) { \
        if (p.entropy != 0) {                                                                  \
            care_lsm_forward<T, true>(p);                                                      \
        } else {                                                                               \
            care_lsm_forward<T, false>(p);                                                     \
        }                                                                                      \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(1024, 1) logsoftmax_bwd_##DT(CareLsmParams p) { \
        if (p.dentropy != 0) {                                                                 \
            care_lsm_backward<T, true>(p);                                                     \
        } else {                                                                               \
            care_lsm_backward<T, false>(p);                                                    \
        }                                                                                      \
    }

CARE_LSM_ENTRY(f32, float)
CARE_LSM_ENTRY(bf16, care_bf16)
CARE_LSM_ENTRY(f16, care_f16)
