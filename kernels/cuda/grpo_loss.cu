// Fused policy loss, its analytic gradient and its stats (SPEC §10, §16 the rollout correction,
// §17 the policy-loss family): the clipped ratio at token, sequence
// (GSPO) or sequence-token (GSPO-token) level, CISPO, SAPO, GPG and GMPO, every aggregation,
// the KL term, and the rollout correction (truncated importance weights and rejection) with its
// diagnostics, and Clip-Cov and KL-Cov, whose call-wide top-k of covariances is chosen by the
// grpo_cov_* pre-passes below before the loss pass reads it.
//
// One block per (sequence, chunk): grid = (n_seq, chunks), blockDim.x a multiple of 32. Block
// (i, y) owns the tokens start_i + y*blockDim.x + k*chunks*blockDim.x of sequence i, so a long
// sequence is spread over `chunks` blocks and every block reads coalesced runs. The token-level
// path reads each input once and writes the gradient once; only seq_mean_token_mean first scans
// the u8 mask for the per-sequence count n_i. Whatever needs a whole-sequence quantity before
// any gradient can be written reads the sequence again in each chunk block, as a segmented
// (per-block) reduction: the GSPO mean log ratio and its masked sum, GMPO's mean clipped log
// ratio, and the rollout correction's sequence statistics (sum of log ratios, sums and maxima
// of k1/k2/k3), whose verdict and sequence weight every token of the sequence needs.
//
// Stats are reduced per block into the block's slot of the workspace (CareLossWork); the last
// block to finish merges the slots in slot order and adds the result to the caller's device
// structs, which the caller initializes (sums 0, ratio_min +inf, ratio_max 0), so micro-batches
// accumulate. No float atomics: the statistics are the same bit for bit on every run, whatever
// the block schedule.
#include "common.cuh"

#define CARE_AGG_TOKEN_MEAN 0u
#define CARE_AGG_SEQ_MEAN_TOKEN_MEAN 1u
#define CARE_AGG_SEQ_MEAN_TOKEN_SUM 2u
#define CARE_AGG_SEQ_MEAN_TOKEN_SUM_NORM 3u
#define CARE_AGG_TOKEN_SUM 4u
#define CARE_AGG_TOKEN_SUM_NORM 5u

// `care_core::grpo::PolicyLoss` values the kernel implements.
#define CARE_PL_CLIP 0u
#define CARE_PL_CISPO 1u
#define CARE_PL_SAPO 2u
#define CARE_PL_GPG 3u
#define CARE_PL_CLIP_COV 4u
#define CARE_PL_KL_COV 5u
#define CARE_PL_GMPO 6u
#define CARE_PL_VESPO 7u

// VESPO's bounds on the sequence's log importance ratio: [ln 1e-8, 20] (TRL's).
#define CARE_VESPO_LOG_W_MIN (-18.420680743952367f)
#define CARE_VESPO_LOG_W_MAX 20.0f

// `care_core::grpo::RatioLevel` values.
#define CARE_RATIO_TOKEN 0u
#define CARE_RATIO_SEQUENCE 1u
#define CARE_RATIO_SEQUENCE_TOKEN 2u

// `care_core::grpo::IsLevel` values.
#define CARE_IS_OFF 0u
#define CARE_IS_TOKEN 1u
#define CARE_IS_SEQUENCE 2u

// `care_core::grpo::Rejection` values (bit k of `rej_on`, index k of `rej_lower`/`rej_upper`).
#define CARE_REJ_TOKEN_K1 0
#define CARE_REJ_TOKEN_K2 1
#define CARE_REJ_TOKEN_K3 2
#define CARE_REJ_SEQ_SUM_K1 3
#define CARE_REJ_SEQ_SUM_K2 4
#define CARE_REJ_SEQ_SUM_K3 5
#define CARE_REJ_SEQ_MEAN_K1 6
#define CARE_REJ_SEQ_MEAN_K2 7
#define CARE_REJ_SEQ_MEAN_K3 8
#define CARE_REJ_SEQ_MAX_K2 9
#define CARE_REJ_SEQ_MAX_K3 10
#define CARE_REJ_COUNT 11
#define CARE_REJ_TOKEN_BITS 0x7u

#define CARE_KL_K1 0u
#define CARE_KL_ABS 1u
#define CARE_KL_K2 2u
#define CARE_KL_K3 3u

// Mirrored by `care_kernels::params::LossStatsRaw`. Its field list is
// `care_kernels::params::LOSS_STATS_DEVICE_LAYOUT` (the names of
// `care_core::grpo::LOSS_STATS_LAYOUT`), checked against this struct by
// kernels/tests/cuda_mirrors.rs.
struct CareLossStats {
    float loss;        // sum_t w_t * l_t
    float ppo_kl_sum;  // sum (logp_old - logp), with the clamped log ratio, over counted tokens
    float kl_sum;      // sum k (unweighted) over counted tokens, when the KL term is on
    float ratio_sum;   // sum rho
    float ratio_min;   // over finite ratios; caller initializes to +inf
    float ratio_max;   // over finite ratios; caller initializes to 0 (every ratio is > 0)
    care_u32 tokens;   // counted tokens
    care_u32 sequences; // sequences with at least one counted token
    care_u32 clipped;  // pg2 > pg1
    care_u32 clipped_low;  // rho < 1 - eps_low and A < 0
    care_u32 clipped_high; // rho > 1 + eps_high and A > 0
    care_u32 dual_clipped; // the dual clip bound
    care_u32 log_ratio_clamped; // |logp - logp_old| beyond the clamp
    care_u32 non_finite;   // counted tokens with a non-finite input
};

// Mirrored by `care_kernels::params::RolloutStatsRaw` (`care_core::grpo::RolloutStats` as f32
// sums and u32 counts; field names and types checked by kernels/tests/cuda_mirrors.rs).
struct CareRolloutStats {
    float weight_sum;            // importance weights before rejection, over counted tokens
    float kl_sum;                // sum -(logp_prox - logp_rollout), unclamped
    float k3_sum;                // sum exp(x) - x - 1, unclamped
    float log_ppl_diff_sum;      // per sequence: -mean_t x
    float log_ppl_abs_diff_sum;  // per sequence: |mean_t x|
    float chi2_token_sum;        // sum rho_t^2 (clamped log ratio)
    float chi2_seq_sum;          // per sequence: (prod_t rho_t)^2 (clamped sum)
    care_u32 tokens;             // counted tokens (mask), before rejection
    care_u32 sequences;          // sequences with a counted token
    care_u32 rejected_tokens;    // counted tokens some criterion rejects
    care_u32 rejected_sequences; // sequences with a rejected token
    care_u32 truncated;          // counted tokens whose weight hit a truncation bound
    care_u32 non_finite;         // counted tokens with a non-finite logp_prox or logp_rollout
};

// Mirrored by `care_kernels::params::LossDenomsRaw`: the default denominators, computed on the
// device by grpo_loss_denoms when the caller passes none.
struct CareLossDenoms {
    care_u32 n_tok;   // counted tokens
    care_u32 n_seq;   // sequences with at least one counted token
    care_u32 horizon; // longest sequence (offsets difference)
    care_u32 pad0;
};

// One block's partial statistics (CARE_STAT_SLOTS of them in the workspace).
struct CareLossSlot {
    CareLossStats loss;
    CareRolloutStats roll;
    care_u32 pad0;
};

// The loss pass's workspace (`care_kernels::params::LossWorkRaw`): the default denominators,
// the arrival counter of the slot merge (zeroed by the plan) and one slot per block.
struct CareLossWork {
    CareLossDenoms denoms;
    care_u32 arrivals;
    care_u32 pad0[3];
    CareLossSlot slots[CARE_STAT_SLOTS];
};

struct CareCovWork;

// Mirrored by `care_kernels::params::LossParams`.
struct CareLossParams {
    const void* logp;             // T[n_tok]
    const void* logp_old;         // T[n_tok] or null (on-policy: ratio 1)
    const void* logp_ref;         // T[n_tok] or null
    const float* adv;             // [n_seq] or [n_tok] (adv_per_token)
    const care_u8* mask;          // [n_tok] or null (every token counts)
    const care_u32* seq_offsets;  // [n_seq + 1]
    void* grad;                   // [n_tok] f32 or T (grad_in_input_dtype), or null
    CareLossStats* stats;         // device, or null
    const CareLossDenoms* denoms; // device, or null; used for a denominator passed as <= 0
    care_u32 n_seq;
    care_u32 n_tok;
    care_u32 adv_per_token;
    care_u32 grad_in_input_dtype;
    care_u32 agg;                 // CARE_AGG_*
    care_u32 kl;                  // CARE_KL_*
    care_u32 seq_level;           // 1: sequence-level ratio (GSPO)
    care_u32 bypass;              // 1: verl bypass mode (logp_old holds the rollout log-probs,
                                  // see care_prox_of; the weights are not applied)
    float eps_low;
    float eps_high;
    float dual_clip;              // > 1 enables the dual clip
    float log_ratio_clamp;        // 20
    float kl_clamp;               // 20
    float k3_clamp;               // 10
    float seq_log_ratio_max;      // 10
    float beta;                   // KL weight; the KL term needs beta > 0 and logp_ref
    float n_tok_denom;            // > 0: caller's (global) token count
    float n_seq_denom;            // > 0: caller's (global) sequence count
    float horizon;                // > 0: caller's horizon H
    float gmpo_w_floor;           // GMPO: the geometric mean of the weights is of omega + floor
    // The policy-loss family and the rollout correction.
    const void* logp_rollout;     // T[n_tok] or null (no correction, no diagnostics)
    CareRolloutStats* rollout_stats; // device, or null
    care_u32 policy;              // CARE_PL_*
    care_u32 is_level;            // CARE_IS_*
    care_u32 rej_zero;            // 1: a rejected token keeps its place with weight 0
    care_u32 roll_on;             // 1: weights and rejections apply (else diagnostics only)
    float sapo_tau_pos;
    float sapo_tau_neg;
    float is_threshold;           // C: upper truncation bound of the weights
    float is_threshold_low;       // lower truncation bound
    float roll_clamp;             // bound on the rollout log ratio
    care_u32 rej_on;              // bit k: rejection criterion k (CARE_REJ_*) is on
    float rej_lower[CARE_REJ_COUNT]; // k1 criteria: ln(lower) (-inf: none); others unused
    float rej_upper[CARE_REJ_COUNT]; // k1 criteria: ln(upper); k2/k3: upper
    care_u32 dtype;               // care_dtype of logp & co. (the denominators kernel dispatches)
    care_u32 pad2;
    // Clip-Cov and KL-Cov: the covariance selection (the grpo_cov_* kernels fill cov_work and
    // cov_keys; the loss pass reads the cut). Null cov_work: nothing is selected.
    double cov_ratio;             // share of counted tokens selected
    double clip_cov_lb;           // Clip-Cov: candidates have lb < cov < ub
    double clip_cov_ub;
    float kl_cov_coef;            // KL-Cov: coefficient of |delta| on a selected token
    care_u32 cov_round;           // grpo_cov_radix: the radix round, 0..CARE_COV_ROUNDS-1
    CareCovWork* cov_work;        // device, or null
    care_u64* cov_keys;           // [n_tok] device: each token's candidate key (0: none)
    // VESPO: the Gamma weight's power and decay for A >= 0 and A < 0.
    float vespo_k_pos;
    float vespo_lambda_pos;
    float vespo_k_neg;
    float vespo_lambda_neg;
    // The statistics' slots and arrival counter: required with `stats` or `rollout_stats`,
    // else null (no statistics).
    CareLossWork* work;
};

