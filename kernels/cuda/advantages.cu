// Group advantages for GRPO and friends (SPEC section 9), in one launch.
//
// Each group is reduced by one "team" of threads: one warp per group for small groups (8 groups per
// 256-thread block, shuffles only, no shared memory and no block barriers) or one block per group
// for large ones (shared-memory block reductions). Both paths are correct for any group size; the
// launcher picks the cheaper one. Statistics are accumulated in double: the kernel is tiny next to
// the forward pass, and double keeps near-equal rewards (1.0 vs 1.00001) as exact as the f64 CPU
// reference. "All valid rewards equal" is detected exactly (min == max), never through std > 0.
//
// Entry points: group_advantages_f32 (one launch), batch_std_f32 (a launch over the rewards that
// precedes it only when scale == batch_std, its blocks' moments merged in a fixed order; a
// multi-rank caller may instead write the global std)
// and group_alpha_f32 (one single-block launch that precedes it only under the GPG factor: the
// factor needs every group's zero-variance verdict before any advantage is written).
//
// Baselines beyond mean / leave-one-out / none: length-weighted (OPO; a team reduction of
// sum l r and sum l), external (ReMax; a per-sample baseline, no all-equal or singleton rule) and
// pass@k (the team finds the first maximum and the largest of the others; only that sample gets
// r_max - r_second). The std floor raises the std before eps is added.
//
// Groups split across ranks (SPEC section 11) use the same kernel in three phases (`mode`), with
// the trainer's all-reduce (a sum) after each of the first two: partial sums (count and f64 sum
// per group), partial squares (centered on the global mean), finalize (advantages from the
// reduced moments). batch_std_f32 then combines the group moments (Chan) instead of rewards.
#include "common.cuh"

#define CARE_BASELINE_MEAN 0u
#define CARE_BASELINE_LOO 1u
#define CARE_BASELINE_NONE 2u
#define CARE_BASELINE_LENGTH_WEIGHTED 3u
#define CARE_BASELINE_EXTERNAL 4u
#define CARE_BASELINE_PASSK 5u

#define CARE_REWEIGHT_NONE 0u
#define CARE_REWEIGHT_GPG 1u
#define CARE_REWEIGHT_NONZERO 2u

#define CARE_SCALE_GROUP_STD 0u
#define CARE_SCALE_BATCH_STD 1u
#define CARE_SCALE_NONE 2u

#define CARE_SINGLETON_ZERO 0u
#define CARE_SINGLETON_RAW 1u
#define CARE_SINGLETON_ERROR 2u

#define CARE_ADV_LOCAL 0u            // one rank: statistics from this call's rewards
#define CARE_ADV_PARTIAL_SUMS 1u     // write count and sum per group
#define CARE_ADV_PARTIAL_SQUARES 2u  // write sum (r - global mean)^2 per group
#define CARE_ADV_FINALIZE 3u         // advantages from the all-reduced moments

// Bits OR-ed into *status: a group with exactly one valid sample under the `error` policy; an
// infinite reward on a valid sample (it poisons its group; the CPU reference rejects it); a
// reduced moment that is negative or not finite (finalize).
#define CARE_STATUS_SINGLETON 1u
#define CARE_STATUS_NON_FINITE 2u
#define CARE_STATUS_INVALID_MOMENTS 4u

// Count and sum of a group's valid rewards on one rank; the layout of
// `care_core::grpo::GroupSums`, so B of them are one f64[2 * B] all-reduce buffer.
struct CareGroupSums {
    double count;
    double sum;
};

// Per-group statistics; the layout of `care_core::grpo::GroupStats`.
struct CareGroupStats {
    care_u32 count;         // valid samples
    float mean;             // mean of the valid rewards (0 for an empty group)
    float std;              // std under the chosen estimator (0 where undefined)
    care_u32 zero_variance; // 1: at least one valid sample and all valid rewards equal
};

