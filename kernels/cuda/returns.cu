// Token-level estimators (SPEC section 18): discounted returns (REINFORCE++), GAE over token
// rewards and values, and masked whitening over the counted tokens of the batch.
//
// Returns and GAE: one thread per sequence runs the reverse scan over its tokens, exactly as the
// CPU reference does (double accumulation, the same operations in the same order, rounded to f32
// once per output). Why not a segmented parallel scan: a sequence is at most a few thousand (tens
// of thousands) tokens, the scan is two or three double operations per token and memory-bound,
// and a parallel scan would reassociate the recurrence, so the GPU would no longer equal the CPU
// bit for bit. The additions and multiplications go through care_dadd/care_dmul (round-to-nearest
// intrinsics that the compiler never contracts into an FMA): the CPU reference rounds every
// product and sum, and so does the kernel, which makes the outputs bit-identical to it.
//
// Whitening: whiten_stats_f32 (up to CARE_STAT_SLOTS blocks over contiguous ranges) sums count
// and value of each block's counted tokens in double, then the squares centered on the block's
// mean (two-pass, never E[x^2] - E[x]^2), and the last block merges the blocks' (count, mean,
// M2) with Chan's formula in a fixed order: no float atomics, so the result does not depend on
// the schedule. It leaves mean, 1/sqrt(var + eps), std and a status word in the
// caller's workspace; whiten_apply_f32 (a grid-stride pass) then rewrites the values in place, or
// leaves them untouched when the status reports a non-finite counted value (the CPU reference
// refuses that call before writing anything).
#include "common.cuh"

// Status bits of the returns/GAE word (workspace[0]): the sequence offsets are not a CSR layout
// of n_tok tokens (offsets[0] != 0, a decreasing pair, or offsets[n_seq] != n_tok). The kernels
// clamp every offset into 0..=n_tok, so such a layout never indexes out of bounds.
#define CARE_TOKENS_STATUS_LAYOUT 1u
// Status bits of the whitening word (CareWhitenStats.status): a counted value is NaN or +-inf.
#define CARE_WHITEN_STATUS_NON_FINITE 1u

// Mirrored by `care_kernels::params::ReturnsParams`.
struct CareReturnsParams {
    const float* rewards;        // [n_tok] token rewards
    const float* values;         // [n_tok] critic values (gae_f32), null for returns
    const care_u32* seq_offsets; // [n_seq + 1] CSR
    const care_u8* mask;         // [n_tok] or null (every token counts); 0 = masked
    float* adv;                  // [n_tok] GAE advantages (gae_f32)
    float* ret;                  // [n_tok] returns (discounted returns, or A + V for GAE)
    care_u32* status;            // device word; CARE_TOKENS_STATUS_* bits are OR-ed in
    care_u32 n_seq;
    care_u32 n_tok;
    double gamma;
    double lambda;
};

// The whitening statistics in the workspace (`care_kernels::params::WhitenStatsRaw`): written
// by whiten_stats_f32, read by whiten_apply_f32 and by the host.
struct CareWhitenStats {
    care_u32 status; // CARE_WHITEN_STATUS_* bits
    care_u32 pad0;
    double count;    // counted values
    double mean;     // their mean (0 when none)
    double m2;       // sum of squared deviations from the mean
    double scale;    // 1 / sqrt(var + eps)
    double std;      // the std under the chosen estimator (0 where undefined)
};

// Mirrored by `care_kernels::params::WhitenParams`.
struct CareWhitenParams {
    float* x;               // [n] values, whitened in place
    const care_u8* mask;    // [n] or null
    CareWhitenStats* stats; // the workspace
    care_u64 n;
    double eps;
    care_u32 unbiased; // 1: divide by (count - 1), 0: by count
    care_u32 pad0;
};

__device__ __forceinline__ bool care_counted(const care_u8* mask, care_u64 t) {
    return mask == 0 || mask[t] != 0;
}

// Sequence `s`'s token range, clamped into 0..=n_tok; flags a malformed pair in the status.
// Thread 0 also checks both ends of the offsets (also when there is no sequence).
__device__ __forceinline__ bool care_token_range(const CareReturnsParams& p, care_u32 s,
                                                 care_u32* start, care_u32* end) {
    care_u32 gid = blockIdx.x * blockDim.x + threadIdx.x;
    bool bad = false;
    if (gid == 0) {
        bad = p.seq_offsets[0] != 0 || p.seq_offsets[p.n_seq] != p.n_tok;
    }
    bool mine = s < p.n_seq;
    care_u32 a = 0, b = 0;
    if (mine) {
        a = p.seq_offsets[s];
        b = p.seq_offsets[s + 1];
        bad = bad || a > b || b > p.n_tok;
        a = a < p.n_tok ? a : p.n_tok;
        b = b < a ? a : (b < p.n_tok ? b : p.n_tok);
    }
    if (bad) {
        atomicOr(p.status, CARE_TOKENS_STATUS_LAYOUT);
    }
    *start = a;
    *end = b;
    return mine;
}