// ---- covariance selection (Clip-Cov, KL-Cov) ---------------------------------------------------
// The CPU reference (care_core::grpo::top_k) selects the k = max(1, floor(ratio * N)) candidates
// with the largest covariance (A_t - mean A)(logp_t - mean logp) over the N tokens of the call
// that count in the loss, ties to the earlier token. On the device, in order:
//   grpo_cov_means   per block of sequences: sums of A and logp over the counted tokens (f64)
//                    and their count, into the block's slot (no atomics: the means do not depend
//                    on the schedule, so neither does the selection);
//   grpo_cov_keys    the means (every block reduces the slots in the same order), then each
//                    token's candidate value as an order-preserving u64 key (0: not a candidate);
//   grpo_cov_radix   x8: a radix select, 8 bits a round from the top, of the k-th largest key
//                    (histograms of the keys that match the digits chosen so far);
//   grpo_cov_cut     one block: the cut key K and, when fewer ties at K are taken than exist,
//                    the index after the last one taken, in token order;
// and the loss pass selects token t iff key_t > K, or key_t == K and t < tie_end.
#define CARE_COV_PARTS 1024 // the largest grid of grpo_cov_means and grpo_cov_keys
#define CARE_COV_ROUNDS 8

// Mirrored by `care_kernels::params::CovWorkRaw`; zeroed by the plan before grpo_cov_means.
struct CareCovWork {
    double part_a[CARE_COV_PARTS];  // per block of grpo_cov_means: sum of A
    double part_l[CARE_COV_PARTS];  // sum of logp
    care_u32 part_n[CARE_COV_PARTS]; // counted tokens
    care_u32 hist[CARE_COV_ROUNDS][256];
    care_u64 cut_key;  // the cut K (selected: key > K, or key == K and t < tie_end)
    care_u32 tie_end;
    care_u32 selected; // tokens selected
    care_u32 counted;  // N: tokens that count in the loss
    care_u32 k;        // tokens to select (0 when N = 0)
    care_u32 candidates;
    care_u32 pad0;
};

__device__ __forceinline__ bool care_counted(const CareLossParams& p, care_u32 t) {
    return p.mask == 0 || p.mask[t] != 0;
}

__device__ __forceinline__ float care_adv_at(const CareLossParams& p, care_u32 seq, care_u32 t) {
    return p.adv_per_token != 0 ? p.adv[t] : p.adv[seq];
}

// The clipped surrogate for one token at ratio rho: returns l and whether the unclipped branch
// is active (ties go to it), plus the clip flags.
struct CareSurrogate {
    float l;
    bool unclipped;
    bool clipped; // pg2 > pg1
    bool dual;
};

__device__ __forceinline__ CareSurrogate care_surrogate(const CareLossParams& p, float a,
                                                        float rho) {
    CareSurrogate s;
    float pg1 = -a * rho;
    float pg2 = -a * care_clamp(rho, 1.0f - p.eps_low, 1.0f + p.eps_high);
    s.clipped = pg2 > pg1;
    s.unclipped = !s.clipped;
    s.l = s.clipped ? pg2 : pg1;
    s.dual = false;
    if (p.dual_clip > 1.0f && a < 0.0f) {
        float d = -a * p.dual_clip;
        if (d < s.l) {
            s.l = d;
            s.dual = true;
            s.unclipped = false;
        }
    }
    return s;
}

// KL term k and dk/dlogp (0 where an input or output clamp binds).
__device__ __forceinline__ void care_kl(const CareLossParams& p, float lp, float lr, float* k,
                                        float* dk) {
    float xr = lr - lp;
    float x = care_clamp(xr, -p.kl_clamp, p.kl_clamp);
    bool in_clamped = xr < -p.kl_clamp || xr > p.kl_clamp;
    switch (p.kl) {
    case CARE_KL_K1:
        *k = -x;
        *dk = 1.0f;
        break;
    case CARE_KL_ABS:
        *k = x < 0.0f ? -x : x;
        *dk = x > 0.0f ? -1.0f : (x < 0.0f ? 1.0f : 0.0f);
        break;
    case CARE_KL_K2:
        *k = 0.5f * x * x;
        *dk = -x;
        break;
    default: {
        float e = expf(x);
        float raw = e - x - 1.0f;
        *k = care_clamp(raw, -p.k3_clamp, p.k3_clamp);
        *dk = (raw > p.k3_clamp || raw < -p.k3_clamp) ? 0.0f : 1.0f - e;
        break;
    }
    }
    if (in_clamped) {
        *dk = 0.0f;
    }
}

template <typename T>
__device__ __forceinline__ float care_logp_old(const CareLossParams& p, care_u32 t, float lp) {
    return p.logp_old != 0 ? care_load((const T*)p.logp_old, t) : lp;
}

// ---- rollout correction ----------------------------------------------------------------------
// With x_t = logp_prox_t - logp_rollout_t (logp_prox = logp_old, or logp on-policy) and
// x^_t = clamp(x_t, -S, S): k1 = x^, k2 = x^^2 / 2, k3 = exp(x^) - 1 - x^; token weight
// clamp(exp(x^_t), C_low, C); sequence weight clamp(exp(clamp(sum_t x_t, -S, S)), C_low, C).
// The same operations as care_core::grpo::rollout, in f32.

// The sequence statistics of the rollout correction and its verdict.
struct CareRollSeq {
    float n;      // counted tokens (mask), before rejection
    float sum_x;  // sum of the unclamped log ratios
    float w;      // the sequence weight (IS level sequence)
    bool trunc;   // the sequence weight hit a bound
    bool kept;    // every sequence criterion passes
    // Token diagnostics, summed over the counted tokens by the same pass (so the loss pass
    // carries no extra accumulators): sum exp(x) - x - 1 (unclamped), sum rho^2 (clamped),
    // the token weights before rejection, how many hit a truncation bound, and how many had a
    // non-finite logp_prox or logp_rollout.
    float k3_raw, chi2, w_sum, n_trunc, n_non_finite;
};

// One token's correction.
struct CareRollTok {
    float x, xh; // log ratio, unclamped and clamped
    float w;     // importance weight before rejection
    bool trunc;  // the weight hit a bound
    bool kept;   // its sequence and every token criterion pass
};

// No correction: every token kept with weight 1.
__device__ __forceinline__ CareRollSeq care_roll_none() {
    CareRollSeq r;
    r.n = 0.0f;
    r.sum_x = 0.0f;
    r.w = 1.0f;
    r.trunc = false;
    r.kept = true;
    r.k3_raw = 0.0f;
    r.chi2 = 0.0f;
    r.w_sum = 0.0f;
    r.n_trunc = 0.0f;
    r.n_non_finite = 0.0f;
    return r;
}

// Explicit comparisons (not care_clamp): an infinite bound turns the clamp off.
__device__ __forceinline__ float care_roll_clamp(float x, float bound) {
    return x > bound ? bound : (x < -bound ? -bound : x);
}

__device__ __forceinline__ float care_truncate(float log_w, float lo, float hi, bool* trunc) {
    float w = expf(log_w);
    *trunc = w > hi || w < lo;
    return w > hi ? hi : (w < lo ? lo : w);
}

__device__ __forceinline__ bool care_rej(const CareLossParams& p, int k) {
    return ((p.rej_on >> k) & 1u) != 0;
}

// k1 criteria: ln(lower) <= x <= ln(upper); k2/k3 criteria: x <= upper. NaN never passes.
__device__ __forceinline__ bool care_rej_within(const CareLossParams& p, int k, float x) {
    return !care_rej(p, k) || (x >= p.rej_lower[k] && x <= p.rej_upper[k]);
}
__device__ __forceinline__ bool care_rej_below(const CareLossParams& p, int k, float x) {
    return !care_rej(p, k) || x <= p.rej_upper[k];
}

__device__ __forceinline__ bool care_token_criteria(const CareLossParams& p, float xh) {
    return care_rej_within(p, CARE_REJ_TOKEN_K1, xh) &&
           care_rej_below(p, CARE_REJ_TOKEN_K2, 0.5f * xh * xh) &&
           care_rej_below(p, CARE_REJ_TOKEN_K3, expf(xh) - 1.0f - xh);
}

__device__ __forceinline__ CareRollTok care_roll_tok(const CareLossParams& p,
                                                     const CareRollSeq& rs, float prox,
                                                     float lr) {
    CareRollTok r;
    r.x = prox - lr;
    r.xh = care_roll_clamp(r.x, p.roll_clamp);
    r.kept = rs.kept && care_token_criteria(p, r.xh);
    r.trunc = false;
    r.w = 1.0f;
    if (p.is_level == CARE_IS_TOKEN) {
        r.w = care_truncate(r.xh, p.is_threshold_low, p.is_threshold, &r.trunc);
    } else if (p.is_level == CARE_IS_SEQUENCE) {
        r.w = rs.w;
        r.trunc = rs.trunc;
    }
    return r;
}

template <typename T>
__device__ __forceinline__ float care_prox(const CareLossParams& p, care_u32 t) {
    return p.logp_old != 0 && p.bypass == 0 ? care_load((const T*)p.logp_old, t)
                                            : care_load((const T*)p.logp, t);
}

// The proximal log-prob of the rollout correction from a token's old log-prob `lo` and its
// log-prob `lp`: `lo`, except in bypass mode, where `lo` is the rollout log-prob and the
// proximal policy is the current one (as a constant).
__device__ __forceinline__ float care_prox_of(const CareLossParams& p, float lo, float lp) {
    return p.bypass != 0 ? lp : lo;
}