// Mirrored by `care_kernels::params::AdvParams` (#[repr(C)], layout checked by a test against
// this file).
struct CareAdvParams {
    const float* rewards;        // [n]
    const care_u8* valid;        // [n] or null; 0 = invalid. NaN rewards are invalid regardless.
    const care_u32* offsets;     // [num_groups + 1] CSR, or null for fixed `group_size`
    float* adv;                  // [n] output
    CareGroupStats* group_stats; // [num_groups] or null
    const float* batch_std;      // device scalar, read when scale == batch_std
    const care_u32* tok_offsets; // [n + 1] or null: no token broadcast
    const care_u8* tok_mask;     // [tok_offsets[n]] or null (all tokens count)
    float* adv_tok;              // [tok_offsets[n]] output of the token broadcast
    care_u32* status;            // device word or null; CARE_STATUS_* bits are OR-ed in
    CareGroupSums* sums;         // [num_groups]: output of PARTIAL_SUMS, input of the later phases
    double* m2;                  // [num_groups]: output of PARTIAL_SQUARES, input of FINALIZE
    const float* baselines;      // [n] external baselines (baseline == external), or null
    const care_u32* lengths;     // [n] response lengths (baseline == length_weighted), or null
    double* alpha;               // device scalar: the GPG factor, written by group_alpha_f32
    care_u32 n;
    care_u32 num_groups;
    care_u32 group_size;         // fixed layout only: n == num_groups * group_size
    care_u32 baseline;           // CARE_BASELINE_*
    care_u32 scale;              // CARE_SCALE_*
    care_u32 unbiased;           // 1: divide by (count - 1), 0: by count
    care_u32 singleton;          // CARE_SINGLETON_*
    care_u32 warp_per_group;     // lanes per group (8, 16, 32: warp segments); 0: a block per group
    float eps;
    care_u32 mode;               // CARE_ADV_*
    float std_floor;             // the std is raised to at least this before eps is added
    care_u32 reweight;           // CARE_REWEIGHT_*: not NONE multiplies every advantage by *alpha
};

// The batch std's slots (`care_kernels::params::BatchStdWorkRaw`): the arrival counter of the
// slot merge (zeroed by the plan) and one slot per block.
struct CareBatchStdWork {
    care_u32 arrivals;
    care_u32 pad0[3];
    CareMoments slots[CARE_STAT_SLOTS];
};

// Mirrored by `care_kernels::params::BatchStdParams`.
struct CareBatchStdParams {
    const float* rewards;        // [n]
    const care_u8* valid;        // [n] or null
    float* out_std;              // device scalar output
    const CareGroupSums* sums;   // [num_groups] reduced moments, or null: use the rewards
    const double* m2;            // [num_groups] reduced centered squares (with `sums`)
    care_u32 n;
    care_u32 unbiased;
    care_u32 num_groups;
    care_u32 pad0;
    CareBatchStdWork* work;      // the slot merge of the rewards (rewards mode); in the workspace
};

__device__ __forceinline__ bool care_adv_valid(const CareAdvParams& p, care_u32 i, float r) {
    return !care_isnan(r) && (p.valid == 0 || p.valid[i] != 0);
}

// Sums over a team: a segment of `width` lanes of a warp (shuffles; width 8, 16 or 32) or, with
// width 0, the whole block (shared memory). `width` is uniform over the block, so the barriers
// inside the block variants are reached by every thread, and every lane of a warp reaches the
// segments' shuffles.
__device__ __forceinline__ double care_team_sum(double v, care_u32 width, double* scratch) {
    return width != 0u ? care_seg_sum(v, width) : care_block_sum(v, scratch);
}
__device__ __forceinline__ float care_team_min(float v, care_u32 width, float* scratch) {
    return width != 0u ? care_seg_min(v, width)
                       : care_block_min(v, scratch, __uint_as_float(0x7f800000u));
}
__device__ __forceinline__ float care_team_max(float v, care_u32 width, float* scratch) {
    return width != 0u ? care_seg_max(v, width)
                       : care_block_max(v, scratch, __uint_as_float(0xff800000u));
}

// Everything needed to turn a reward of the group into its advantage.
struct CareGroupCoef {
    care_u32 kind;   // 0: all zero, 1: singleton raw, 2: normal
    double mean;     // the mean, or the length-weighted mean (OPO)
    double count;
    double inv_scale; // alpha / (max(std, std_floor) + eps), or alpha when scale == none
    care_u32 best;    // pass@k: the sample that gets r - second
    double second;    // pass@k: the largest reward of the others
};

