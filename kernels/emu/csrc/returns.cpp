// Host build of the token-level estimators (kernels/cuda/returns.cu) against the fiber emulator:
// one C entry point per kernel and the struct layouts for the Rust tests.
#include "cuda_emu.h"

#include "../../cuda/returns.cu"

#include <stddef.h>

extern "C" {

#define EMU_RET_ENTRY(KERNEL, PARAMS)                                                          \
    int emu_launch_##KERNEL(emu_uint3 grid, emu_uint3 block, const PARAMS* p, uint64_t seed) { \
        PARAMS copy = *p; /* by value, as a kernel parameter */                                \
        return emu::launch(grid, block, seed, [&] { KERNEL(copy); });                          \
    }

EMU_RET_ENTRY(discounted_returns_f32, CareReturnsParams)
EMU_RET_ENTRY(gae_f32, CareReturnsParams)
EMU_RET_ENTRY(whiten_stats_f32, CareWhitenParams)
EMU_RET_ENTRY(whiten_apply_f32, CareWhitenParams)
EMU_RET_ENTRY(whiten_stats_f64, CareWhitenParams)
EMU_RET_ENTRY(whiten_apply_f64, CareWhitenParams)

// (size, align, offsets of every field in declaration order).
#define EMU_RET_LAYOUT(NAME, S, ...)                                                            \
    size_t emu_layout_##NAME(uint32_t* out, size_t cap) {                                      \
        uint32_t v[] = {(uint32_t)sizeof(S), (uint32_t)alignof(S), __VA_ARGS__};               \
        size_t n = sizeof(v) / sizeof(v[0]);                                                   \
        for (size_t i = 0; i < n && i < cap; ++i) out[i] = v[i];                               \
        return n;                                                                              \
    }
#define EMU_O(S, F) (uint32_t) offsetof(S, F)

EMU_RET_LAYOUT(returns, CareReturnsParams, EMU_O(CareReturnsParams, rewards),
               EMU_O(CareReturnsParams, values), EMU_O(CareReturnsParams, seq_offsets),
               EMU_O(CareReturnsParams, mask), EMU_O(CareReturnsParams, adv),
               EMU_O(CareReturnsParams, ret), EMU_O(CareReturnsParams, status),
               EMU_O(CareReturnsParams, n_seq), EMU_O(CareReturnsParams, n_tok),
               EMU_O(CareReturnsParams, gamma), EMU_O(CareReturnsParams, lambda),
               EMU_O(CareReturnsParams, masked_reset), EMU_O(CareReturnsParams, pad0),
               EMU_O(CareReturnsParams, wide))
EMU_RET_LAYOUT(whiten, CareWhitenParams, EMU_O(CareWhitenParams, x), EMU_O(CareWhitenParams, mask),
               EMU_O(CareWhitenParams, stats), EMU_O(CareWhitenParams, n),
               EMU_O(CareWhitenParams, eps), EMU_O(CareWhitenParams, unbiased),
               EMU_O(CareWhitenParams, pad0), EMU_O(CareWhitenParams, count_eps),
               EMU_O(CareWhitenParams, wide))
EMU_RET_LAYOUT(whiten_work, CareWhitenWork, EMU_O(CareWhitenWork, stats),
               EMU_O(CareWhitenWork, arrivals), EMU_O(CareWhitenWork, pad0),
               EMU_O(CareWhitenWork, slots), (uint32_t)sizeof(CareMoments))
EMU_RET_LAYOUT(whiten_stats, CareWhitenStats, EMU_O(CareWhitenStats, status),
               EMU_O(CareWhitenStats, pad0), EMU_O(CareWhitenStats, count),
               EMU_O(CareWhitenStats, mean), EMU_O(CareWhitenStats, m2),
               EMU_O(CareWhitenStats, scale), EMU_O(CareWhitenStats, std))

} // extern "C"