// Reduces N values of every thread over the block, the first S by sum and the rest by max
// (identity -inf); every thread gets the results. `part` is N x 32 floats of shared memory.
template <int N, int S>
__device__ __forceinline__ void care_block_reduce(float* v, float (*part)[CARE_WARP]) {
    const care_u32 lane = threadIdx.x & (CARE_WARP - 1);
    const care_u32 warp = threadIdx.x / CARE_WARP;
    const care_u32 nwarps = (blockDim.x + CARE_WARP - 1) / CARE_WARP;
    const float ninf = __uint_as_float(0xff800000u);
    for (int k = 0; k < N; ++k) {
        v[k] = k < S ? care_warp_sum(v[k]) : care_warp_max(v[k]);
    }
    __syncthreads(); // a previous call may still be reading `part`
    if (lane == 0) {
        for (int k = 0; k < N; ++k) {
            part[k][warp] = v[k];
        }
    }
    __syncthreads();
    for (int k = 0; k < N; ++k) {
        float x = lane < nwarps ? part[k][lane] : (k < S ? 0.0f : ninf);
        v[k] = k < S ? care_warp_sum(x) : care_warp_max(x);
    }
}

// The rollout correction's sequence pass: one segmented reduction over the counted tokens of
// [start, end) gives the sums and maxima the sequence criteria and weight need, and with DIAG
// the token diagnostics.
template <typename T, bool DIAG>
__device__ __forceinline__ CareRollSeq care_roll_seq(const CareLossParams& p, care_u32 start,
                                                     care_u32 end) {
    // n, sum x, sum k1, sum k2, sum k3, [diagnostics (5)] | max k2, max k3, NaN seen
    const int M = DIAG ? 10 : 5; // first maximum
    __shared__ float part[M + 3][CARE_WARP];
    const float ninf = __uint_as_float(0xff800000u);
    float v[M + 3];
    for (int k = 0; k < M; ++k) {
        v[k] = 0.0f;
    }
    v[M] = ninf;
    v[M + 1] = ninf;
    v[M + 2] = 0.0f;
    for (care_u32 t = start + threadIdx.x; t < end; t += blockDim.x) {
        if (care_counted(p, t)) {
            float prox = care_prox<T>(p, t);
            float lr = care_load((const T*)p.logp_rollout, t);
            float x = prox - lr;
            float xh = care_roll_clamp(x, p.roll_clamp);
            float e = expf(xh);
            float k2 = 0.5f * xh * xh;
            float k3 = e - 1.0f - xh;
            v[0] += 1.0f;
            v[1] += x;
            v[2] += xh;
            v[3] += k2;
            v[4] += k3;
            if (DIAG) {
                bool trunc = false;
                float w = p.is_level == CARE_IS_TOKEN
                              ? care_truncate(xh, p.is_threshold_low, p.is_threshold, &trunc)
                              : 1.0f;
                v[5] += x == xh ? k3 : expf(x) - x - 1.0f;
                v[6] += e * e;
                v[7] += w;
                v[8] += trunc ? 1.0f : 0.0f;
                v[9] += (care_isfinite(prox) && care_isfinite(lr)) ? 0.0f : 1.0f;
            }
            v[M] = k2 > v[M] ? k2 : v[M];
            v[M + 1] = k3 > v[M + 1] ? k3 : v[M + 1];
            v[M + 2] = (care_isnan(xh) || care_isnan(k3)) ? 1.0f : v[M + 2];
        }
    }
    care_block_reduce<M + 3, M>(v, part);
    CareRollSeq r;
    r.n = v[0];
    r.sum_x = v[1];
    r.w = care_truncate(care_roll_clamp(v[1], p.roll_clamp), p.is_threshold_low, p.is_threshold,
                        &r.trunc);
    r.k3_raw = DIAG ? v[5] : 0.0f;
    r.chi2 = DIAG ? v[6] : 0.0f;
    r.n_non_finite = DIAG ? v[9] : 0.0f;
    // The weights before rejection: per token, or the sequence weight on each token.
    r.w_sum = !DIAG ? 0.0f : (p.is_level == CARE_IS_SEQUENCE ? r.n * r.w : v[7]);
    r.n_trunc = !DIAG ? 0.0f : (p.is_level == CARE_IS_SEQUENCE ? (r.trunc ? r.n : 0.0f) : v[8]);
    r.kept = true;
    if (r.n > 0.0f) {
        const bool nan = v[M + 2] > 0.0f;
        r.kept = care_rej_within(p, CARE_REJ_SEQ_SUM_K1, v[2]) &&
                 care_rej_below(p, CARE_REJ_SEQ_SUM_K2, v[3]) &&
                 care_rej_below(p, CARE_REJ_SEQ_SUM_K3, v[4]) &&
                 care_rej_within(p, CARE_REJ_SEQ_MEAN_K1, v[2] / r.n) &&
                 care_rej_below(p, CARE_REJ_SEQ_MEAN_K2, v[3] / r.n) &&
                 care_rej_below(p, CARE_REJ_SEQ_MEAN_K3, v[4] / r.n) &&
                 (!care_rej(p, CARE_REJ_SEQ_MAX_K2) ||
                  (!nan && care_rej_below(p, CARE_REJ_SEQ_MAX_K2, v[M]))) &&
                 (!care_rej(p, CARE_REJ_SEQ_MAX_K3) ||
                  (!nan && care_rej_below(p, CARE_REJ_SEQ_MAX_K3, v[M + 1])));
    }
    return r;
}

// Counts of one sequence: before rejection (n_pre) and kept by the rollout criteria (n_kept),
// with the rollout sequence statistics when `with_roll`.
struct CareSeqCount {
    float n_pre;
    float n_kept;
    CareRollSeq roll;
};

template <typename T, bool DIAG>
__device__ __forceinline__ CareSeqCount care_seq_count(const CareLossParams& p, care_u32 start,
                                                       care_u32 end, bool with_roll,
                                                       float* scratch) {
    CareSeqCount c;
    c.roll = care_roll_none();
    if (with_roll) {
        c.roll = care_roll_seq<T, DIAG>(p, start, end);
        c.n_pre = c.roll.n;
        if (!c.roll.kept) {
            c.n_kept = 0.0f;
        } else if ((p.rej_on & CARE_REJ_TOKEN_BITS) == 0u) {
            c.n_kept = c.n_pre;
        } else {
            float k = 0.0f;
            for (care_u32 t = start + threadIdx.x; t < end; t += blockDim.x) {
                if (care_counted(p, t)) {
                    float x = care_prox<T>(p, t) - care_load((const T*)p.logp_rollout, t);
                    k += care_token_criteria(p, care_roll_clamp(x, p.roll_clamp)) ? 1.0f : 0.0f;
                }
            }
            c.n_kept = care_block_sum(k, scratch);
        }
    } else {
        if (p.mask == 0) {
            c.n_pre = (float)(end - start);
        } else {
            float k = 0.0f;
            for (care_u32 t = start + threadIdx.x; t < end; t += blockDim.x) {
                k += p.mask[t] != 0 ? 1.0f : 0.0f;
            }
            c.n_pre = care_block_sum(k, scratch);
        }
        c.n_kept = c.n_pre;
        c.roll.n = c.n_pre;
    }
    return c;
}

// Whether the rollout correction drops rejected tokens from the loss (and its counts).
__device__ __forceinline__ bool care_roll_drops(const CareLossParams& p) {
    return p.roll_on != 0 && p.rej_zero == 0;
}

// ---- per-sequence quantities ------------------------------------------------------------------

struct CareSeqInfo {
    care_u32 start, end, n_counted;
    bool scanned;     // n_counted is known before the main pass
    float w;          // aggregation weight of every counted token of the sequence
    float rho_seq;    // GSPO, GSPO-token, GMPO (the geometric mean ratio)
    bool seq_hit;     // GSPO(-token): the mean log ratio reached its bound (no gradient)
    float gspo_coef;  // GSPO: rho_i / n_i * sum_t' w omega_t' (-A_t') [unclipped at t']
    float a_mean;     // GMPO: the mean advantage
    float omega_seq;  // GMPO: the geometric mean of the importance weights
    CareRollSeq roll; // the rollout correction's verdict and sequence weight
    float n_pre;      // counted tokens before rejection (rollout diagnostics)
    float n_kept;     // counted tokens no criterion rejects (rollout diagnostics)
};

// Whether token t counts in the loss, and its importance weight omega (1 without correction;
// 0 for a rejected token under the zero-weight mode). `prox` is logp_old or logp.
template <typename T>
__device__ __forceinline__ bool care_token_omega(const CareLossParams& p, const CareRollSeq& rs,
                                                 care_u32 t, float prox, float* omega) {
    *omega = 1.0f;
    if (!care_counted(p, t)) {
        return false;
    }
    if (p.roll_on == 0) {
        return true;
    }
    CareRollTok r = care_roll_tok(p, rs, prox, care_load((const T*)p.logp_rollout, t));
    if (r.kept) {
        // Bypass mode: the ratio is the importance weight already; only rejections apply.
        *omega = p.bypass != 0 ? 1.0f : r.w;
        return true;
    }
    *omega = 0.0f;
    return p.rej_zero != 0;
}

// GMPO's clipped log ratio: sgn(A) * min(sgn(A) delta, sgn(A) clip(delta, -eps_low, eps_high)),
// with whether the gradient flows through delta (`live`); A = 0 gives 0, not live.
__device__ __forceinline__ float care_gmpo_log_ratio(const CareLossParams& p, float delta,
                                                     float a, bool* live) {
    float c = delta > p.eps_high ? p.eps_high : (delta < -p.eps_low ? -p.eps_low : delta);
    if (a > 0.0f) {
        *live = !(c < delta);
        return c < delta ? c : delta;
    }
    if (a < 0.0f) {
        *live = !(c > delta);
        return c > delta ? c : delta;
    }
    *live = false;
    return 0.0f;
}

__device__ __forceinline__ float care_sigmoid(float x) {
    if (x >= 0.0f) {
        return 1.0f / (1.0f + expf(-x));
    }
    float e = expf(x);
    return e / (1.0f + e);
}

// The aggregation weight of every counted token of a sequence with n_i = `n_counted` counted
// tokens, from the caller's denominators or the device pre-pass's.
__device__ __forceinline__ float care_agg_weight(const CareLossParams& p, care_u32 n_counted) {
    float n_tok = p.n_tok_denom > 0.0f ? p.n_tok_denom
                                       : (p.denoms != 0 ? (float)p.denoms->n_tok : 0.0f);
    float n_seq = p.n_seq_denom > 0.0f ? p.n_seq_denom
                                       : (p.denoms != 0 ? (float)p.denoms->n_seq : 0.0f);
    float h = p.horizon > 0.0f ? p.horizon : (p.denoms != 0 ? (float)p.denoms->horizon : 0.0f);
    // A zero denominator gives weight 0 (nothing counted), as in the CPU reference.
    float d = 1.0f;
    switch (p.agg) {
    case CARE_AGG_TOKEN_MEAN:
        d = n_tok;
        break;
    case CARE_AGG_SEQ_MEAN_TOKEN_MEAN:
        d = (float)n_counted * n_seq;
        break;
    case CARE_AGG_SEQ_MEAN_TOKEN_SUM:
        d = n_seq;
        break;
    case CARE_AGG_SEQ_MEAN_TOKEN_SUM_NORM:
        d = n_seq * h;
        break;
    case CARE_AGG_TOKEN_SUM_NORM:
        d = h;
        break;
    default:
        d = 1.0f;
        break;
    }
    return d > 0.0f ? 1.0f / d : 0.0f;
}