__device__ __forceinline__ float care_adv_of(const CareAdvParams& p, const CareGroupCoef& c,
                                             care_u32 i) {
    float r = p.rewards[i];
    if (!care_adv_valid(p, i, r) || c.kind == 0) {
        return 0.0f;
    }
    if (c.kind == 1) {
        return care_narrow((double)r * c.inv_scale);
    }
    double d = (double)r - c.mean;
    if (p.baseline == CARE_BASELINE_LOO) {
        // r - (sum - r)/(n - 1) == (r - mean) * n / (n - 1): no cancellation of `sum - r`.
        d = d * c.count / (c.count - 1.0);
    } else if (p.baseline == CARE_BASELINE_NONE) {
        d = (double)r;
    } else if (p.baseline == CARE_BASELINE_EXTERNAL) {
        d = (double)r - (double)p.baselines[i];
    } else if (p.baseline == CARE_BASELINE_PASSK) {
        if (i != c.best) {
            return 0.0f;
        }
        d = (double)r - c.second;
    }
    return care_narrow(d * c.inv_scale);
}

// Whether a group's advantages are all 0 (the GPG factor's M): no valid sample, a singleton
// not under `raw`, or all valid rewards equal. External baselines never zero a group.
__device__ __forceinline__ bool care_group_silent(const CareAdvParams& p, double cnt,
                                                  bool all_equal) {
    if (p.baseline == CARE_BASELINE_EXTERNAL) {
        return false;
    }
    if (cnt == 1.0) {
        return p.singleton != CARE_SINGLETON_RAW;
    }
    return all_equal;
}

