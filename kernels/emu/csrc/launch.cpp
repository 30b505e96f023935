// Host build of the care kernels: the .cu files compiled as C++ against cuda_emu.h, plus one C
// entry point per kernel (emu_launch_<kernel>) and the struct layouts for the Rust layout tests.
#include "cuda_emu.h"

#include "../../cuda/advantages.cu"
#include "../../cuda/grpo_loss.cu"

#include <stddef.h>

extern "C" {

#define EMU_ENTRY(KERNEL, PARAMS)                                                              \
    int emu_launch_##KERNEL(emu_uint3 grid, emu_uint3 block, size_t shmem, const PARAMS* p,  \
                            uint64_t seed) {                                                   \
        (void)shmem; /* the kernels use static shared memory only */                           \
        PARAMS copy = *p; /* by value, as a kernel parameter */                                \
        return emu::launch(grid, block, seed, [&] { KERNEL(copy); });                          \
    }

EMU_ENTRY(group_advantages_f32, CareAdvParams)
EMU_ENTRY(batch_std_f32, CareBatchStdParams)
EMU_ENTRY(group_alpha_f32, CareAdvParams)
EMU_ENTRY(grpo_loss_f32, CareLossParams)
EMU_ENTRY(grpo_loss_bf16, CareLossParams)
EMU_ENTRY(grpo_loss_f16, CareLossParams)
EMU_ENTRY(grpo_cov_means, CareLossParams)
EMU_ENTRY(grpo_cov_keys, CareLossParams)
EMU_ENTRY(grpo_cov_radix, CareLossParams)
EMU_ENTRY(grpo_cov_cut, CareLossParams)

int emu_launch_grpo_loss_denoms(emu_uint3 grid, emu_uint3 block, size_t shmem,
                                const CareLossParams* p, CareLossDenoms* out, uint64_t seed) {
    (void)shmem;
    CareLossParams copy = *p;
    return emu::launch(grid, block, seed, [&] { grpo_loss_denoms(copy, out); });
}

#define EMU_LOGITS_LOSS(KERNEL)                                                                \
    int emu_launch_##KERNEL(emu_uint3 grid, emu_uint3 block, const CareLossParams* p,         \
                            const CareLsmParams* x, uint64_t seed) {                           \
        CareLossParams pc = *p; /* by value, as kernel parameters */                           \
        CareLsmParams xc = *x;                                                                 \
        return emu::launch(grid, block, seed, [&] { KERNEL(pc, xc); });                        \
    }

EMU_LOGITS_LOSS(logits_loss_f32)
EMU_LOGITS_LOSS(logits_loss_bf16)
EMU_LOGITS_LOSS(logits_loss_f16)

// The dtype conversions of common.cuh, for exhaustive tests against the `half` crate.
float emu_f16_to_f32(uint16_t h) { return care_f16_to_f32(h); }
float emu_bf16_to_f32(uint16_t h) { return care_bf16_to_f32(h); }
uint16_t emu_f32_to_f16(float f) { return care_f32_to_f16(f); }
uint16_t emu_f32_to_bf16(float f) { return care_f32_to_bf16(f); }