// Per-sequence quantities; every thread of the block gets them (block reductions).
template <typename T>
__device__ CareSeqInfo care_seq_info(const CareLossParams& p, care_u32 seq, float* scratch) {
    CareSeqInfo s;
    care_u32 a = p.seq_offsets[seq];
    care_u32 b = p.seq_offsets[seq + 1];
    s.start = a < p.n_tok ? a : p.n_tok;
    s.end = b < s.start ? s.start : (b < p.n_tok ? b : p.n_tok);

    // n_i: counted tokens of the sequence. Without a mask (and without rejection) it is the
    // length. With one, a u8 scan of the sequence, done only where n_i is needed before the main
    // pass: the weight of seq_mean_token_mean, the GSPO and GMPO means, and the rollout
    // correction (whose sequence pass counts them anyway). Otherwise nothing needs it (the
    // `sequences` stat looks for the first counted token instead, see care_grpo_loss), so each
    // input is read once. Counts are summed as float, exact below 2^24 tokens per sequence.
    const bool with_roll = p.logp_rollout != 0;
    s.scanned = p.mask == 0 || p.agg == CARE_AGG_SEQ_MEAN_TOKEN_MEAN || p.seq_level != 0 ||
                p.policy == CARE_PL_GMPO || p.policy == CARE_PL_VESPO || with_roll;
    s.roll = care_roll_none();
    s.n_pre = 0.0f;
    s.n_kept = 0.0f;
    if (p.mask == 0 && !with_roll) {
        s.n_counted = s.end - s.start;
    } else if (!s.scanned) {
        s.n_counted = 0; // unused before the main pass; counted there
    } else {
        CareSeqCount c = care_seq_count<T, true>(p, s.start, s.end, with_roll, scratch);
        s.roll = c.roll;
        s.n_pre = c.n_pre;
        s.n_kept = c.n_kept;
        s.n_counted = (care_u32)(care_roll_drops(p) ? c.n_kept : c.n_pre);
    }

    s.w = care_agg_weight(p, s.n_counted);

    s.rho_seq = 1.0f;
    s.seq_hit = false;
    s.gspo_coef = 0.0f;
    s.a_mean = 0.0f;
    s.omega_seq = 1.0f;
    if (p.seq_level != 0 && s.n_counted > 0) {
        float sd = 0.0f;
        for (care_u32 t = s.start + threadIdx.x; t < s.end; t += blockDim.x) {
            float lp = care_load((const T*)p.logp, t);
            float lo = care_logp_old<T>(p, t, lp);
            float om;
            if (care_token_omega<T>(p, s.roll, t, care_prox_of(p, lo, lp), &om)) {
                sd += care_clamp(lp - lo, -p.log_ratio_clamp, p.log_ratio_clamp);
            }
        }
        sd = care_block_sum(sd, scratch);
        float mean = sd / (float)s.n_counted;
        s.seq_hit = mean > p.seq_log_ratio_max;
        s.rho_seq = expf(s.seq_hit ? p.seq_log_ratio_max : mean);
        if (p.seq_level == CARE_RATIO_SEQUENCE) {
            // sum over the sequence of omega * (-A) where the unclipped branch is active.
            float acc = 0.0f;
            for (care_u32 t = s.start + threadIdx.x; t < s.end; t += blockDim.x) {
                float lp = care_load((const T*)p.logp, t);
                float lo = care_logp_old<T>(p, t, lp);
                float om;
                if (care_token_omega<T>(p, s.roll, t, care_prox_of(p, lo, lp), &om)) {
                    float at = care_adv_at(p, seq, t);
                    CareSurrogate su = care_surrogate(p, at, s.rho_seq);
                    if (su.unclipped) {
                        acc += om * -at;
                    }
                }
            }
            acc = care_block_sum(acc, scratch);
            s.gspo_coef = s.rho_seq / (float)s.n_counted * (s.w * acc);
        }
    } else if (p.policy == CARE_PL_VESPO && s.n_counted > 0) {
        // VESPO: the sequence's clamped log importance ratio, the rollout weights folded in per
        // token (as TRL folds its vLLM ratio); rho_seq holds w, a_mean holds ln w.
        float v = 0.0f;
        for (care_u32 t = s.start + threadIdx.x; t < s.end; t += blockDim.x) {
            float lp = care_load((const T*)p.logp, t);
            float lo = care_logp_old<T>(p, t, lp);
            float om;
            if (care_token_omega<T>(p, s.roll, t, care_prox_of(p, lo, lp), &om)) {
                v += care_clamp(lp - lo, -p.log_ratio_clamp, p.log_ratio_clamp);
                if (p.roll_on != 0) {
                    v += care_clamp(logf(om), CARE_VESPO_LOG_W_MIN, CARE_VESPO_LOG_W_MAX);
                }
            }
        }
        v = care_block_sum(v, scratch);
        s.a_mean = care_clamp(v, CARE_VESPO_LOG_W_MIN, CARE_VESPO_LOG_W_MAX);
        s.rho_seq = expf(s.a_mean);
    } else if (p.policy == CARE_PL_GMPO && s.n_counted > 0) {
        // GMPO: the mean clipped log ratio, the mean advantage and the mean log weight.
        __shared__ float part[3][CARE_WARP];
        float v[3] = {0.0f, 0.0f, 0.0f};
        for (care_u32 t = s.start + threadIdx.x; t < s.end; t += blockDim.x) {
            float lp = care_load((const T*)p.logp, t);
            float lo = care_logp_old<T>(p, t, lp);
            float om;
            if (care_token_omega<T>(p, s.roll, t, care_prox_of(p, lo, lp), &om)) {
                float at = care_adv_at(p, seq, t);
                float delta = care_clamp(lp - lo, -p.log_ratio_clamp, p.log_ratio_clamp);
                bool live;
                v[0] += care_gmpo_log_ratio(p, delta, at, &live);
                v[1] += at;
                v[2] += logf(om + p.gmpo_w_floor); // verl: ln(omega + 1e-10)
            }
        }
        care_block_reduce<3, 3>(v, part);
        float n = (float)s.n_counted;
        s.rho_seq = expf(v[0] / n);
        s.a_mean = v[1] / n;
        s.omega_seq = p.roll_on != 0 ? expf(v[2] / n) : 1.0f;
    }
    return s;
}

struct CareStatAcc {
    float loss, ppo_kl, kl, ratio_sum, ratio_min, ratio_max;
    care_u32 tokens, clipped, clipped_low, clipped_high, dual, clamped, non_finite;
};

__device__ __forceinline__ void care_loss_slot_clear(CareLossSlot* z) {
    care_u32* w = (care_u32*)z;
    for (unsigned k = 0; k < sizeof(CareLossSlot) / 4u; ++k) {
        w[k] = 0u;
    }
    z->loss.ratio_min = __uint_as_float(0x7f800000u);
}

// Words of a slot: CareLossStats (sums 0-3, ratio_min 4, ratio_max 5, counts 6-13), then
// CareRolloutStats (sums 14-20, counts 21-26).
#define CARE_SLOT_WORDS 27
__device__ __forceinline__ bool care_slot_is_sum(care_u32 k) { return k < 4u || (k >= 14u && k < 21u); }

// `mine` (thread 0's) goes into the block's slot; the last block to arrive merges every slot
// and adds the result to p.stats and p.rollout_stats. Every thread of the block calls it.
// The merge: thread (group g, lane k) folds word k of slots g, g + groups, g + 2 groups, ... in
// that order (sums in double), then thread k folds the groups in order: a fixed order for a
// given block size, and lane k of a warp reads word k of a slot, so each warp's loads coalesce.
__device__ void care_loss_commit(const CareLossParams& p, const CareLossSlot* mine, bool kl_on) {
    __shared__ double part[CARE_WARP][CARE_WARP];
    __shared__ double res[CARE_WARP];
    CareLossWork* w = p.work;
    if (threadIdx.x == 0) {
        w->slots[blockIdx.y * gridDim.x + blockIdx.x] = *mine;
    }
    if (!care_last_block(&w->arrivals)) {
        return;
    }
    const care_u32 nslots = gridDim.x * gridDim.y;
    const care_u32 k = threadIdx.x & (CARE_WARP - 1), g = threadIdx.x / CARE_WARP;
    const care_u32 groups = blockDim.x / CARE_WARP;
    double acc = k == 4u ? (double)__uint_as_float(0x7f800000u) : 0.0;
    if (k < CARE_SLOT_WORDS) {
        for (care_u32 i = g; i < nslots; i += groups) {
            // volatile: written by other blocks during this launch, never from a cached line.
            const care_u32 v = ((const volatile care_u32*)&w->slots[i])[k];
            if (care_slot_is_sum(k)) {
                acc += (double)__uint_as_float(v);
            } else if (k == 4u) {
                const double x = (double)__uint_as_float(v);
                acc = x < acc ? x : acc;
            } else if (k == 5u) {
                const double x = (double)__uint_as_float(v);
                acc = x > acc ? x : acc;
            } else {
                acc += (double)v;
            }
        }
    }
    part[g][k] = acc;
    __syncthreads();
    if (threadIdx.x < CARE_SLOT_WORDS) {
        double r = part[0][k];
        for (care_u32 j = 1; j < groups; ++j) {
            const double x = part[j][k];
            r = k == 4u ? (x < r ? x : r) : (k == 5u ? (x > r ? x : r) : r + x);
        }
        res[k] = r;
    }
    __syncthreads();
    if (threadIdx.x != 0) {
        return;
    }
    const double* sum = res;
    care_u32 cnt[14];
    for (int j = 0; j < 8; ++j) {
        cnt[j] = (care_u32)(care_u64)res[6 + j];
    }
    for (int j = 0; j < 6; ++j) {
        cnt[8 + j] = (care_u32)(care_u64)res[21 + j];
    }
    const float rmin = (float)res[4], rmax = (float)res[5];
    if (p.stats != 0) {
        CareLossStats* s = p.stats;
        s->loss = (float)((double)s->loss + sum[0]);
        s->ppo_kl_sum = (float)((double)s->ppo_kl_sum + sum[1]);
        if (kl_on) {
            s->kl_sum = (float)((double)s->kl_sum + sum[2]);
        }
        s->ratio_sum = (float)((double)s->ratio_sum + sum[3]);
        // No finite ratio leaves +inf and 0, which change neither bound.
        s->ratio_min = rmin < s->ratio_min ? rmin : s->ratio_min;
        s->ratio_max = rmax > s->ratio_max ? rmax : s->ratio_max;
        s->tokens += cnt[0];
        s->sequences += cnt[1];
        s->clipped += cnt[2];
        s->clipped_low += cnt[3];
        s->clipped_high += cnt[4];
        s->dual_clipped += cnt[5];
        s->log_ratio_clamped += cnt[6];
        s->non_finite += cnt[7];
    }
    if (p.rollout_stats != 0) {
        CareRolloutStats* r = p.rollout_stats;
        const double* d = sum + 14;
        r->weight_sum = (float)((double)r->weight_sum + d[0]);
        r->kl_sum = (float)((double)r->kl_sum + d[1]);
        r->k3_sum = (float)((double)r->k3_sum + d[2]);
        r->log_ppl_diff_sum = (float)((double)r->log_ppl_diff_sum + d[3]);
        r->log_ppl_abs_diff_sum = (float)((double)r->log_ppl_abs_diff_sum + d[4]);
        r->chi2_token_sum = (float)((double)r->chi2_token_sum + d[5]);
        r->chi2_seq_sum = (float)((double)r->chi2_seq_sum + d[6]);
        r->tokens += cnt[8];
        r->sequences += cnt[9];
        r->rejected_tokens += cnt[10];
        r->rejected_sequences += cnt[11];
        r->truncated += cnt[12];
        r->non_finite += cnt[13];
    }
}

