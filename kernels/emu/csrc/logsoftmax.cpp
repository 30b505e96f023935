// Host build of the fused selective log-softmax (kernels/cuda/logsoftmax.cu) against the fiber
// emulator: one C entry point per kernel and the parameter struct's layout for the Rust tests.
#include "cuda_emu.h"

#include "../../cuda/logsoftmax.cu"

#include <stddef.h>

extern "C" {

#define EMU_LSM_ENTRY(KERNEL)                                                                  \
    int emu_launch_##KERNEL(emu_uint3 grid, emu_uint3 block, const CareLsmParams* p,          \
                            uint64_t seed) {                                                   \
        CareLsmParams copy = *p; /* by value, as a kernel parameter */                         \
        return emu::launch(grid, block, seed, [&] { KERNEL(copy); });                          \
    }

EMU_LSM_ENTRY(logsoftmax_fwd_f32)
EMU_LSM_ENTRY(logsoftmax_fwd_bf16)
EMU_LSM_ENTRY(logsoftmax_fwd_f16)
EMU_LSM_ENTRY(logsoftmax_bwd_f32)
EMU_LSM_ENTRY(logsoftmax_bwd_bf16)
EMU_LSM_ENTRY(logsoftmax_bwd_f16)

// (size, align, offsets of every field in declaration order).
size_t emu_layout_lsm(uint32_t* out, size_t cap) {
#define EMU_LSM_OFF(F) (uint32_t) offsetof(CareLsmParams, F)
    uint32_t v[] = {(uint32_t)sizeof(CareLsmParams), (uint32_t)alignof(CareLsmParams),
                    EMU_LSM_OFF(logits),   EMU_LSM_OFF(targets),     EMU_LSM_OFF(mask),
                    EMU_LSM_OFF(logp),     EMU_LSM_OFF(entropy),     EMU_LSM_OFF(lse),
                    EMU_LSM_OFF(dlogp),    EMU_LSM_OFF(dentropy),    EMU_LSM_OFF(dlogits),
                    EMU_LSM_OFF(status),   EMU_LSM_OFF(n),           EMU_LSM_OFF(stride),
                    EMU_LSM_OFF(dstride),  EMU_LSM_OFF(vocab),       EMU_LSM_OFF(targets_i64),
                    EMU_LSM_OFF(block_team), EMU_LSM_OFF(inv_temp)};
#undef EMU_LSM_OFF
    size_t n = sizeof(v) / sizeof(v[0]);
    for (size_t i = 0; i < n && i < cap; ++i) out[i] = v[i];
    return n;
}

} // extern "C"
