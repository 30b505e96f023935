// Fused clipped-ratio policy loss, its analytic gradient and its stats (SPEC section 10).
//
// One block per (sequence, chunk): grid = (n_seq, chunks), blockDim.x a multiple of 32. Block
// (i, y) owns the tokens start_i + y*blockDim.x + k*chunks*blockDim.x of sequence i, so a long
// sequence is spread over `chunks` blocks and every block reads coalesced runs. The token-level
// path reads each input once and writes the gradient once; only seq_mean_token_mean first scans
// the u8 mask for the per-sequence count n_i. The sequence-level ratio (GSPO) needs the mean log
// ratio and a masked sum over the whole sequence before any gradient can be written, so that
// path reads the sequence twice more (each chunk block does it).
//
// Stats are reduced per block and added to the caller's device struct with atomics; the caller
// initializes it (sums 0, ratio_min +inf, ratio_max 0), so micro-batches accumulate.
// Float atomics make the last bits of the sums depend on the block schedule; the gradient does
// not depend on any atomic.
#include "common.cuh"

#define CARE_AGG_TOKEN_MEAN 0u
#define CARE_AGG_SEQ_MEAN_TOKEN_MEAN 1u
#define CARE_AGG_SEQ_MEAN_TOKEN_SUM 2u
#define CARE_AGG_SEQ_MEAN_TOKEN_SUM_NORM 3u
#define CARE_AGG_TOKEN_SUM 4u

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

// Mirrored by `care_kernels::params::LossDenomsRaw`: the default denominators, computed on the
// device by grpo_loss_denoms when the caller passes none.
struct CareLossDenoms {
    care_u32 n_tok;   // counted tokens
    care_u32 n_seq;   // sequences with at least one counted token
    care_u32 horizon; // longest sequence (offsets difference)
    care_u32 pad0;
};

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
    care_u32 pad0;
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
    float pad1;
};

struct CareSeqInfo {
    care_u32 start, end, n_counted;
    bool scanned;     // n_counted is known before the main pass
    float w;          // aggregation weight of every counted token of the sequence
    float rho_seq;    // GSPO only
    bool seq_hit;     // GSPO: the mean log ratio reached its bound (no gradient)
    float gspo_coef;  // GSPO: rho_i / n_i * sum_t' w (-A_t') [unclipped at t']
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

// Per-sequence quantities; every thread of the block gets them (block reductions).
template <typename T>
__device__ CareSeqInfo care_seq_info(const CareLossParams& p, care_u32 seq, float* scratch) {
    CareSeqInfo s;
    care_u32 a = p.seq_offsets[seq];
    care_u32 b = p.seq_offsets[seq + 1];
    s.start = a < p.n_tok ? a : p.n_tok;
    s.end = b < s.start ? s.start : (b < p.n_tok ? b : p.n_tok);

    // n_i: counted tokens of the sequence. Without a mask it is the length. With one, a u8 scan
    // of the sequence, done only where n_i is needed before the main pass: the weight of
    // seq_mean_token_mean and the GSPO mean. Otherwise nothing needs it (the `sequences` stat
    // looks for the first counted token instead, see care_grpo_loss), so each input is read
    // once. Counts are summed as float, exact below 2^24 tokens per sequence.
    s.scanned = p.mask == 0 || p.agg == CARE_AGG_SEQ_MEAN_TOKEN_MEAN || p.seq_level != 0;
    if (p.mask == 0) {
        s.n_counted = s.end - s.start;
    } else if (!s.scanned) {
        s.n_counted = 0; // unused before the main pass; counted there
    } else {
        float c = 0.0f;
        for (care_u32 t = s.start + threadIdx.x; t < s.end; t += blockDim.x) {
            c += p.mask[t] != 0 ? 1.0f : 0.0f;
        }
        s.n_counted = (care_u32)care_block_sum(c, scratch);
    }

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
        d = (float)s.n_counted * n_seq;
        break;
    case CARE_AGG_SEQ_MEAN_TOKEN_SUM:
        d = n_seq;
        break;
    case CARE_AGG_SEQ_MEAN_TOKEN_SUM_NORM:
        d = n_seq * h;
        break;
    default:
        d = 1.0f;
        break;
    }
    s.w = d > 0.0f ? 1.0f / d : 0.0f;