// One counted token's policy-gradient term at the token ratio level: its loss l (before the
// aggregation weight w) and w * dl/dlogp, with the clip flags. `rho = exp(delta)`.
struct CareTerm {
    float l, g;
    bool clipped, low, high, dual;
};

// `sel`: the covariance selection took the token (Clip-Cov, KL-Cov).
__device__ __forceinline__ CareTerm care_token_term(const CareLossParams& p, float lp, float a,
                                                    float rho, float delta, bool clamped,
                                                    float w, bool sel) {
    CareTerm r;
    const float lo = 1.0f - p.eps_low, hi = 1.0f + p.eps_high;
    r.low = rho < lo && a < 0.0f;
    r.high = rho > hi && a > 0.0f;
    r.dual = false;
    r.clipped = false;
    switch (p.policy) {
    case CARE_PL_CISPO: {
        // The clipped ratio is a detached weight on A * logp: the gradient never flows
        // through it, so the clamp of delta does not stop it either.
        float wc = rho > hi ? hi : (rho < lo ? lo : rho);
        r.clipped = rho > hi || rho < lo;
        r.l = -wc * a * lp;
        r.g = -wc * a * w;
        break;
    }
    case CARE_PL_SAPO: {
        float tau = a > 0.0f ? p.sapo_tau_pos : p.sapo_tau_neg;
        float sg = care_sigmoid(tau * (rho - 1.0f));
        r.l = -a * (4.0f / tau) * sg;
        r.g = clamped ? 0.0f : -a * 4.0f * sg * (1.0f - sg) * rho * w;
        break;
    }
    case CARE_PL_GPG:
        r.l = -a * lp;
        r.g = -a * w;
        break;
    case CARE_PL_KL_COV: {
        // -A rho, plus kl_cov_coef * |delta| on a selected token.
        float d = -a * rho;
        r.l = d;
        if (sel) {
            r.l += p.kl_cov_coef * (delta < 0.0f ? -delta : delta);
            d += p.kl_cov_coef * (delta > 0.0f ? 1.0f : (delta < 0.0f ? -1.0f : 0.0f));
        }
        r.g = clamped ? 0.0f : d * w;
        break;
    }
    default: {
        // The clipped ratio (and Clip-Cov, whose selected tokens then contribute nothing:
        // verl multiplies their term by 0).
        CareSurrogate su = care_surrogate(p, a, rho);
        r.l = su.l;
        // rho * w first: it cannot overflow (rho <= e^clamp), so the product overflows only
        // when the f64 reference value does.
        r.g = (su.unclipped && !clamped) ? -a * (rho * w) : 0.0f;
        r.clipped = su.clipped;
        r.dual = su.dual;
        if (sel) {
            r.l = 0.0f;
            r.g = 0.0f;
        }
        break;
    }
    }
    return r;
}


// ---- covariance selection kernels (see the layout comment at CareCovWork) ----------------------

// The bounds [start, end) of sequence `seq`, clamped into 0..n_tok.
__device__ __forceinline__ void care_seq_bounds(const CareLossParams& p, care_u32 seq,
                                                care_u32* start, care_u32* end) {
    care_u32 a = p.seq_offsets[seq];
    care_u32 b = p.seq_offsets[seq + 1];
    *start = a < p.n_tok ? a : p.n_tok;
    *end = b < *start ? *start : (b < p.n_tok ? b : p.n_tok);
}

// A total order on non-NaN doubles as u64 keys, larger value larger key, never 0 (the
// care_core::grpo::family key); NaN gives 0, "not a candidate", as NaN is never selected.
__device__ __forceinline__ care_u64 care_cov_key(double v) {
    if (v != v) {
        return 0ull;
    }
    care_u64 b = (care_u64)__double_as_longlong(v);
    return (b >> 63) != 0ull ? ~b : (b | (1ull << 63));
}

// The rollout verdict of a sequence for care_token_omega (every thread of the block calls it).
template <typename T>
__device__ __forceinline__ CareRollSeq care_cov_roll(const CareLossParams& p, care_u32 start,
                                                     care_u32 end) {
    return p.roll_on != 0 ? care_roll_seq<T, false>(p, start, end) : care_roll_none();
}

// grpo_cov_means. Geometry: grid.x = min(n_seq, CARE_COV_PARTS) blocks striding over sequences.
template <typename T>
__device__ void care_cov_means(const CareLossParams& p) {
    __shared__ double dscratch[CARE_WARP];
    __shared__ care_u32 uscratch[CARE_WARP];
    double sa = 0.0, sl = 0.0;
    care_u32 n = 0;
    for (care_u32 seq = blockIdx.x; seq < p.n_seq; seq += gridDim.x) {
        care_u32 start, end;
        care_seq_bounds(p, seq, &start, &end);
        CareRollSeq rs = care_cov_roll<T>(p, start, end);
        for (care_u32 t = start + threadIdx.x; t < end; t += blockDim.x) {
            float om;
            if (care_token_omega<T>(p, rs, t, care_prox<T>(p, t), &om)) {
                sa = care_dadd(sa, (double)care_adv_at(p, seq, t));
                sl = care_dadd(sl, (double)care_load((const T*)p.logp, t));
                n += 1u;
            }
        }
    }
    sa = care_block_sum(sa, dscratch);
    sl = care_block_sum(sl, dscratch);
    n = care_block_sum(n, uscratch);
    if (threadIdx.x == 0) {
        p.cov_work->part_a[blockIdx.x] = sa;
        p.cov_work->part_l[blockIdx.x] = sl;
        p.cov_work->part_n[blockIdx.x] = n;
    }
}

// grpo_cov_keys. Geometry: that of grpo_cov_means (gridDim.x is the number of slots to reduce).
template <typename T>
__device__ void care_cov_keys(const CareLossParams& p) {
    __shared__ double dscratch[CARE_WARP];
    __shared__ care_u32 uscratch[CARE_WARP];
    CareCovWork* w = p.cov_work;
    // The means: every block reduces the slots in the same order, so every block (and every
    // run) gets the same bits.
    double sa = 0.0, sl = 0.0;
    care_u32 n = 0;
    for (care_u32 i = threadIdx.x; i < gridDim.x; i += blockDim.x) {
        sa = care_dadd(sa, w->part_a[i]);
        sl = care_dadd(sl, w->part_l[i]);
        n += w->part_n[i];
    }
    sa = care_block_sum(sa, dscratch);
    sl = care_block_sum(sl, dscratch);
    n = care_block_sum(n, uscratch);
    if (n == 0u) {
        return; // nothing counts: no candidate, k = 0 (uniform over the grid)
    }
    const double ma = sa / (double)n, ml = sl / (double)n;
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        // k = max(1, floor(ratio * N)), as care_core::grpo::cov_select_count.
        double kf = floor(care_dmul(p.cov_ratio, (double)n));
        w->counted = n;
        w->k = kf >= 1.0 ? (kf < (double)n ? (care_u32)kf : n) : 1u;
    }
    for (care_u32 seq = blockIdx.x; seq < p.n_seq; seq += gridDim.x) {
        care_u32 start, end;
        care_seq_bounds(p, seq, &start, &end);
        CareRollSeq rs = care_cov_roll<T>(p, start, end);
        for (care_u32 t = start + threadIdx.x; t < end; t += blockDim.x) {
            float lpf = care_load((const T*)p.logp, t);
            float lo = care_logp_old<T>(p, t, lpf);
            float om;
            care_u64 key = 0ull;
            if (care_token_omega<T>(p, rs, t, care_prox<T>(p, t), &om)) {
                float af = care_adv_at(p, seq, t);
                double c = care_dmul(care_dadd((double)af, -ma), care_dadd((double)lpf, -ml));
                c = c == 0.0 ? 0.0 : c; // -0 and +0 are one value
                bool cand = true;
                if (p.policy == CARE_PL_CLIP_COV) {
                    // Candidates: tokens the clip does not bind, with lb < cov < ub.
                    float delta = care_clamp(lpf - lo, -p.log_ratio_clamp, p.log_ratio_clamp);
                    cand = !care_surrogate(p, af, expf(delta)).clipped && c > p.clip_cov_lb &&
                           c < p.clip_cov_ub;
                }
                key = cand ? care_cov_key(c) : 0ull;
            }
            p.cov_keys[t] = key;
        }
    }
}

// The digit of a radix round: in the histogram `h` (256 bins), the largest digit d with at
// least `rem` keys at or above it; `*above` gets the keys strictly above d. Called by a whole
// warp; every lane gets the results.
__device__ __forceinline__ care_u32 care_cov_digit(const care_u32* h, care_u32 rem,
                                                   care_u32* above) {
    const int lane = (int)(threadIdx.x & (CARE_WARP - 1));
    care_u32 c[8];
    care_u32 mine = 0;
    for (int j = 0; j < 8; ++j) {
        c[j] = h[lane * 8 + j];
        mine += c[j];
    }
    // Suffix sums over the lanes: s = keys in this lane's bins and above.
    care_u32 s = mine;
    for (int o = 1; o < CARE_WARP; o <<= 1) {
        care_u32 v = __shfl_sync(CARE_FULL_MASK, s, lane + o < CARE_WARP ? lane + o : lane);
        s += lane + o < CARE_WARP ? v : 0u;
    }
    // The lane holding the digit: the highest lane whose suffix sum reaches rem.
    const int hit = care_warp_max(s >= rem ? lane : -1);
    care_u32 d = 0, ab = 0;
    if (lane == hit) {
        care_u32 run = s - mine; // keys in the lanes above
        for (int j = 7; j >= 0; --j) {
            if (run + c[j] >= rem) {
                d = (care_u32)(lane * 8 + j);
                ab = run;
                break;
            }
            run += c[j];
        }
    }
    *above = __shfl_sync(CARE_FULL_MASK, ab, hit < 0 ? 0 : hit);
    return __shfl_sync(CARE_FULL_MASK, d, hit < 0 ? 0 : hit);
}