// Layouts, as (size, align, offsets of every field in declaration order).
#define EMU_OFF(S, F) (uint32_t) offsetof(S, F)
size_t emu_layout_adv(uint32_t* out, size_t cap) {
    uint32_t v[] = {(uint32_t)sizeof(CareAdvParams), (uint32_t)alignof(CareAdvParams),
                    EMU_OFF(CareAdvParams, rewards), EMU_OFF(CareAdvParams, valid),
                    EMU_OFF(CareAdvParams, offsets), EMU_OFF(CareAdvParams, adv),
                    EMU_OFF(CareAdvParams, group_stats), EMU_OFF(CareAdvParams, batch_std),
                    EMU_OFF(CareAdvParams, tok_offsets), EMU_OFF(CareAdvParams, tok_mask),
                    EMU_OFF(CareAdvParams, adv_tok), EMU_OFF(CareAdvParams, status),
                    EMU_OFF(CareAdvParams, sums), EMU_OFF(CareAdvParams, m2),
                    EMU_OFF(CareAdvParams, baselines), EMU_OFF(CareAdvParams, lengths),
                    EMU_OFF(CareAdvParams, alpha),
                    EMU_OFF(CareAdvParams, n), EMU_OFF(CareAdvParams, num_groups),
                    EMU_OFF(CareAdvParams, group_size), EMU_OFF(CareAdvParams, baseline),
                    EMU_OFF(CareAdvParams, scale), EMU_OFF(CareAdvParams, unbiased),
                    EMU_OFF(CareAdvParams, singleton), EMU_OFF(CareAdvParams, warp_per_group),
                    EMU_OFF(CareAdvParams, eps), EMU_OFF(CareAdvParams, mode),
                    EMU_OFF(CareAdvParams, std_floor), EMU_OFF(CareAdvParams, reweight)};
    size_t n = sizeof(v) / sizeof(v[0]);
    for (size_t i = 0; i < n && i < cap; ++i) out[i] = v[i];
    return n;
}
size_t emu_layout_group_stats(uint32_t* out, size_t cap) {
    uint32_t v[] = {(uint32_t)sizeof(CareGroupStats), (uint32_t)alignof(CareGroupStats),
                    EMU_OFF(CareGroupStats, count), EMU_OFF(CareGroupStats, mean),
                    EMU_OFF(CareGroupStats, std), EMU_OFF(CareGroupStats, zero_variance)};
    size_t n = sizeof(v) / sizeof(v[0]);
    for (size_t i = 0; i < n && i < cap; ++i) out[i] = v[i];
    return n;
}
size_t emu_layout_batch_std(uint32_t* out, size_t cap) {
    uint32_t v[] = {(uint32_t)sizeof(CareBatchStdParams), (uint32_t)alignof(CareBatchStdParams),
                    EMU_OFF(CareBatchStdParams, rewards), EMU_OFF(CareBatchStdParams, valid),
                    EMU_OFF(CareBatchStdParams, out_std), EMU_OFF(CareBatchStdParams, sums),
                    EMU_OFF(CareBatchStdParams, m2), EMU_OFF(CareBatchStdParams, n),
                    EMU_OFF(CareBatchStdParams, unbiased), EMU_OFF(CareBatchStdParams, num_groups),
                    EMU_OFF(CareBatchStdParams, pad0), EMU_OFF(CareBatchStdParams, work)};
    size_t n = sizeof(v) / sizeof(v[0]);
    for (size_t i = 0; i < n && i < cap; ++i) out[i] = v[i];
    return n;
}
size_t emu_layout_loss(uint32_t* out, size_t cap) {
    uint32_t v[] = {(uint32_t)sizeof(CareLossParams), (uint32_t)alignof(CareLossParams),
                    EMU_OFF(CareLossParams, logp), EMU_OFF(CareLossParams, logp_old),
                    EMU_OFF(CareLossParams, logp_ref), EMU_OFF(CareLossParams, adv),
                    EMU_OFF(CareLossParams, mask), EMU_OFF(CareLossParams, seq_offsets),
                    EMU_OFF(CareLossParams, grad), EMU_OFF(CareLossParams, stats),
                    EMU_OFF(CareLossParams, denoms), EMU_OFF(CareLossParams, n_seq),
                    EMU_OFF(CareLossParams, n_tok), EMU_OFF(CareLossParams, adv_per_token),
                    EMU_OFF(CareLossParams, grad_in_input_dtype), EMU_OFF(CareLossParams, agg),
                    EMU_OFF(CareLossParams, kl), EMU_OFF(CareLossParams, seq_level),
                    EMU_OFF(CareLossParams, bypass), EMU_OFF(CareLossParams, eps_low),
                    EMU_OFF(CareLossParams, eps_high), EMU_OFF(CareLossParams, dual_clip),
                    EMU_OFF(CareLossParams, log_ratio_clamp), EMU_OFF(CareLossParams, kl_clamp),
                    EMU_OFF(CareLossParams, k3_clamp), EMU_OFF(CareLossParams, seq_log_ratio_max),
                    EMU_OFF(CareLossParams, beta), EMU_OFF(CareLossParams, n_tok_denom),
                    EMU_OFF(CareLossParams, n_seq_denom), EMU_OFF(CareLossParams, horizon),
                    EMU_OFF(CareLossParams, gmpo_w_floor), EMU_OFF(CareLossParams, logp_rollout),
                    EMU_OFF(CareLossParams, rollout_stats), EMU_OFF(CareLossParams, policy),
                    EMU_OFF(CareLossParams, is_level), EMU_OFF(CareLossParams, rej_zero),
                    EMU_OFF(CareLossParams, roll_on), EMU_OFF(CareLossParams, sapo_tau_pos),
                    EMU_OFF(CareLossParams, sapo_tau_neg), EMU_OFF(CareLossParams, is_threshold),
                    EMU_OFF(CareLossParams, is_threshold_low),
                    EMU_OFF(CareLossParams, roll_clamp), EMU_OFF(CareLossParams, rej_on),
                    EMU_OFF(CareLossParams, rej_lower), EMU_OFF(CareLossParams, rej_upper),
                    EMU_OFF(CareLossParams, dtype), EMU_OFF(CareLossParams, pad2),
                    EMU_OFF(CareLossParams, cov_ratio), EMU_OFF(CareLossParams, clip_cov_lb),
                    EMU_OFF(CareLossParams, clip_cov_ub), EMU_OFF(CareLossParams, kl_cov_coef),
                    EMU_OFF(CareLossParams, cov_round), EMU_OFF(CareLossParams, cov_work),
                    EMU_OFF(CareLossParams, cov_keys), EMU_OFF(CareLossParams, vespo_k_pos),
                    EMU_OFF(CareLossParams, vespo_lambda_pos),
                    EMU_OFF(CareLossParams, vespo_k_neg),
                    EMU_OFF(CareLossParams, vespo_lambda_neg), EMU_OFF(CareLossParams, work)};
    size_t n = sizeof(v) / sizeof(v[0]);
    for (size_t i = 0; i < n && i < cap; ++i) out[i] = v[i];
    return n;
}
size_t emu_layout_stats(uint32_t* out, size_t cap) {
    uint32_t v[] = {(uint32_t)sizeof(CareLossStats), (uint32_t)alignof(CareLossStats),
                    EMU_OFF(CareLossStats, loss), EMU_OFF(CareLossStats, ppo_kl_sum),
                    EMU_OFF(CareLossStats, kl_sum), EMU_OFF(CareLossStats, ratio_sum),
                    EMU_OFF(CareLossStats, ratio_min), EMU_OFF(CareLossStats, ratio_max),
                    EMU_OFF(CareLossStats, tokens), EMU_OFF(CareLossStats, sequences),
                    EMU_OFF(CareLossStats, clipped), EMU_OFF(CareLossStats, clipped_low),
                    EMU_OFF(CareLossStats, clipped_high), EMU_OFF(CareLossStats, dual_clipped),
                    EMU_OFF(CareLossStats, log_ratio_clamped), EMU_OFF(CareLossStats, non_finite)};
    size_t n = sizeof(v) / sizeof(v[0]);
    for (size_t i = 0; i < n && i < cap; ++i) out[i] = v[i];
    return n;
}
size_t emu_layout_rollout_stats(uint32_t* out, size_t cap) {
    uint32_t v[] = {(uint32_t)sizeof(CareRolloutStats), (uint32_t)alignof(CareRolloutStats),
                    EMU_OFF(CareRolloutStats, weight_sum), EMU_OFF(CareRolloutStats, kl_sum),
                    EMU_OFF(CareRolloutStats, k3_sum), EMU_OFF(CareRolloutStats, log_ppl_diff_sum),
                    EMU_OFF(CareRolloutStats, log_ppl_abs_diff_sum),
                    EMU_OFF(CareRolloutStats, chi2_token_sum),
                    EMU_OFF(CareRolloutStats, chi2_seq_sum), EMU_OFF(CareRolloutStats, tokens),
                    EMU_OFF(CareRolloutStats, sequences),
                    EMU_OFF(CareRolloutStats, rejected_tokens),
                    EMU_OFF(CareRolloutStats, rejected_sequences),
                    EMU_OFF(CareRolloutStats, truncated), EMU_OFF(CareRolloutStats, non_finite)};
    size_t n = sizeof(v) / sizeof(v[0]);
    for (size_t i = 0; i < n && i < cap; ++i) out[i] = v[i];
    return n;
}
size_t emu_layout_denoms(uint32_t* out, size_t cap) {
    uint32_t v[] = {(uint32_t)sizeof(CareLossDenoms), (uint32_t)alignof(CareLossDenoms),
                    EMU_OFF(CareLossDenoms, n_tok), EMU_OFF(CareLossDenoms, n_seq),
                    EMU_OFF(CareLossDenoms, horizon), EMU_OFF(CareLossDenoms, pad0)};
    size_t n = sizeof(v) / sizeof(v[0]);
    for (size_t i = 0; i < n && i < cap; ++i) out[i] = v[i];
    return n;
}