    s.rho_seq = 1.0f;
    s.seq_hit = false;
    s.gspo_coef = 0.0f;
    if (p.seq_level != 0 && s.n_counted > 0) {
        float sd = 0.0f;
        for (care_u32 t = s.start + threadIdx.x; t < s.end; t += blockDim.x) {
            if (care_counted(p, t)) {
                float lp = care_load((const T*)p.logp, t);
                float lo = care_logp_old<T>(p, t, lp);
                sd += care_clamp(lp - lo, -p.log_ratio_clamp, p.log_ratio_clamp);
            }
        }
        sd = care_block_sum(sd, scratch);
        float mean = sd / (float)s.n_counted;
        s.seq_hit = mean > p.seq_log_ratio_max;
        s.rho_seq = expf(s.seq_hit ? p.seq_log_ratio_max : mean);
        // sum over the sequence of w * (-A) where the unclipped branch is active.
        float acc = 0.0f;
        for (care_u32 t = s.start + threadIdx.x; t < s.end; t += blockDim.x) {
            if (care_counted(p, t)) {
                float a = care_adv_at(p, seq, t);
                CareSurrogate su = care_surrogate(p, a, s.rho_seq);
                if (su.unclipped) {
                    acc += -a;
                }
            }
        }
        acc = care_block_sum(acc, scratch);
        s.gspo_coef = s.rho_seq / (float)s.n_counted * (s.w * acc);
    }
    return s;
}

struct CareStatAcc {
    float loss, ppo_kl, kl, ratio_sum, ratio_min, ratio_max;
    care_u32 tokens, clipped, clipped_low, clipped_high, dual, clamped, non_finite;
};