// The candidates (round 0's histogram total) and, unless at most k of them leave every one
// selected, the key prefix chosen by rounds 0..r-1 and the keys still to take at or below it.
// Warp 0 computes them once per block; every thread gets them through shared memory.
__device__ __forceinline__ care_u32 care_cov_prefix(const CareCovWork* w, care_u32 r,
                                                    care_u64* prefix, care_u32* rem) {
    __shared__ care_u64 s_prefix;
    __shared__ care_u32 s_rem, s_total;
    if (threadIdx.x < CARE_WARP) {
        care_u32 mine = 0;
        for (care_u32 j = 0; j < 8u; ++j) {
            mine += w->hist[0][threadIdx.x * 8u + j];
        }
        const care_u32 total = care_warp_sum(mine);
        care_u64 pre = 0ull;
        care_u32 left = w->k;
        for (care_u32 i = 0; i < r && total > w->k; ++i) {
            care_u32 above;
            care_u32 d = care_cov_digit(w->hist[i], left, &above);
            pre |= (care_u64)d << (56u - 8u * i);
            left -= above;
        }
        if (threadIdx.x == 0) {
            s_prefix = pre;
            s_rem = left;
            s_total = total;
        }
    }
    __syncthreads();
    *prefix = s_prefix;
    *rem = s_rem;
    return s_total;
}

// grpo_cov_radix, round p.cov_round. Geometry: blocks striding over the tokens.
__device__ void care_cov_radix(const CareLossParams& p) {
    __shared__ care_u32 h[256];
    const CareCovWork* w = p.cov_work;
    const care_u32 r = p.cov_round;
    if (w->k == 0u || r >= CARE_COV_ROUNDS) {
        return; // uniform over the grid
    }
    care_u64 prefix;
    care_u32 rem;
    const care_u32 total = care_cov_prefix(w, r, &prefix, &rem);
    if (r > 0u && total <= w->k) {
        return; // round 0 counted every candidate: at most k of them are all taken (uniform)
    }
    for (care_u32 j = threadIdx.x; j < 256u; j += blockDim.x) {
        h[j] = 0u;
    }
    __syncthreads();
    const care_u32 shift = 56u - 8u * r;
    const care_u32 stride = gridDim.x * blockDim.x;
    for (care_u32 t = blockIdx.x * blockDim.x + threadIdx.x; t < p.n_tok; t += stride) {
        care_u64 key = p.cov_keys[t];
        // The keys whose digits above this round's match the prefix (all of them in round 0).
        bool match = key != 0ull && (r == 0u || (key >> (shift + 8u)) == (prefix >> (shift + 8u)));
        if (match) {
            atomicAdd(&h[(care_u32)(key >> shift) & 255u], 1u);
        }
    }
    __syncthreads();
    for (care_u32 j = threadIdx.x; j < 256u; j += blockDim.x) {
        if (h[j] != 0u) {
            atomicAdd(&p.cov_work->hist[r][j], h[j]);
        }
    }
}

// grpo_cov_cut. Geometry: one block, blockDim.x a multiple of 32.
__device__ void care_cov_cut(const CareLossParams& p) {
    __shared__ care_u32 uscratch[CARE_WARP];
    __shared__ care_u32 s_found;
    CareCovWork* w = p.cov_work;
    if (w->k == 0u) {
        if (threadIdx.x == 0) {
            w->cut_key = ~0ull; // nothing counts, nothing is a candidate
            w->tie_end = 0u;
            w->selected = 0u;
            w->candidates = 0u;
        }
        return;
    }
    care_u64 cut;
    care_u32 ties;
    const care_u32 total = care_cov_prefix(w, CARE_COV_ROUNDS, &cut, &ties);
    if (total <= w->k) {
        if (threadIdx.x == 0) {
            w->cut_key = 1ull; // the smallest key: every candidate
            w->tie_end = p.n_tok;
            w->selected = total;
            w->candidates = total;
        }
        return;
    }
    // The keys equal to the cut: the last round's bin of its last digit.
    const care_u32 eq = w->hist[CARE_COV_ROUNDS - 1][(care_u32)(cut & 255ull)];
    care_u32 tie_end = p.n_tok;
    if (ties < eq) {
        // Take the first `ties` tokens with key == cut in token order: one tile of blockDim
        // tokens at a time, a block-wide count of the tile's ties and a warp scan for the
        // position inside the tile that reaches `ties`.
        care_u32 run = 0;
        if (threadIdx.x == 0) {
            s_found = p.n_tok;
        }
        for (care_u32 base = 0; base < p.n_tok; base += blockDim.x) {
            care_u32 t = base + threadIdx.x;
            care_u32 f = (t < p.n_tok && p.cov_keys[t] == cut) ? 1u : 0u;
            care_u32 tile = care_block_sum(f, uscratch); // leading barrier: s_found is visible
            if (run + tile >= ties) {
                // Inclusive prefix of f over the block: warp scan plus the warps before.
                const care_u32 lane = threadIdx.x & (CARE_WARP - 1), warp = threadIdx.x / CARE_WARP;
                care_u32 incl = f;
                for (int o = 1; o < CARE_WARP; o <<= 1) {
                    care_u32 v = __shfl_sync(CARE_FULL_MASK, incl, lane >= (care_u32)o ? lane - o : lane);
                    incl += lane >= (care_u32)o ? v : 0u;
                }
                __syncthreads();
                if (lane == CARE_WARP - 1) {
                    uscratch[warp] = incl;
                }
                __syncthreads();
                for (care_u32 k = 0; k < warp; ++k) {
                    incl += uscratch[k];
                }
                if (f != 0u && run + incl == ties) {
                    s_found = t + 1u;
                }
                __syncthreads();
                break; // uniform: every thread saw the same tile count
            }
            run += tile;
        }
        tie_end = s_found;
    }
    if (threadIdx.x == 0) {
        w->cut_key = cut;
        w->tie_end = tie_end;
        w->selected = w->k;
        w->candidates = total;
    }
}

// Whether the covariance selection took token t; `cut` and `tie_end` from p.cov_work.
__device__ __forceinline__ bool care_cov_selected(const CareLossParams& p, care_u32 t,
                                                  care_u64 cut, care_u32 tie_end) {
    if (p.cov_work == 0) {
        return false;
    }
    care_u64 key = p.cov_keys[t];
    return key != 0ull && (key > cut || (key == cut && t < tie_end));
}

