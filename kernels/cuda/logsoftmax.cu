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

// Lane 0 of the team writes the row's outputs from the merged state.
template <bool ENT>
__device__ __forceinline__ void care_lsm_write_row(const CareLsmParams& p, care_u64 row,
                                                   CareLsmTarget tg, CareLsmState st) {
    const float scale = p.inv_temp * CARE_LOG2E;
    float lse2 = st.m + log2f(st.s);
    if (!care_isfinite(lse2) && p.status != 0) {
        atomicOr(p.status, CARE_LSM_STATUS_NON_FINITE);
    }
    float lp;
    if (tg.y < 0) {
        lp = __uint_as_float(0x7fc00000u); // NaN: the reference rejects such a target
        if (p.status != 0) {
            atomicOr(p.status, CARE_LSM_STATUS_BAD_TARGET);
        }
    } else {
        lp = (CARE_MUL_RN(tg.x, scale) - lse2) * CARE_LN2;
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
    __shared__ float sm[3][CARE_WARP];
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
            // Every thread loads the same two words (one transaction per warp), so no branch
            // splits the row's loop; only thread 0 uses them.
            const CareLsmTarget tg = care_lsm_fetch_target<T>(p, row, xrow);
            const CareLsmState w = care_lsm_block_state<T, ENT>(p, xrow, sm);
            if (threadIdx.x == 0) {
                care_lsm_write_row<ENT>(p, row, tg, w);
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
            const CareLsmTarget tg = care_lsm_fetch_target<T>(p, row, xrow);
            CareLsmState st = care_lsm_row_state<T, ENT>(p, xrow, lane, CARE_WARP);
            st = care_lsm_warp_merge<ENT>(st);
            if (lane == 0) {
                care_lsm_write_row<ENT>(p, row, tg, st);
            }
        }
    }
}

// ---- backward ------------------------------------------------------------------------------------

template <typename T, bool ENT>
__device__ __forceinline__ void care_lsm_backward_row(const CareLsmParams& p, care_u64 row,
                                                      care_u32 lane, care_u32 team) {
    typedef CareLsmVec<T> V;
    T* drow = (T*)p.dlogits + row * p.dstride;
    const care_u32 vocab = p.vocab;
    if (!care_lsm_counted(p, row)) {
        care_lsm_zero_row<T>(drow, vocab, lane, team);
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
    // Two 16-byte loads in flight per thread, each copied to registers before it is unpacked
    // (unpacking through the pointer would split it into four 4-byte loads). Read before write:
    // in place, each element is read and then overwritten by the same thread, so no other
    // thread ever sees a gradient where it expects a logit.
    care_u32 k = lane;
    for (; k + team < nvec; k += 2 * team) {
        const CareVec16 a = vx[k];
        const CareVec16 b = vx[k + team];
        care_lsm_grad_vec<T, ENT>(r, a, head + k * V::N, vd + k);
        care_lsm_grad_vec<T, ENT>(r, b, head + (k + team) * V::N, vd + k + team);
    }
    if (k < nvec) {
        const CareVec16 a = vx[k];
        care_lsm_grad_vec<T, ENT>(r, a, head + k * V::N, vd + k);
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
        // A row's elements are split over the gridDim.y blocks of a column of the grid (more
        // blocks than rows for a small batch): each element is independent of the others.
        const care_u32 part = blockIdx.y * blockDim.x + threadIdx.x;
        const care_u32 parts = gridDim.y * blockDim.x;
        for (care_u64 row = blockIdx.x; row < p.n; row += gridDim.x) {
            care_lsm_backward_row<T, ENT>(p, row, part, parts);
        }
    } else {
        const care_u64 teams = (care_u64)gridDim.x * nwarps;
        for (care_u64 row = (care_u64)blockIdx.x * nwarps + warp; row < p.n; row += teams) {
            care_lsm_backward_row<T, ENT>(p, row, lane, CARE_WARP);
        }
    }
}

// Entry points: the entropy variants are template instances chosen by a uniform branch, so the
// hot loop of the plain forward carries no entropy arithmetic. Launch bounds: the plan's 256
// threads (care_kernels::kernel, checked against this PTX) and the blocks per SM that the
// registers allow without a spill on sm_80 and sm_90 (scripts/gen-ptx.sh --ptxas): 6 for the
// forward (40 registers; at 8 blocks, 32 registers, sm_80 spills), 4 for the backward (64).
#define CARE_LSM_ENTRY(DT, T)                                                                  \
    extern "C" __global__ void __launch_bounds__(256, 6) logsoftmax_fwd_##DT(CareLsmParams p) { \
        if (p.entropy != 0) {                                                                  \
            care_lsm_forward<T, true>(p);                                                      \
        } else {                                                                               \
            care_lsm_forward<T, false>(p);                                                     \
        }                                                                                      \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(256, 4) logsoftmax_bwd_##DT(CareLsmParams p) { \
        if (p.dentropy != 0) {                                                                 \
            care_lsm_backward<T, true>(p);                                                     \
        } else {                                                                               \
            care_lsm_backward<T, false>(p);                                                    \
        }                                                                                      \
    }

CARE_LSM_ENTRY(f32, float)
CARE_LSM_ENTRY(bf16, care_bf16)
CARE_LSM_ENTRY(f16, care_f16)
