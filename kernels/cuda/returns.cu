// Token-level estimators (SPEC section 18): discounted returns (REINFORCE++), GAE over token
// rewards and values, and masked whitening over the counted tokens of the batch.
//
// Returns and GAE: one warp per sequence stages its tokens through shared memory in coalesced
// tiles, and one lane runs the reverse scan over each tile exactly as the CPU reference does
// (double accumulation, the same operations in the same order, rounded to f32 once per output).
// Why not a segmented parallel scan: a sequence is at most a few thousand (tens
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
// refuses that call before writing anything). The _f64 pair whitens the unrounded double values
// that a returns or GAE scan left in the workspace (`wide`) into float outputs: the CPU's
// discounted_returns_whitened and gae_whitened, which never round before whitening.
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
    care_u32 masked_reset;       // 1: the return restarts at 0 before a masked token (returns)
    care_u32 pad0;
    // [n_tok] or null: the values to whiten in double (the returns, or the GAE advantages, which
    // then go only here), so that the whitening reads them unrounded (verl's f64 chain).
    double* wide;
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
    double count_eps;  // added to the count in both means (verl's masked_mean: 1e-8)
    // [n] or null: the values to whiten in double (whiten_*_f64 read them and write the
    // whitened floats into x); the plan places &wide[i] 32-byte aligned where &x[i] is 16.
    const double* wide;
};

__device__ __forceinline__ bool care_counted(const care_u8* mask, care_u64 t) {
    return mask == 0 || mask[t] != 0;
}