// Launch geometry (see `care_kernels::geometry::advantages_geometry`): team mode (width =
// p.warp_per_group lanes, 8, 16 or 32): 32 / width groups per warp, grid.x =
// ceil(num_groups / (blockDim.x / width)); block mode (width 0): grid.x = num_groups. blockDim.x
// is a multiple of 32. Small groups take narrow teams, so that a warp keeps 4 groups of 8 in
// flight instead of one group and 24 idle lanes.
extern "C" __global__ void __launch_bounds__(256, 4) group_advantages_f32(CareAdvParams p) {
    __shared__ double dscratch[CARE_WARP];
    __shared__ float fscratch[CARE_WARP];
    const care_u32 width = p.warp_per_group;
    const bool warp_mode = width != 0u;
    care_u32 g, lane, team;
    if (warp_mode) {
        const care_u32 per_warp = CARE_WARP / width;
        const care_u32 first = (blockIdx.x * (blockDim.x / CARE_WARP) + threadIdx.x / CARE_WARP) *
                               per_warp;
        g = first + (threadIdx.x & (CARE_WARP - 1)) / width;
        lane = threadIdx.x & (width - 1u);
        team = width;
        if (first >= p.num_groups) {
            return; // a whole warp leaves together; team mode has no block barrier
        }
    } else {
        g = blockIdx.x;
        lane = threadIdx.x;
        team = blockDim.x;
        if (g >= p.num_groups) {
            return; // uniform over the block
        }
    }
    // A segment past the last group (in the last warp) takes an empty range and writes nothing,
    // but stays for its warp's shuffles.
    const bool active = g < p.num_groups;
    const bool lead = lane == 0 && active; // the lane that writes the group's results

    // Group bounds, clamped so that malformed offsets can never index out of bounds.
    care_u32 start = 0, end = 0;
    if (!active) {
        // empty
    } else if (p.offsets != 0) {
        start = p.offsets[g];
        end = p.offsets[g + 1];
        start = start < p.n ? start : p.n;
        end = end < start ? start : (end < p.n ? end : p.n);
    } else {
        start = g * p.group_size;
        end = start + p.group_size;
        end = end < p.n ? end : p.n;
    }

    // Pass 1: count, sum, min, max of the valid rewards.
    double cnt = 0.0, sum = 0.0;
    float mn = __uint_as_float(0x7f800000u), mx = __uint_as_float(0xff800000u);
    bool inf_seen = false;
    for (care_u32 i = start + lane; i < end; i += team) {
        float r = p.rewards[i];
        if (care_adv_valid(p, i, r)) {
            inf_seen = inf_seen || !care_isfinite(r);
            if (p.baseline == CARE_BASELINE_EXTERNAL && p.baselines != 0) {
                inf_seen = inf_seen || !care_isfinite(p.baselines[i]);
            }
            cnt += 1.0;
            sum += (double)r;
            mn = r < mn ? r : mn;
            mx = r > mx ? r : mx;
        }
    }
    cnt = care_team_sum(cnt, width, dscratch);
    sum = care_team_sum(sum, width, dscratch);
    mn = care_team_min(mn, width, fscratch);
    mx = care_team_max(mx, width, fscratch);
    if (inf_seen && p.status != 0) {
        atomicOr(p.status, CARE_STATUS_NON_FINITE);
    }
    if (p.mode == CARE_ADV_PARTIAL_SUMS) {
        if (lead) {
            CareGroupSums gs;
            gs.count = cnt;
            gs.sum = sum;
            p.sums[g] = gs;
        }
        return; // uniform over the team; no barrier follows
    }
    bool all_equal = mn == mx; // exact, from this call's rewards (LOCAL)
    if (p.mode != CARE_ADV_LOCAL) {
        // The global moments replace the local count and sum.
        CareGroupSums gs;
        gs.count = 0.0;
        gs.sum = 0.0;
        if (active) {
            gs = p.sums[g];
        }
        cnt = gs.count;
        sum = gs.sum;
    }
    double mean = cnt > 0.0 ? sum / cnt : 0.0;

    // Pass 2: centered sum of squares (never E[x^2] - E[x]^2).
    double ss = 0.0;
    if (p.mode == CARE_ADV_FINALIZE) {
        ss = active ? p.m2[g] : 0.0;
        // Two-pass centering makes the reduced m2 exactly 0 iff all valid rewards are equal.
        all_equal = ss == 0.0;
        // x - x == 0 exactly for finite x, and is NaN for infinities and NaN.
        bool ok = cnt - cnt == 0.0 && cnt >= 0.0 && sum - sum == 0.0 && ss - ss == 0.0 &&
                  ss >= 0.0;
        if (!ok && lead && p.status != 0) {
            atomicOr(p.status, CARE_STATUS_INVALID_MOMENTS);
        }
    } else {
        for (care_u32 i = start + lane; i < end; i += team) {
            float r = p.rewards[i];
            if (care_adv_valid(p, i, r)) {
                double d = (double)r - mean;
                ss += d * d;
            }
        }
        ss = care_team_sum(ss, width, dscratch);
    }
    if (p.mode == CARE_ADV_PARTIAL_SQUARES) {
        if (lead) {
            p.m2[g] = ss;
        }
        return; // uniform over the team
    }
    double var = 0.0;
    if (p.unbiased != 0) {
        var = cnt > 1.0 ? ss / (cnt - 1.0) : 0.0;
    } else {
        var = cnt > 0.0 ? ss / cnt : 0.0;
    }
    double std = sqrt(var);

    CareGroupCoef c;
    c.mean = mean;
    c.count = cnt;
    c.kind = 2;
    c.best = 0xffffffffu;
    c.second = 0.0;
    if (p.baseline == CARE_BASELINE_LENGTH_WEIGHTED) {
        // OPO: sum l r / sum l (the plain mean when every length is 0). LOCAL mode only.
        double lr = 0.0, l = 0.0;
        for (care_u32 i = start + lane; i < end; i += team) {
            float r = p.rewards[i];
            if (care_adv_valid(p, i, r)) {
                double len = (double)p.lengths[i];
                lr += len * (double)r;
                l += len;
            }
        }
        lr = care_team_sum(lr, width, dscratch);
        l = care_team_sum(l, width, dscratch);
        c.mean = l > 0.0 ? lr / l : mean;
    } else if (p.baseline == CARE_BASELINE_PASSK) {
        // The first sample holding the maximum, then the largest reward of the others.
        float cand = __uint_as_float(0xff800000u);
        care_u32 first = 0xffffffffu;
        for (care_u32 i = start + lane; i < end; i += team) {
            float r = p.rewards[i];
            if (care_adv_valid(p, i, r) && r == mx && i < first) {
                first = i;
            }
        }
        first = warp_mode ? care_seg_min(first, width)
                          : care_block_min(first, (care_u32*)fscratch, 0xffffffffu);
        for (care_u32 i = start + lane; i < end; i += team) {
            float r = p.rewards[i];
            if (care_adv_valid(p, i, r) && i != first) {
                cand = r > cand ? r : cand;
            }
        }
        cand = care_team_max(cand, width, fscratch);
        c.best = first;
        c.second = (double)cand;
    }
    double alpha = p.reweight != CARE_REWEIGHT_NONE ? p.alpha[0] : 1.0;
    double s = std;
    if (p.scale == CARE_SCALE_BATCH_STD) {
        s = (double)p.batch_std[0];
    }
    if (p.baseline == CARE_BASELINE_EXTERNAL && !(s > 0.0)) {
        s = 1.0; // a zero std counts as 1 for external baselines (care_core's group_map)
    }
    s = s < (double)p.std_floor ? (double)p.std_floor : s;
    c.inv_scale = p.scale == CARE_SCALE_NONE ? alpha : alpha / (s + (double)p.eps);
    if (cnt == 0.0) {
        c.kind = 0;
    } else if (p.baseline == CARE_BASELINE_EXTERNAL) {
        c.kind = 2; // not group-relative: no singleton or all-equal rule
    } else if (cnt == 1.0) {
        if (p.singleton == CARE_SINGLETON_RAW) {
            // verl: baseline 0 and std 1, so A = r / (1 + eps) under std scaling, r without.
            c.kind = 1;
            c.inv_scale = p.scale == CARE_SCALE_NONE ? alpha : alpha / (1.0 + (double)p.eps);
        } else {
            c.kind = 0;
            if (p.singleton == CARE_SINGLETON_ERROR && lead && p.status != 0) {
                atomicOr(p.status, CARE_STATUS_SINGLETON);
            }
        }
    } else if (all_equal) {
        c.kind = 0; // all valid rewards exactly equal
    }

    for (care_u32 i = start + lane; i < end; i += team) {
        p.adv[i] = care_adv_of(p, c, i);
    }
    if (lead && p.group_stats != 0) {
        CareGroupStats gs;
        gs.count = (care_u32)cnt;
        gs.mean = care_narrow(mean);
        gs.std = care_narrow(std);
        gs.zero_variance = (cnt >= 1.0 && (cnt == 1.0 || all_equal)) ? 1u : 0u;
        p.group_stats[g] = gs;
    }

    // Fused token broadcast: A_tok[t] = A[seq(t)] * mask[t]. The tokens of a group are contiguous
    // (they are the tokens of its sequences), so the team walks them sequence by sequence.
    if (p.adv_tok != 0 && p.tok_offsets != 0) {
        for (care_u32 i = start; i < end; ++i) {
            float a = care_adv_of(p, c, i);
            care_u32 ts = p.tok_offsets[i];
            care_u32 te = p.tok_offsets[i + 1];
            te = te < ts ? ts : te;
            for (care_u32 t = ts + lane; t < te; t += team) {
                p.adv_tok[t] = (p.tok_mask == 0 || p.tok_mask[t] != 0) ? a : 0.0f;
            }
        }
    }
}