// Chunk blockIdx.y of sequence `seq`: its tokens' gradient, their statistics into `st` (every
// thread) and the sequence's own additions into `seq_acc` (thread 0). Every thread of the block
// calls it (block reductions inside).
template <typename T>
__device__ __forceinline__ void care_grpo_loss_seq(const CareLossParams& p, care_u32 seq,
                                                   CareStatAcc& st, CareLossSlot& seq_acc,
                                                   float* scratch) {
    CareSeqInfo si = care_seq_info<T>(p, seq, scratch);
    const bool kl_on = p.beta > 0.0f && p.logp_ref != 0;
    const care_u64 cov_cut = p.cov_work != 0 ? p.cov_work->cut_key : 0ull;
    const care_u32 cov_tie_end = p.cov_work != 0 ? p.cov_work->tie_end : 0u;
    const bool with_roll = p.logp_rollout != 0;

    // The rollout diagnostics of the sequence, once (chunk 0), from its sequence pass.
    if (with_roll && p.rollout_stats != 0 && blockIdx.y == 0 && threadIdx.x == 0 &&
        si.n_pre > 0.0f) {
        CareRolloutStats* r = &seq_acc.roll;
        float d = -si.roll.sum_x / si.n_pre;
        r->tokens += (care_u32)si.n_pre;
        r->sequences += 1u;
        r->rejected_tokens += (care_u32)(si.n_pre - si.n_kept);
        r->rejected_sequences += si.n_kept < si.n_pre ? 1u : 0u;
        r->truncated += (care_u32)si.roll.n_trunc;
        r->non_finite += (care_u32)si.roll.n_non_finite;
        r->weight_sum += si.roll.w_sum;
        r->kl_sum += -si.roll.sum_x;
        r->k3_sum += si.roll.k3_raw;
        r->log_ppl_diff_sum += d;
        r->log_ppl_abs_diff_sum += d < 0.0f ? -d : d;
        r->chi2_token_sum += si.roll.chi2;
        r->chi2_seq_sum += expf(2.0f * care_roll_clamp(si.roll.sum_x, p.roll_clamp));
    }

    const care_u32 stride = gridDim.y * blockDim.x;
    for (care_u32 t = si.start + blockIdx.y * blockDim.x + threadIdx.x; t < si.end; t += stride) {
        float g = 0.0f;
        // The token's log-probs are loaded before the mask decides (t is in bounds either way),
        // so the mask and log-prob loads are one round trip, not two.
        const float lp = care_load((const T*)p.logp, t);
        const float lo = care_logp_old<T>(p, t, lp);
        if (care_counted(p, t)) {
            float omega = 1.0f;
            bool in_loss = true;
            bool lr_fin = true;
            if (p.roll_on != 0) {
                float lrl = care_load((const T*)p.logp_rollout, t);
                CareRollTok rt = care_roll_tok(p, si.roll, care_prox_of(p, lo, lp), lrl);
                lr_fin = care_isfinite(lrl);
                omega = rt.kept ? (p.bypass != 0 ? 1.0f : rt.w) : 0.0f;
                in_loss = rt.kept || p.rej_zero != 0;
            }
            if (!in_loss) {
                // Dropped: it leaves the loss, but a non-finite log-prob the correction read
                // (its sequence statistics did) counts as a non-finite input.
                st.non_finite += (care_isfinite(care_prox_of(p, lo, lp)) && lr_fin) ? 0u : 1u;
            } else {
                float a = care_adv_at(p, seq, t);
                float lr = kl_on ? care_load((const T*)p.logp_ref, t) : 0.0f;
                float raw = lp - lo;
                float delta = care_clamp(raw, -p.log_ratio_clamp, p.log_ratio_clamp);
                bool clamped = raw < -p.log_ratio_clamp || raw > p.log_ratio_clamp;
                float rho;
                float l;
                bool clipped, low, high, dual;
                if (p.seq_level != 0) {
                    rho = si.rho_seq;
                    CareSurrogate su = care_surrogate(p, a, rho);
                    l = omega * su.l;
                    if (p.seq_level == CARE_RATIO_SEQUENCE) {
                        g = (si.seq_hit || clamped) ? 0.0f : si.gspo_coef;
                    } else {
                        // GSPO-token: d s_i,t / d logp_t = s_i (0 when the mean was capped).
                        g = (su.unclipped && !si.seq_hit) ? omega * (-a * (rho * si.w)) : 0.0f;
                    }
                    clipped = su.clipped;
                    low = rho < 1.0f - p.eps_low && a < 0.0f;
                    high = rho > 1.0f + p.eps_high && a > 0.0f;
                    dual = su.dual;
                } else if (p.policy == CARE_PL_VESPO) {
                    // -sg(phi) A logp, phi = exp(lam + k ln w - lam w) of the sequence's w
                    // (normalized so phi(1) = 1; 0 where not finite); no rollout weight: it is
                    // folded into w.
                    rho = si.rho_seq;
                    bool pos = a >= 0.0f;
                    float k = pos ? p.vespo_k_pos : p.vespo_k_neg;
                    float lam = pos ? p.vespo_lambda_pos : p.vespo_lambda_neg;
                    lam = lam < 1e-4f ? 1e-4f : lam;
                    float phi = expf(lam + k * si.a_mean - lam * rho);
                    phi = care_isfinite(phi) ? phi : 0.0f;
                    l = -phi * a * lp;
                    g = -phi * a * si.w;
                    clipped = low = high = dual = false;
                } else if (p.policy == CARE_PL_GMPO) {
                    // Every counted token carries the sequence's loss l_i; with the common weight
                    // w, dL/dlogp_t = w * l_i * [delta_t live] (times the weight's mean).
                    rho = si.rho_seq;
                    bool live;
                    care_gmpo_log_ratio(p, delta, a, &live);
                    float li = -si.a_mean * rho;
                    l = si.omega_seq * li;
                    g = clamped ? 0.0f : si.omega_seq * (li * (live ? 1.0f : 0.0f)) * si.w;
                    bool bound = !live && a != 0.0f;
                    clipped = bound;
                    low = bound && a < 0.0f;
                    high = bound && a > 0.0f;
                    dual = false;
                } else {
                    rho = expf(delta);
                    bool sel = care_cov_selected(p, t, cov_cut, cov_tie_end);
                    CareTerm tt = care_token_term(p, lp, a, rho, delta, clamped, si.w, sel);
                    l = omega * tt.l;
                    g = tt.g;
                    if (p.roll_on != 0) {
                        g *= omega;
                    }
                    clipped = tt.clipped;
                    low = tt.low;
                    high = tt.high;
                    dual = tt.dual;
                }
                if (kl_on) {
                    float k, dk;
                    care_kl(p, lp, lr, &k, &dk);
                    l += p.beta * k;
                    g += p.beta * si.w * dk;
                    st.kl += k;
                }
                st.loss += si.w * l;
                st.ppo_kl -= delta;
                st.ratio_sum += rho;
                if (care_isfinite(rho)) {
                    st.ratio_min = rho < st.ratio_min ? rho : st.ratio_min;
                    st.ratio_max = rho > st.ratio_max ? rho : st.ratio_max;
                }
                st.tokens += 1;
                st.clipped += clipped ? 1u : 0u;
                st.clipped_low += low ? 1u : 0u;
                st.clipped_high += high ? 1u : 0u;
                st.dual += dual ? 1u : 0u;
                st.clamped += clamped ? 1u : 0u;
                bool fin = care_isfinite(lp) && care_isfinite(lo) && care_isfinite(a) &&
                           (!kl_on || care_isfinite(lr)) && (p.roll_on == 0 || lr_fin);
                st.non_finite += fin ? 0u : 1u;
                if (fin) {
                    g = care_saturate(g); // finite inputs give a finite gradient, as on the CPU
                }
            }
        }
        if (p.grad != 0) {
            // A token with mask 0 (or dropped by the rollout correction) gets exactly 0,
            // whatever its inputs.
            if (p.grad_in_input_dtype != 0) {
                care_store((T*)p.grad, t, g);
            } else {
                care_store((float*)p.grad, t, g);
            }
        }
    }

    // `sequences`: counted once per sequence with a counted token, by chunk 0. Without n_i, chunk
    // 0 searches for a counted token from the start of the sequence, block-wide: a few mask
    // bytes in the usual case, the whole mask only for a fully masked sequence.
    if (p.stats == 0) {
        return; // uniform over the block
    }
    bool add = false;
    if (si.scanned) {
        add = blockIdx.y == 0 && si.n_counted > 0;
    } else if (blockIdx.y == 0) { // uniform over the block
        __shared__ care_u32 uscratch[CARE_WARP];
        const care_u32 none = 0xffffffffu;
        care_u32 first = none; // the smallest counted token index (any would do)
        for (care_u32 base = si.start; base < si.end && first == none; base += blockDim.x) {
            care_u32 t = base + threadIdx.x;
            care_u32 mine = (t < si.end && p.mask[t] != 0) ? t : none;
            first = care_block_min(mine, uscratch, none); // uniform: every thread sees it
        }
        add = first != none;
    }
    if (threadIdx.x == 0 && add) {
        seq_acc.loss.sequences += 1u;
    }
}

// The loss pass. Geometry: grid = (blocks striding over the sequences, chunks), at most
// CARE_STAT_SLOTS blocks in all (one statistics slot each), blockDim.x a multiple of 32.
template <typename T>
__device__ void care_grpo_loss(const CareLossParams& p) {
    __shared__ float scratch[CARE_WARP];
    const bool kl_on = p.beta > 0.0f && p.logp_ref != 0;
    CareStatAcc st;
    st.loss = 0.0f;
    st.ppo_kl = 0.0f;
    st.kl = 0.0f;
    st.ratio_sum = 0.0f;
    st.ratio_min = __uint_as_float(0x7f800000u);
    st.ratio_max = 0.0f;
    st.tokens = 0;
    st.clipped = 0;
    st.clipped_low = 0;
    st.clipped_high = 0;
    st.dual = 0;
    st.clamped = 0;
    st.non_finite = 0;
    // The per-sequence additions (the `sequences` count and the rollout diagnostics), made by
    // thread 0: in shared memory, so that no thread carries 27 more registers through the loop.
    __shared__ CareLossSlot seq_acc;
    if (threadIdx.x == 0) {
        care_loss_slot_clear(&seq_acc);
    }
    for (care_u32 seq = blockIdx.x; seq < p.n_seq; seq += gridDim.x) {
        care_grpo_loss_seq<T>(p, seq, st, seq_acc, scratch);
    }

    if (p.work == 0) {
        return; // no statistics wanted (uniform over the grid): no barrier follows
    }
    // Stats: reduced over the warp with shuffles, then over the block through shared memory, into
    // the block's slot; the last block merges the slots in slot order (care_loss_commit).
    __shared__ float fpart[6][CARE_WARP];
    __shared__ care_u32 upart[7][CARE_WARP];
    const care_u32 lane = threadIdx.x & (CARE_WARP - 1);
    const care_u32 warp = threadIdx.x / CARE_WARP;
    const care_u32 nwarps = (blockDim.x + CARE_WARP - 1) / CARE_WARP;
    float f[6] = {st.loss, st.ppo_kl, st.kl, st.ratio_sum, st.ratio_min, st.ratio_max};
    care_u32 u[7] = {st.tokens, st.clipped, st.clipped_low, st.clipped_high,
                     st.dual,   st.clamped, st.non_finite};
    for (int k = 0; k < 4; ++k) {
        f[k] = care_warp_sum(f[k]);
    }
    f[4] = care_warp_min(f[4]);
    f[5] = care_warp_max(f[5]);
    for (int k = 0; k < 7; ++k) {
        u[k] = care_warp_sum(u[k]);
    }
    if (lane == 0) {
        for (int k = 0; k < 6; ++k) {
            fpart[k][warp] = f[k];
        }
        for (int k = 0; k < 7; ++k) {
            upart[k][warp] = u[k];
        }
    }
    __syncthreads();
    if (warp == 0) {
        const bool in = lane < nwarps;
        for (int k = 0; k < 4; ++k) {
            f[k] = care_warp_sum(in ? fpart[k][lane] : 0.0f);
        }
        f[4] = care_warp_min(in ? fpart[4][lane] : __uint_as_float(0x7f800000u));
        f[5] = care_warp_max(in ? fpart[5][lane] : 0.0f);
        for (int k = 0; k < 7; ++k) {
            u[k] = care_warp_sum(in ? upart[k][lane] : 0u);
        }
        if (lane == 0) {
            CareLossStats* s = &seq_acc.loss;
            s->loss = f[0];
            s->ppo_kl_sum = f[1];
            s->kl_sum = kl_on ? f[2] : 0.0f;
            s->ratio_sum = f[3];
            s->ratio_min = f[4];
            s->ratio_max = f[5];
            s->tokens = u[0];
            s->clipped = u[1];
            s->clipped_low = u[2];
            s->clipped_high = u[3];
            s->dual_clipped = u[4];
            s->log_ratio_clamped = u[5];
            // Tokens the rollout correction drops count as non-finite inputs too.
            s->non_finite = u[6];
        }
    }
    // Thread 0 (lane 0 of warp 0) holds the block's whole slot.
    care_loss_commit(p, &seq_acc, kl_on);
}

// ---- fused logits -> token-local loss -> dlogits ------------------------------------------------
// For the losses whose term at token t needs only token t (the clipped ratio with or without the
// dual clip, CISPO, SAPO, GPG, the KL term; every aggregation, seq_mean_token_mean through its
// per-sequence count), one pass per row of logits: the row's online (max, sum-exp), the token's
// log-prob from the target logit fetched at the row's start, the loss term and dL/dlogp (thread
// 0), then dlogits = (g / T) (onehot - p) written at once, walking the row backwards so that the
// second touch of each logit finds it in L2 (docs/KERNELS.md has the traffic arithmetic). Every
// value is computed with the same operations, in the same order, as the three-kernel path
// (logsoftmax_fwd, grpo_loss, logsoftmax_bwd) with the same block size, so logp and dlogits
// equal it bit for bit; the statistics go through the slots (care_loss_commit).
//
// Geometry: grid.x blocks of blockDim.x threads (1024 and one block per SM by default), block b
// owning the contiguous rows [b * per, (b + 1) * per) with per = ceil(n / grid.x), at most
// CARE_STAT_SLOTS blocks. Consecutive rows mostly share a sequence, whose count n_i (and first
// counted token, for the `sequences` statistic) a block scans from the mask once.