// G_t = r_t + gamma * G_next over the counted tokens of each sequence, from the last; masked
// tokens get 0 and do not break the chain. Geometry: one thread per sequence,
// grid.x = max(1, ceil(n_seq / blockDim.x)) (see `care_kernels::geometry::returns_geometry`).
extern "C" __global__ void __launch_bounds__(64, 16) discounted_returns_f32(CareReturnsParams p) {
    care_u32 s = blockIdx.x * blockDim.x + threadIdx.x;
    care_u32 start, end;
    if (!care_token_range(p, s, &start, &end)) {
        return;
    }
    double g = 0.0;
    for (care_u32 t = end; t > start;) {
        --t;
        if (care_counted(p.mask, t)) {
            g = care_dadd((double)p.rewards[t], care_dmul(p.gamma, g));
            p.ret[t] = care_narrow(g);
        } else {
            p.ret[t] = 0.0f;
        }
    }
}

// GAE: delta_t = r_t + gamma * V_next - V_t, A_t = delta_t + gamma * lambda * A_next,
// R_t = A_t + V_t, over the counted tokens from the last (V and A after it are 0); masked tokens
// get 0 in both outputs. Geometry as discounted_returns_f32.
extern "C" __global__ void __launch_bounds__(64, 16) gae_f32(CareReturnsParams p) {
    care_u32 s = blockIdx.x * blockDim.x + threadIdx.x;
    care_u32 start, end;
    if (!care_token_range(p, s, &start, &end)) {
        return;
    }
    const double gl = care_dmul(p.gamma, p.lambda);
    double next_v = 0.0, last = 0.0;
    for (care_u32 t = end; t > start;) {
        --t;
        if (!care_counted(p.mask, t)) {
            p.adv[t] = 0.0f;
            p.ret[t] = 0.0f;
            continue;
        }
        double v = (double)p.values[t];
        double delta = care_dadd(care_dadd((double)p.rewards[t], care_dmul(p.gamma, next_v)), -v);
        last = care_dadd(delta, care_dmul(gl, last));
        p.adv[t] = care_narrow(last);
        p.ret[t] = care_narrow(care_dadd(last, v));
        next_v = v;
    }
}

// The workspace of the whitening (`care_kernels::params::WhitenWorkRaw`): the statistics that
// whiten_apply_f32 and the host read, the arrival counter of the slot merge (zeroed by the plan)
// and one slot per block.
struct CareWhitenWork {
    CareWhitenStats stats;
    care_u32 arrivals;
    care_u32 pad0[3];
    CareMoments slots[CARE_STAT_SLOTS];
};