template <typename T>
__device__ void care_grpo_loss(const CareLossParams& p) {
    __shared__ float scratch[CARE_WARP];
    const care_u32 seq = blockIdx.x;
    if (seq >= p.n_seq) {
        return; // uniform over the block
    }
    CareSeqInfo si = care_seq_info<T>(p, seq, scratch);
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

    const care_u32 stride = gridDim.y * blockDim.x;
    for (care_u32 t = si.start + blockIdx.y * blockDim.x + threadIdx.x; t < si.end; t += stride) {
        float g = 0.0f;
        if (care_counted(p, t)) {
            float lp = care_load((const T*)p.logp, t);
            float lo = care_logp_old<T>(p, t, lp);
            float a = care_adv_at(p, seq, t);
            float lr = kl_on ? care_load((const T*)p.logp_ref, t) : 0.0f;
            float raw = lp - lo;
            float delta = care_clamp(raw, -p.log_ratio_clamp, p.log_ratio_clamp);
            bool clamped = raw < -p.log_ratio_clamp || raw > p.log_ratio_clamp;
            float rho = p.seq_level != 0 ? si.rho_seq : expf(delta);
            CareSurrogate su = care_surrogate(p, a, rho);
            float l = su.l;
            if (p.seq_level != 0) {
                g = (si.seq_hit || clamped) ? 0.0f : si.gspo_coef;
            } else {
                // rho * w first: it cannot overflow (rho <= e^clamp), so the product overflows
                // only when the f64 reference value does.
                g = (su.unclipped && !clamped) ? -a * (rho * si.w) : 0.0f;
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
            st.clipped += su.clipped ? 1u : 0u;
            st.clipped_low += (rho < 1.0f - p.eps_low && a < 0.0f) ? 1u : 0u;
            st.clipped_high += (rho > 1.0f + p.eps_high && a > 0.0f) ? 1u : 0u;
            st.dual += su.dual ? 1u : 0u;
            st.clamped += clamped ? 1u : 0u;
            bool fin = care_isfinite(lp) && care_isfinite(lo) && care_isfinite(a) &&
                       (!kl_on || care_isfinite(lr));
            st.non_finite += fin ? 0u : 1u;
            if (fin) {
                g = care_saturate(g); // finite inputs give a finite gradient, as on the CPU
            }
        }
        if (p.grad != 0) {
            // A token with mask 0 gets exactly 0, whatever its inputs.
            if (p.grad_in_input_dtype != 0) {
                care_store((T*)p.grad, t, g);
            } else {
                care_store((float*)p.grad, t, g);
            }
        }
    }

    if (p.stats == 0) {
        return; // uniform over the block: no barrier follows
    }
    // Stats: reduced over the warp with shuffles, then over the block through shared memory, then
    // one atomic per field per block (every block adds into the same 14 addresses, so fewer
    // atomics means less serialization in L2).
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
        if (lane == 0 && u[0] > 0) {
            CareLossStats* s = p.stats;
            atomicAdd(&s->loss, f[0]);
            atomicAdd(&s->ppo_kl_sum, f[1]);
            if (kl_on) {
                atomicAdd(&s->kl_sum, f[2]);
            }
            atomicAdd(&s->ratio_sum, f[3]);
            if (f[5] >= f[4]) { // at least one finite ratio
                care_atomic_min_nonneg(&s->ratio_min, f[4]);
                care_atomic_max_nonneg(&s->ratio_max, f[5]);
            }
            atomicAdd(&s->tokens, u[0]);
            atomicAdd(&s->clipped, u[1]);
            atomicAdd(&s->clipped_low, u[2]);
            atomicAdd(&s->clipped_high, u[3]);
            atomicAdd(&s->dual_clipped, u[4]);
            atomicAdd(&s->log_ratio_clamped, u[5]);
            atomicAdd(&s->non_finite, u[6]);
        }
    }

    // `sequences`: counted once per sequence with a counted token, by chunk 0. Without n_i, chunk
    // 0 searches for a counted token from the start of the sequence, block-wide: a few mask
    // bytes in the usual case, the whole mask only for a fully masked sequence.
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
        atomicAdd(&p.stats->sequences, 1u);
    }
}

// Default denominators. Geometry: grid.x = min(n_seq, 1024) blocks striding over sequences,
// blockDim.x a multiple of 32; *out must be zeroed on the stream first.
extern "C" __global__ void __launch_bounds__(1024) grpo_loss_denoms(CareLossParams p,
                                                                   CareLossDenoms* out) {
    __shared__ float scratch[CARE_WARP];
    for (care_u32 seq = blockIdx.x; seq < p.n_seq; seq += gridDim.x) {
        care_u32 a = p.seq_offsets[seq];
        care_u32 b = p.seq_offsets[seq + 1];
        care_u32 start = a < p.n_tok ? a : p.n_tok;
        care_u32 end = b < start ? start : (b < p.n_tok ? b : p.n_tok);
        care_u32 n;
        if (p.mask == 0) {
            n = end - start;
        } else {
            float c = 0.0f;
            for (care_u32 t = start + threadIdx.x; t < end; t += blockDim.x) {
                c += p.mask[t] != 0 ? 1.0f : 0.0f;
            }
            n = (care_u32)care_block_sum(c, scratch);
        }
        if (threadIdx.x == 0) {
            atomicAdd(&out->n_tok, n);
            atomicAdd(&out->n_seq, n > 0 ? 1u : 0u);
            atomicMax(&out->horizon, end - start);
        }
    }
}

#define CARE_LOSS_ENTRY(NAME, T)                                                               \
    extern "C" __global__ void __launch_bounds__(1024) NAME(CareLossParams p) {               \
        care_grpo_loss<T>(p);                                                                  \
    }

CARE_LOSS_ENTRY(grpo_loss_f32, float)
CARE_LOSS_ENTRY(grpo_loss_bf16, care_bf16)
CARE_LOSS_ENTRY(grpo_loss_f16, care_f16)