// The sequence holding token t: the last one whose (clamped) start is <= t. Any offsets give an
// index in 0..n_seq (n_seq >= 1).
__device__ __forceinline__ care_u32 care_seq_of(const CareLossParams& p, care_u32 t) {
    care_u32 lo = 0, hi = p.n_seq;
    while (hi - lo > 1u) {
        const care_u32 mid = lo + (hi - lo) / 2u;
        const care_u32 a = p.seq_offsets[mid];
        if ((a < p.n_tok ? a : p.n_tok) <= t) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

template <typename T>
__device__ void care_logits_loss(const CareLossParams& p, const CareLsmParams& x) {
    __shared__ float sm[3][CARE_WARP];
    __shared__ float s_cg, s_lse2;
    __shared__ care_u32 uscratch[CARE_WARP];
    __shared__ float fscratch[CARE_WARP];
    __shared__ CareLossSlot acc; // thread 0's statistics of the block's tokens
    const bool kl_on = p.beta > 0.0f && p.logp_ref != 0;
    const float scale = x.inv_temp * CARE_LOG2E;
    const care_u64 per = (x.n + gridDim.x - 1u) / gridDim.x;
    const care_u64 r0 = (care_u64)blockIdx.x * per;
    const care_u64 r1 = r0 + per < x.n ? r0 + per : x.n;
    if (threadIdx.x == 0) {
        care_loss_slot_clear(&acc);
    }
    // The cached sequence (uniform over the block): [start, end), its weight.
    care_u32 seq = 0, start = 0, end = 0;
    float w = 0.0f;
    bool have_seq = false;
    for (care_u64 row = r0; row < r1; ++row) {
        const care_u32 t = (care_u32)row;
        if (!have_seq || t >= end || t < start) {
            seq = care_seq_of(p, t);
            care_seq_bounds(p, seq, &start, &end);
            have_seq = true;
            care_u32 n_counted = end - start, first = start < end ? start : 0xffffffffu;
            const bool scan = p.mask != 0 && (p.agg == CARE_AGG_SEQ_MEAN_TOKEN_MEAN || p.work != 0);
            if (scan) { // uniform over the block
                float c = 0.0f;
                care_u32 f = 0xffffffffu;
                for (care_u32 i = start + threadIdx.x; i < end; i += blockDim.x) {
                    const bool on = p.mask[i] != 0;
                    c += on ? 1.0f : 0.0f;
                    f = (on && i < f) ? i : f;
                }
                n_counted = (care_u32)care_block_sum(c, fscratch);
                first = care_block_min(f, uscratch, 0xffffffffu);
            }
            w = care_agg_weight(p, n_counted);
            // `sequences`: counted by the block that holds the sequence's first counted token.
            if (threadIdx.x == 0 && p.stats != 0 && first != 0xffffffffu && first >= r0 &&
                first < r1) {
                acc.loss.sequences += 1u;
            }
        }
        T* drow = (T*)x.dlogits + row * x.dstride;
        if (!care_lsm_counted(x, row)) {
            if (threadIdx.x == 0 && x.logp != 0) {
                x.logp[row] = 0.0f;
            }
            if (threadIdx.x == 0 && x.lse != 0) {
                x.lse[row] = 0.0f;
            }
            care_lsm_zero_row<T>(drow, x.vocab, threadIdx.x, blockDim.x);
            continue; // uniform over the block
        }
        const bool in_seq = t >= start && t < end;
        const T* xrow = (const T*)x.logits + row * x.stride;
        const CareLsmTarget tg = care_lsm_fetch_target<T>(x, row, xrow);
        const CareLsmState st = care_lsm_block_state<T, false, CARE_L2_LAST>(x, xrow, sm);
        if (threadIdx.x == 0) {
            const float lse2 = st.m + log2f(st.s);
            if (!care_isfinite(lse2) && x.status != 0) {
                atomicOr(x.status, CARE_LSM_STATUS_NON_FINITE);
            }
            float lp = __uint_as_float(0x7fc00000u); // NaN: the reference rejects such a target
            if (tg.y < 0) {
                if (x.status != 0) {
                    atomicOr(x.status, CARE_LSM_STATUS_BAD_TARGET);
                }
            } else {
                lp = (CARE_MUL_RN(tg.x, scale) - lse2) * CARE_LN2;
            }
            if (x.logp != 0) {
                x.logp[row] = lp;
            }
            const float lse = lse2 * CARE_LN2;
            if (x.lse != 0) {
                x.lse[row] = lse;
            }
            // The token's term, as care_grpo_loss_seq at the token ratio level without the
            // rollout correction (log-probs in f32).
            float g = 0.0f;
            if (in_seq) {
                const float lo = p.logp_old != 0 ? ((const float*)p.logp_old)[t] : lp;
                const float a = care_adv_at(p, seq, t);
                const float lr = kl_on ? ((const float*)p.logp_ref)[t] : 0.0f;
                const float raw = lp - lo;
                const float delta = care_clamp(raw, -p.log_ratio_clamp, p.log_ratio_clamp);
                const bool clamped = raw < -p.log_ratio_clamp || raw > p.log_ratio_clamp;
                const float rho = expf(delta);
                const CareTerm tt = care_token_term(p, lp, a, rho, delta, clamped, w, false);
                float l = tt.l;
                g = tt.g;
                CareLossStats* s = &acc.loss;
                if (kl_on) {
                    float k, dk;
                    care_kl(p, lp, lr, &k, &dk);
                    l += p.beta * k;
                    g += p.beta * w * dk;
                    s->kl_sum += k;
                }
                s->loss += w * l;
                s->ppo_kl_sum -= delta;
                s->ratio_sum += rho;
                if (care_isfinite(rho)) {
                    s->ratio_min = rho < s->ratio_min ? rho : s->ratio_min;
                    s->ratio_max = rho > s->ratio_max ? rho : s->ratio_max;
                }
                s->tokens += 1u;
                s->clipped += tt.clipped ? 1u : 0u;
                s->clipped_low += tt.low ? 1u : 0u;
                s->clipped_high += tt.high ? 1u : 0u;
                s->dual_clipped += tt.dual ? 1u : 0u;
                s->log_ratio_clamped += clamped ? 1u : 0u;
                const bool fin = care_isfinite(lp) && care_isfinite(lo) && care_isfinite(a) &&
                                 (!kl_on || care_isfinite(lr));
                s->non_finite += fin ? 0u : 1u;
                if (fin) {
                    g = care_saturate(g);
                }
            }
            // dL/dlogp goes through f32 as the three-kernel path's dlogp buffer does, and lse
            // through its f32 natural-log value.
            s_cg = g * x.inv_temp;
            s_lse2 = lse * CARE_LOG2E;
        }
        __syncthreads(); // s_cg and s_lse2; the next row's thread 0 writes them only after
                         // care_lsm_block_state's barriers, which every thread passes after this
                         // row's gradient
        CareLsmRowGrad r;
        r.scale = scale;
        r.lse2 = s_lse2;
        r.cg = s_cg;
        r.ce = 0.0f;
        r.h = 0.0f;
        r.y = tg.y < 0 ? 0xffffffffu : (care_u32)tg.y;
        care_lsm_grad_row_reverse<T>(r, xrow, drow, x.vocab, threadIdx.x, blockDim.x);
    }
    if (p.work != 0) { // uniform over the grid
        care_loss_commit(p, &acc, kl_on);
    }
}

// Default denominators. Geometry: grid.x = min(n_seq, 1024) blocks striding over sequences,
// blockDim.x a multiple of 32; *out must be zeroed on the stream first. Tokens the rollout
// correction drops leave the counts (the sequence pass reads the log-probs in `dtype`).
template <typename T>
__device__ void care_loss_denoms(const CareLossParams& p, CareLossDenoms* out) {
    __shared__ float scratch[CARE_WARP];
    const bool with_roll = care_roll_drops(p);
    for (care_u32 seq = blockIdx.x; seq < p.n_seq; seq += gridDim.x) {
        care_u32 a = p.seq_offsets[seq];
        care_u32 b = p.seq_offsets[seq + 1];
        care_u32 start = a < p.n_tok ? a : p.n_tok;
        care_u32 end = b < start ? start : (b < p.n_tok ? b : p.n_tok);
        CareSeqCount c = care_seq_count<T, false>(p, start, end, with_roll, scratch);
        care_u32 n = (care_u32)c.n_kept;
        if (threadIdx.x == 0) {
            atomicAdd(&out->n_tok, n);
            atomicAdd(&out->n_seq, n > 0 ? 1u : 0u);
            atomicMax(&out->horizon, end - start);
        }
    }
}

extern "C" __global__ void __launch_bounds__(256, 4) grpo_loss_denoms(CareLossParams p,
                                                                   CareLossDenoms* out) {
    switch (p.dtype) { // uniform over the grid
    case 1u:
        care_loss_denoms<care_bf16>(p, out);
        break;
    case 2u:
        care_loss_denoms<care_f16>(p, out);
        break;
    default:
        care_loss_denoms<float>(p, out);
        break;
    }
}

#define CARE_LOSS_ENTRY(NAME, T)                                                               \
    extern "C" __global__ void __launch_bounds__(256, 4) NAME(CareLossParams p) {             \
        care_grpo_loss<T>(p);                                                                  \
    }

CARE_LOSS_ENTRY(grpo_loss_f32, float)
CARE_LOSS_ENTRY(grpo_loss_bf16, care_bf16)
CARE_LOSS_ENTRY(grpo_loss_f16, care_f16)

// The covariance selection's pre-passes (Clip-Cov, KL-Cov), in launch order.
#define CARE_COV_DTYPE_ENTRY(NAME, FN)                                                         \
    extern "C" __global__ void __launch_bounds__(256, 4) NAME(CareLossParams p) {             \
        switch (p.dtype) { /* uniform over the grid */                                         \
        case 1u:                                                                               \
            FN<care_bf16>(p);                                                                  \
            break;                                                                             \
        case 2u:                                                                               \
            FN<care_f16>(p);                                                                   \
            break;                                                                             \
        default:                                                                               \
            FN<float>(p);                                                                      \
            break;                                                                             \
        }                                                                                      \
    }

CARE_COV_DTYPE_ENTRY(grpo_cov_means, care_cov_means)
CARE_COV_DTYPE_ENTRY(grpo_cov_keys, care_cov_keys)

extern "C" __global__ void __launch_bounds__(256, 4) grpo_cov_radix(CareLossParams p) {
    care_cov_radix(p);
}

extern "C" __global__ void __launch_bounds__(1024, 1) grpo_cov_cut(CareLossParams p) {
    care_cov_cut(p);
}

// The fused logits-to-loss pass: (CareLossParams, CareLsmParams), log-probs of the loss in f32.
#define CARE_LOGITS_LOSS_ENTRY(NAME, T)                                                        \
    extern "C" __global__ void __launch_bounds__(1024, 1) NAME(CareLossParams p,              \
                                                              CareLsmParams x) {             \
        care_logits_loss<T>(p, x);                                                             \
    }

CARE_LOGITS_LOSS_ENTRY(logits_loss_f32, float)
CARE_LOGITS_LOSS_ENTRY(logits_loss_bf16, care_bf16)
CARE_LOGITS_LOSS_ENTRY(logits_loss_f16, care_f16)