// Sequence `s`'s token range, clamped into 0..=n_tok; flags a malformed pair in the status.
// Lane 0 of warp 0 of block 0 also checks both ends of the offsets (also when there is no
// sequence). Called by lane 0 of each warp.
__device__ __forceinline__ bool care_token_range(const CareReturnsParams& p, care_u32 s,
                                                 care_u32* start, care_u32* end) {
    bool bad = false;
    if (blockIdx.x == 0 && threadIdx.x == 0) {
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

// Returns and GAE: one warp per sequence. The warp stages the sequence through shared memory in
// tiles of CARE_RET_TILE tokens from its end: the lanes load a tile with coalesced loads (and
// the next tile's loads are in flight while it is scanned), lane 0 runs the serial recurrence
// over the tile backwards, and the lanes store the tile's outputs with coalesced stores. The
// recurrence is the CPU reference's, operation for operation.
#define CARE_RET_BLOCK 64 // threads per block (the launch bounds): 2 warps, 2 sequences
#define CARE_RET_WARPS (CARE_RET_BLOCK / CARE_WARP)
#define CARE_RET_TILE 128 // tokens per tile: 4 per lane
#define CARE_RET_PER_LANE (CARE_RET_TILE / CARE_WARP)

// One tile of a sequence in shared memory (per warp).
struct CareRetTile {
    float r[CARE_RET_TILE];  // rewards
    float v[CARE_RET_TILE];  // values (GAE)
    float a[CARE_RET_TILE];  // output: advantages (GAE)
    float g[CARE_RET_TILE];  // output: returns
    double w[CARE_RET_TILE]; // output: the unrounded value to whiten (with p.wide)
    care_u8 m[CARE_RET_TILE]; // counted
};

// A lane's share of a tile in registers (the prefetch of the next tile).
struct CareRetLane {
    float r[CARE_RET_PER_LANE];
    float v[CARE_RET_PER_LANE];
    care_u8 m[CARE_RET_PER_LANE];
};

__device__ __forceinline__ void care_ret_fetch(const CareReturnsParams& p, bool gae, care_u32 lo,
                                               care_u32 n, care_u32 lane, CareRetLane& x) {
    for (int q = 0; q < CARE_RET_PER_LANE; ++q) {
        const care_u32 j = lane + (care_u32)q * CARE_WARP;
        x.r[q] = j < n ? p.rewards[lo + j] : 0.0f;
        x.v[q] = (gae && j < n) ? p.values[lo + j] : 0.0f;
        x.m[q] = (j < n && care_counted(p.mask, lo + j)) ? 1 : 0;
    }
}

__device__ __forceinline__ void care_ret_stage(const CareRetLane& x, care_u32 lane,
                                               CareRetTile& t) {
    for (int q = 0; q < CARE_RET_PER_LANE; ++q) {
        const care_u32 j = lane + (care_u32)q * CARE_WARP;
        t.r[j] = x.r[q];
        t.v[j] = x.v[q];
        t.m[j] = x.m[q];
    }
}

// One step of the discounted return at a token, from the later tokens' G. A masked token gets 0
// and leaves the chain as it was, or with `reset` restarts it at 0 (verl's rule until 2026-08).
__device__ __forceinline__ float care_return_step(double gamma, double& g, float r, bool counted,
                                                  bool reset) {
    if (!counted) {
        g = reset ? 0.0 : g;
        return 0.0f;
    }
    g = care_dadd((double)r, care_dmul(gamma, g));
    return care_narrow(g);
}

// One step of GAE at a token: A and R = A + V into *adv and *ret, from the later tokens'
// (next_v, last). A masked token gets 0 in both and leaves the chain as it was.
__device__ __forceinline__ void care_gae_step(double gamma, double gl, double& next_v,
                                              double& last, float r, float v_f, bool counted,
                                              float* adv, float* ret) {
    if (!counted) {
        *adv = 0.0f;
        *ret = 0.0f;
        return;
    }
    const double v = (double)v_f;
    const double delta = care_dadd(care_dadd((double)r, care_dmul(gamma, next_v)), -v);
    last = care_dadd(delta, care_dmul(gl, last));
    *adv = care_narrow(last);
    *ret = care_narrow(care_dadd(last, v));
    next_v = v;
}

// The scan of one sequence by its warp (GAE with `gae`, else the discounted return). Every lane
// of the warp calls it.
__device__ __forceinline__ void care_ret_sequence(const CareReturnsParams& p, bool gae,
                                                  care_u32 start, care_u32 end, care_u32 lane,
                                                  CareRetTile& t) {
    const double gamma = p.gamma;
    const double gl = care_dmul(p.gamma, p.lambda);
    const bool reset = p.masked_reset != 0; // returns only: the plan refuses it for GAE
    double g = 0.0, next_v = 0.0, last = 0.0; // lane 0's recurrence state
    CareRetLane x;
    care_u32 hi = end;
    care_u32 lo = hi - start > CARE_RET_TILE ? hi - CARE_RET_TILE : start;
    care_ret_fetch(p, gae, lo, hi - lo, lane, x);
    while (hi > start) {
        const care_u32 n = hi - lo;
        care_ret_stage(x, lane, t);
        __syncwarp();
        // The next tile's loads go out now and land while lane 0 scans this one.
        const care_u32 nlo = lo - start > CARE_RET_TILE ? lo - CARE_RET_TILE : start;
        if (lo > start) {
            care_ret_fetch(p, gae, nlo, lo - nlo, lane, x);
        }
        if (lane == 0) {
            for (care_u32 k = n; k > 0;) {
                --k;
                const bool on = t.m[k] != 0;
                if (gae) {
                    care_gae_step(gamma, gl, next_v, last, t.r[k], t.v[k], on, &t.a[k], &t.g[k]);
                    t.w[k] = on ? last : 0.0;
                } else {
                    t.g[k] = care_return_step(gamma, g, t.r[k], on, reset);
                    t.w[k] = on ? g : 0.0;
                }
            }
        }
        __syncwarp();
        for (care_u32 j = lane; j < n; j += CARE_WARP) {
            p.ret[lo + j] = t.g[j];
            if (p.wide != 0) {
                p.wide[lo + j] = t.w[j];
            } else if (gae) {
                p.adv[lo + j] = t.a[j];
            }
        }
        __syncwarp(); // the tile is free for the next one
        hi = lo;
        lo = nlo;
    }
}

// Discounted returns (gae = false) or GAE, one warp per sequence. Geometry: blocks of
// CARE_RET_BLOCK threads (or 32), grid.x = max(1, ceil(n_seq / warps per block)) (see
// `care_kernels::geometry::returns_geometry`); one thread checks the offsets' ends even with no
// sequence.
__device__ __forceinline__ void care_returns(const CareReturnsParams& p, bool gae) {
    __shared__ CareRetTile tiles[CARE_RET_WARPS];
    const care_u32 lane = threadIdx.x & (CARE_WARP - 1);
    const care_u32 warp = threadIdx.x / CARE_WARP;
    const care_u32 s = blockIdx.x * (blockDim.x / CARE_WARP) + warp;
    care_u32 start = 0, end = 0;
    bool mine = false;
    if (lane == 0) {
        mine = care_token_range(p, s, &start, &end);
    }
    mine = __shfl_sync(CARE_FULL_MASK, mine ? 1u : 0u, 0) != 0u;
    start = __shfl_sync(CARE_FULL_MASK, start, 0);
    end = __shfl_sync(CARE_FULL_MASK, end, 0);
    if (!mine) {
        return; // the whole warp: no block barrier follows
    }
    care_ret_sequence(p, gae, start, end, lane, tiles[warp]);
}

// G_t = r_t + gamma * G_next over the counted tokens of each sequence, from the last; masked
// tokens get 0 and do not break the chain (with masked_reset, the return restarts at 0 before
// them).
extern "C" __global__ void __launch_bounds__(CARE_RET_BLOCK, 16)
    discounted_returns_f32(CareReturnsParams p) {
    care_returns(p, false);
}

// GAE: delta_t = r_t + gamma * V_next - V_t, A_t = delta_t + gamma * lambda * A_next,
// R_t = A_t + V_t, over the counted tokens from the last (V and A after it are 0); masked tokens
// get 0 in both outputs.
extern "C" __global__ void __launch_bounds__(CARE_RET_BLOCK, 16) gae_f32(CareReturnsParams p) {
    care_returns(p, true);
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
template <typename T>
__device__ __forceinline__ void care_whiten_stats(const CareWhitenParams& p, const T* x) {
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
            const double v = (double)x[i];
            bad |= care_isfinite_d(v) ? 0u : 1u;
            cnt += 1.0;
            sum += v;
        }
    }
    cnt = care_block_sum(cnt, scratch);
    sum = care_block_sum(sum, scratch);
    bad = care_block_max(bad, uscratch, 0u);
    const double mean = cnt > 0.0 ? sum / cnt : 0.0;
    double m2 = 0.0;
    for (care_u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        if (care_counted(p.mask, i)) {
            double d = (double)x[i] - mean;
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
        double mean = r.mean, m2 = r.m2;
        double var = denom > 0.0 ? m2 / denom : 0.0;
        if (p.count_eps != 0.0 && r.count > 0.0) {
            // verl's masked_mean: the mean is sum / (count + count_eps), and the squares are
            // centered on it (the exact M2 plus count * (exact mean - that mean)^2).
            mean = care_dmul(r.mean, r.count) / (r.count + p.count_eps);
            const double d = r.mean - mean;
            m2 = r.m2 + r.count * (d * d);
            if (denom > 0.0) {
                // verl's order: masked_mean of the squares, then the Bessel factor n / (n - 1).
                var = m2 / (r.count + p.count_eps);
                var = p.unbiased != 0 ? var * (r.count / (r.count - 1.0)) : var;
            }
        }
        CareWhitenStats st;
        st.status = r.bad != 0 ? CARE_WHITEN_STATUS_NON_FINITE : 0u;
        st.pad0 = 0;
        st.count = r.count;
        st.mean = mean;
        st.m2 = m2;
        st.scale = 1.0 / sqrt(var + p.eps);
        // The std of the centered squares over the estimator's denominator, as the CPU's
        // (without count_eps: sqrt(var)).
        st.std = denom > 0.0 ? sqrt(m2 / denom) : 0.0;
        w->stats = st;
    }
}

// The statistics of the float values x.
extern "C" __global__ void __launch_bounds__(256, 4) whiten_stats_f32(CareWhitenParams p) {
    care_whiten_stats<float>(p, p.x);
}

// The statistics of the double values wide (the f64 chain after returns or GAE).
extern "C" __global__ void __launch_bounds__(256, 4) whiten_stats_f64(CareWhitenParams p) {
    care_whiten_stats<double>(p, p.wide);
}

// x' = (x - mean) * scale for a counted value (exactly 0 for a value equal to the mean, also
// when the scale is infinite), 0 for a masked one.
__device__ __forceinline__ float care_whiten_one(const CareWhitenParams& p, care_u64 i, double x,
                                                 double mean, double scale) {
    if (!care_counted(p.mask, i)) {
        return 0.0f;
    }
    const double d = x - mean;
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

// The double values p.wide whitened into the floats p.x (masked: 0); nothing at all under a
// non-finite status. Geometry as whiten_apply_f32: each thread takes 4 values at a time, two
// 16-byte vectors of doubles in and one 16-byte vector of floats out, after a scalar head that
// brings x to a 16-byte boundary (the plan aligns wide to 32 bytes there; any other alignment
// runs the scalar loop).
extern "C" __global__ void __launch_bounds__(256, 4) whiten_apply_f64(CareWhitenParams p) {
    const CareWhitenStats* s = p.stats;
    if (s->status != 0) {
        return;
    }
    const double mean = s->mean, scale = s->scale;
    const care_u64 stride = (care_u64)gridDim.x * blockDim.x;
    const care_u64 gid = (care_u64)blockIdx.x * blockDim.x + threadIdx.x;
    care_u64 head = ((16u - (care_u32)((care_u64)p.x & 15u)) & 15u) / 4u;
    head = head < p.n ? head : p.n;
    const bool vec = ((care_u64)(p.wide + head) & 31u) == 0u; // uniform
    const care_u64 nvec = vec ? (p.n - head) / 4u : 0u;
    for (care_u64 i = gid; i < head; i += stride) {
        p.x[i] = care_whiten_one(p, i, p.wide[i], mean, scale);
    }
    const CareVec16* vw = (const CareVec16*)(p.wide + head);
    CareVec16* vx = (CareVec16*)(p.x + head);
    for (care_u64 k = gid; k < nvec; k += stride) {
        const CareVec16 a = vw[2u * k];
        const CareVec16 b = vw[2u * k + 1u];
        const care_u64 i = head + 4u * k;
        double w[4];
        w[0] = __longlong_as_double((long long)(((care_u64)a.w[1] << 32) | a.w[0]));
        w[1] = __longlong_as_double((long long)(((care_u64)a.w[3] << 32) | a.w[2]));
        w[2] = __longlong_as_double((long long)(((care_u64)b.w[1] << 32) | b.w[0]));
        w[3] = __longlong_as_double((long long)(((care_u64)b.w[3] << 32) | b.w[2]));
        CareVec16 o;
        CARE_UNROLL
        for (int q = 0; q < 4; ++q) {
            o.w[q] = __float_as_uint(care_whiten_one(p, i + q, w[q], mean, scale));
        }
        vx[k] = o;
    }
    for (care_u64 i = head + 4u * nvec + gid; i < p.n; i += stride) {
        p.x[i] = care_whiten_one(p, i, p.wide[i], mean, scale);
    }
}