// The std of all valid rewards of the batch (scale == batch_std). Geometry, from rewards: at
// most CARE_STAT_SLOTS blocks of blockDim.x <= 256 threads, block b owning the contiguous samples
// [b * per, (b + 1) * per); each block's (count, mean, M2) two-pass in double, merged by the last
// block with Chan's formula along a fixed tree (bit-identical whatever the block schedule). From
// reduced group moments (p.sums): one block.
extern "C" __global__ void __launch_bounds__(256, 4) batch_std_f32(CareBatchStdParams p) {
    __shared__ double scratch[CARE_WARP];
    __shared__ CareMoments tree[256];
    if (p.sums != 0) {
        // From reduced group moments (Chan): M2 = sum_g m2_g + sum_g n_g (mean_g - mean)^2.
        double n = 0.0, s = 0.0;
        for (care_u32 g = threadIdx.x; g < p.num_groups; g += blockDim.x) {
            n += p.sums[g].count;
            s += p.sums[g].sum;
        }
        n = care_block_sum(n, scratch);
        s = care_block_sum(s, scratch);
        double mean = n > 0.0 ? s / n : 0.0;
        double q = 0.0;
        for (care_u32 g = threadIdx.x; g < p.num_groups; g += blockDim.x) {
            double ng = p.sums[g].count;
            if (ng > 0.0) {
                double d = p.sums[g].sum / ng - mean;
                q += p.m2[g] + ng * d * d;
            }
        }
        q = care_block_sum(q, scratch);
        if (threadIdx.x == 0) {
            double denom = p.unbiased != 0 ? n - 1.0 : n;
            p.out_std[0] = denom > 0.0 ? care_narrow(sqrt(q / denom)) : 0.0f;
        }
        return; // uniform over the block
    }
    const care_u64 per = ((care_u64)p.n + gridDim.x - 1u) / gridDim.x;
    const care_u64 lo = (care_u64)blockIdx.x * per < p.n ? (care_u64)blockIdx.x * per : p.n;
    const care_u64 hi = lo + per < p.n ? lo + per : p.n;
    double cnt = 0.0, sum = 0.0;
    for (care_u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float r = p.rewards[i];
        if (!care_isnan(r) && (p.valid == 0 || p.valid[i] != 0)) {
            cnt += 1.0;
            sum += (double)r;
        }
    }
    cnt = care_block_sum(cnt, scratch);
    sum = care_block_sum(sum, scratch);
    const double mean = cnt > 0.0 ? sum / cnt : 0.0;
    double ss = 0.0;
    for (care_u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float r = p.rewards[i];
        if (!care_isnan(r) && (p.valid == 0 || p.valid[i] != 0)) {
            double d = (double)r - mean;
            ss += d * d;
        }
    }
    ss = care_block_sum(ss, scratch);
    CareBatchStdWork* w = p.work;
    if (threadIdx.x == 0) {
        CareMoments mine;
        mine.count = cnt;
        mine.mean = mean;
        mine.m2 = ss;
        mine.bad = 0;
        mine.pad0 = 0;
        w->slots[blockIdx.x] = mine;
    }
    if (!care_last_block(&w->arrivals)) {
        return;
    }
    const CareMoments m = care_moments_merge_slots(w->slots, gridDim.x, tree);
    if (threadIdx.x == 0) {
        double var = 0.0;
        if (p.unbiased != 0) {
            var = m.count > 1.0 ? m.m2 / (m.count - 1.0) : 0.0;
        } else {
            var = m.count > 0.0 ? m.m2 / m.count : 0.0;
        }
        p.out_std[0] = care_narrow(sqrt(var));
    }
}

