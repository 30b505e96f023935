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
// Whitening: whiten_stats_f32 (one block of 1024 threads, like batch_std_f32) sums count and
// value of the counted tokens in double, then the squares centered on that mean (two-pass, never
// E[x^2] - E[x]^2), through fixed-order block reductions: no float atomics, so the result does
// not depend on the schedule. It leaves mean, 1/sqrt(var + eps), std and a status word in the
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
    care_u32 masked_reset;       // 1: the return restarts at 0 before a masked token (returns)
    care_u32 pad0;
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
// tokens get 0 and do not break the chain (with masked_reset, the return restarts at 0 before
// them, verl's rule until 2026-08). Geometry: one thread per sequence,
// grid.x = max(1, ceil(n_seq / blockDim.x)) (see `care_kernels::geometry::returns_geometry`).
extern "C" __global__ void __launch_bounds__(1024) discounted_returns_f32(CareReturnsParams p) {
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
            g = p.masked_reset != 0 ? 0.0 : g;
            p.ret[t] = 0.0f;
        }
    }
}

// GAE: delta_t = r_t + gamma * V_next - V_t, A_t = delta_t + gamma * lambda * A_next,
// R_t = A_t + V_t, over the counted tokens from the last (V and A after it are 0); masked tokens
// get 0 in both outputs. Geometry as discounted_returns_f32.
extern "C" __global__ void __launch_bounds__(1024) gae_f32(CareReturnsParams p) {
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

// Count, mean, centered sum of squares, scale and std of the counted values, into *p.stats.
// Geometry: grid (1,1,1), blockDim.x a multiple of 32 (1024 by default).
extern "C" __global__ void __launch_bounds__(1024) whiten_stats_f32(CareWhitenParams p) {
    __shared__ double scratch[CARE_WARP];
    __shared__ care_u32 uscratch[CARE_WARP];
    double cnt = 0.0, sum = 0.0;
    care_u32 bad = 0;
    for (care_u64 i = threadIdx.x; i < p.n; i += blockDim.x) {
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
    double mean = cnt > 0.0 ? sum / (cnt + p.count_eps) : 0.0;
    double m2 = 0.0;
    for (care_u64 i = threadIdx.x; i < p.n; i += blockDim.x) {
        if (care_counted(p.mask, i)) {
            double d = (double)p.x[i] - mean;
            m2 += d * d;
        }
    }
    m2 = care_block_sum(m2, scratch);
    if (threadIdx.x == 0) {
        double denom = p.unbiased != 0 ? cnt - 1.0 : cnt;
        double var = denom > 0.0 ? m2 / denom : 0.0;
        if (denom > 0.0 && p.count_eps != 0.0) {
            // verl's order: masked_mean of the squares, then the Bessel factor n / (n - 1).
            var = m2 / (cnt + p.count_eps);
            var = p.unbiased != 0 ? var * (cnt / (cnt - 1.0)) : var;
        }
        CareWhitenStats s;
        s.status = bad != 0 ? CARE_WHITEN_STATUS_NON_FINITE : 0u;
        s.pad0 = 0;
        s.count = cnt;
        s.mean = mean;
        s.m2 = m2;
        s.scale = 1.0 / sqrt(var + p.eps);
        s.std = denom > 0.0 ? sqrt(var) : 0.0;
        p.stats[0] = s;
    }
}

// x' = (x - mean) * scale on the counted values (exactly 0 for a value equal to the mean, also
// when the scale is infinite), 0 on the masked ones; nothing at all under a non-finite status.
// Geometry: any grid of blockDim.x-thread blocks; the threads stride over the values.
extern "C" __global__ void __launch_bounds__(1024) whiten_apply_f32(CareWhitenParams p) {
    const CareWhitenStats* s = p.stats;
    if (s->status != 0) {
        return;
    }
    const double mean = s->mean, scale = s->scale;
    const care_u64 stride = (care_u64)gridDim.x * blockDim.x;
    for (care_u64 i = (care_u64)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += stride) {
        float out = 0.0f;
        if (care_counted(p.mask, i)) {
            double d = (double)p.x[i] - mean;
            out = d == 0.0 ? 0.0f : care_narrow(d * scale);
        }
        p.x[i] = out;
    }
}