size_t emu_layout_batch_std_work(uint32_t* out, size_t cap) {
    uint32_t v[] = {(uint32_t)sizeof(CareBatchStdWork), (uint32_t)alignof(CareBatchStdWork),
                    EMU_OFF(CareBatchStdWork, arrivals), EMU_OFF(CareBatchStdWork, pad0),
                    EMU_OFF(CareBatchStdWork, slots)};
    size_t n = sizeof(v) / sizeof(v[0]);
    for (size_t i = 0; i < n && i < cap; ++i) out[i] = v[i];
    return n;
}

size_t emu_layout_loss_work(uint32_t* out, size_t cap) {
    uint32_t v[] = {(uint32_t)sizeof(CareLossWork), (uint32_t)alignof(CareLossWork),
                    EMU_OFF(CareLossWork, denoms), EMU_OFF(CareLossWork, arrivals),
                    EMU_OFF(CareLossWork, pad0), EMU_OFF(CareLossWork, slots),
                    (uint32_t)sizeof(CareLossSlot)};
    size_t n = sizeof(v) / sizeof(v[0]);
    for (size_t i = 0; i < n && i < cap; ++i) out[i] = v[i];
    return n;
}

size_t emu_layout_cov_work(uint32_t* out, size_t cap) {
    uint32_t v[] = {(uint32_t)sizeof(CareCovWork), (uint32_t)alignof(CareCovWork),
                    EMU_OFF(CareCovWork, part_a), EMU_OFF(CareCovWork, part_l),
                    EMU_OFF(CareCovWork, part_n), EMU_OFF(CareCovWork, hist),
                    EMU_OFF(CareCovWork, cut_key), EMU_OFF(CareCovWork, tie_end),
                    EMU_OFF(CareCovWork, selected), EMU_OFF(CareCovWork, counted),
                    EMU_OFF(CareCovWork, k), EMU_OFF(CareCovWork, candidates),
                    EMU_OFF(CareCovWork, pad0)};
    size_t n = sizeof(v) / sizeof(v[0]);
    for (size_t i = 0; i < n && i < cap; ++i) out[i] = v[i];
    return n;
}

} // extern "C"