// The GPG factor alpha = N / (N - M) (1 when N = M) into *p.alpha: N valid samples, M of them
// in groups whose advantages are all 0 (care_group_silent); under CARE_REWEIGHT_NONZERO (verl's
// gpg, LOCAL only) alpha = N / max(1, K), K the valid samples with a nonzero reward. Geometry:
// grid (1,1,1), blockDim.x a multiple of 32; each warp takes every nwarps-th group. LOCAL
// decides "all equal" from the rewards (min == max), FINALIZE from the reduced moments (count,
// m2 == 0).
extern "C" __global__ void __launch_bounds__(1024, 1) group_alpha_f32(CareAdvParams p) {
    __shared__ double scratch[CARE_WARP];
    const care_u32 lane = threadIdx.x & (CARE_WARP - 1);
    const care_u32 warp = threadIdx.x / CARE_WARP;
    const care_u32 nwarps = blockDim.x / CARE_WARP;
    double n_all = 0.0, m_all = 0.0; // lane 0 of each warp accumulates
    for (care_u32 g = warp; g < p.num_groups; g += nwarps) {
        care_u32 start, end;
        if (p.offsets != 0) {
            start = p.offsets[g];
            end = p.offsets[g + 1];
            start = start < p.n ? start : p.n;
            end = end < start ? start : (end < p.n ? end : p.n);
        } else {
            start = g * p.group_size;
            end = start + p.group_size;
            end = end < p.n ? end : p.n;
        }
        double cnt = 0.0, nonzero = 0.0;
        float mn = __uint_as_float(0x7f800000u), mx = __uint_as_float(0xff800000u);
        for (care_u32 i = start + lane; i < end; i += CARE_WARP) {
            float r = p.rewards[i];
            if (care_adv_valid(p, i, r)) {
                cnt += 1.0;
                nonzero += r != 0.0f ? 1.0 : 0.0;
                mn = r < mn ? r : mn;
                mx = r > mx ? r : mx;
            }
        }
        cnt = care_warp_sum(cnt);
        nonzero = care_warp_sum(nonzero);
        mn = care_warp_min(mn);
        mx = care_warp_max(mx);
        bool all_equal = mn == mx;
        if (p.mode == CARE_ADV_FINALIZE) {
            cnt = p.sums[g].count;
            all_equal = p.m2[g] == 0.0;
        }
        if (lane == 0) {
            n_all += cnt;
            if (p.reweight == CARE_REWEIGHT_NONZERO) {
                m_all += nonzero; // here m_all counts the nonzero rewards
            } else {
                m_all += (cnt > 0.0 && care_group_silent(p, cnt, all_equal)) ? cnt : 0.0;
            }
        }
    }
    n_all = care_block_sum(n_all, scratch);
    m_all = care_block_sum(m_all, scratch);
    if (threadIdx.x == 0) {
        if (p.reweight == CARE_REWEIGHT_NONZERO) {
            p.alpha[0] = n_all / (m_all > 1.0 ? m_all : 1.0);
        } else {
            p.alpha[0] = n_all - m_all > 0.0 ? n_all / (n_all - m_all) : 1.0;
        }
    }
}