// Count, mean, centered sum of squares, scale and std of the counted values, into the
// workspace. Geometry: at most CARE_STAT_SLOTS blocks, block b owning the contiguous values
// [b * per, (b + 1) * per), per = ceil(n / gridDim.x). Each block makes its (count, mean, M2)
// with two passes over its values (sum, then squares centered on the block's mean) and
// fixed-order block reductions; the last block to finish merges the slots with Chan's formula
// along a fixed tree (slot i with slot i + s for s = 1, 2, 4, ...): the same bits on every run,
// whatever the block schedule.
extern "C" __global__ void __launch_bounds__(256, 4) whiten_stats_f32(CareWhitenParams p) {
    __shared__ double scratch[CARE_WARP];
    __shared__ care_u32 uscratch[CARE_WARP];
    __shared__ CareMoments tree[256];
    CareWhitenWork* w = (CareWhitenWork*)p.stats;
    const care_u64 per = (p.n + gridDim.x - 1u) / gridDim.x;
    const care_u64 lo = (care_u64)blockIdx.x * per;
    const care_u64 hi = lo + per < p.n ? lo + per : p.n;
    double cnt = 0.0, sum = 0.0;
    care_u32 bad = 0;
    for (care_u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        if (care_counted(p.mask, i)) {
            float v = p.x[i];
            bad |= care_isfinite(v) ? 0u : 1u;
            cnt += 1.0;
            sum += (double)v;
        }
    }
    cnt = care_block_sum(cnt, scratch);
    sum = care_block_sum(sum, scratch);
    bad = care_block_max(bad, uscratch, 0u);
    const double mean = cnt > 0.0 ? sum / cnt : 0.0;
    double m2 = 0.0;
    for (care_u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        if (care_counted(p.mask, i)) {
            double d = (double)p.x[i] - mean;
            m2 += d * d;
        }
    }
    m2 = care_block_sum(m2, scratch);
    if (threadIdx.x == 0) {
        CareMoments mine;
        mine.count = cnt;
        mine.mean = mean;
        mine.m2 = m2;
        mine.bad = bad;
        mine.pad0 = 0;
        w->slots[blockIdx.x] = mine;
    }
    if (!care_last_block(&w->arrivals)) {
        return;
    }
    const CareMoments r = care_moments_merge_slots(w->slots, gridDim.x, tree);
    if (threadIdx.x == 0) {
        const double denom = p.unbiased != 0 ? r.count - 1.0 : r.count;
        const double var = denom > 0.0 ? r.m2 / denom : 0.0;
        CareWhitenStats st;
        st.status = r.bad != 0 ? CARE_WHITEN_STATUS_NON_FINITE : 0u;
        st.pad0 = 0;
        st.count = r.count;
        st.mean = r.mean;
        st.m2 = r.m2;
        st.scale = 1.0 / sqrt(var + p.eps);
        st.std = denom > 0.0 ? sqrt(var) : 0.0;
        w->stats = st;
    }
}

// x' = (x - mean) * scale for a counted value (exactly 0 for a value equal to the mean, also
// when the scale is infinite), 0 for a masked one.
__device__ __forceinline__ float care_whiten_one(const CareWhitenParams& p, care_u64 i, float x,
                                                 double mean, double scale) {
    if (!care_counted(p.mask, i)) {
        return 0.0f;
    }
    const double d = (double)x - mean;
    return d == 0.0 ? 0.0f : care_narrow(d * scale);
}

// The values whitened in place; nothing at all under a non-finite status. Geometry: any grid of
// blockDim.x-thread blocks; the threads stride over 16-byte vectors of 4 values (two in flight
// per thread), after a scalar head that reaches 16-byte alignment.
extern "C" __global__ void __launch_bounds__(256, 4) whiten_apply_f32(CareWhitenParams p) {
    const CareWhitenStats* s = p.stats;
    if (s->status != 0) {
        return;
    }
    const double mean = s->mean, scale = s->scale;
    const care_u64 stride = (care_u64)gridDim.x * blockDim.x;
    const care_u64 gid = (care_u64)blockIdx.x * blockDim.x + threadIdx.x;
    care_u64 head = ((16u - (care_u32)((care_u64)p.x & 15u)) & 15u) / 4u;
    head = head < p.n ? head : p.n;
    for (care_u64 i = gid; i < head; i += stride) {
        p.x[i] = care_whiten_one(p, i, p.x[i], mean, scale);
    }
    const care_u64 nvec = (p.n - head) / 4u;
    CareVec16* vx = (CareVec16*)(p.x + head);
    care_u64 k = gid;
    for (; k + stride < nvec; k += 2 * stride) {
        CareVec16 a = vx[k];
        CareVec16 b = vx[k + stride];
        const care_u64 ia = head + 4u * k, ib = head + 4u * (k + stride);
        CARE_UNROLL
        for (int q = 0; q < 4; ++q) {
            a.w[q] = __float_as_uint(care_whiten_one(p, ia + q, __uint_as_float(a.w[q]), mean, scale));
            b.w[q] = __float_as_uint(care_whiten_one(p, ib + q, __uint_as_float(b.w[q]), mean, scale));
        }
        vx[k] = a;
        vx[k + stride] = b;
    }
    if (k < nvec) {
        CareVec16 a = vx[k];
        const care_u64 ia = head + 4u * k;
        CARE_UNROLL
        for (int q = 0; q < 4; ++q) {
            a.w[q] = __float_as_uint(care_whiten_one(p, ia + q, __uint_as_float(a.w[q]), mean, scale));
        }
        vx[k] = a;
    }
    for (care_u64 i = head + 4u * nvec + gid; i < p.n; i += stride) {
        p.x[i] = care_whiten_one(p, i, p.x[i], mean, scale);
    }
}
