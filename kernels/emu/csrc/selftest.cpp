// Deliberately broken kernels, to show that the emulator catches what it claims to catch: a
// shared-memory race (missing __syncthreads), a barrier not all threads reach, and a warp shuffle
// with exited lanes. Test-only; never compiled for the GPU.
#include "cuda_emu.h"

namespace {

// Thread 0 publishes a per-block value; every thread reads it. Without the barrier, threads the
// scheduler runs before thread 0 read the previous block's value.
template <bool SYNC>
void publish(unsigned* out) {
    __shared__ unsigned value;
    if (threadIdx.x == 0) {
        value = blockIdx.x + 1;
    }
    if (SYNC) {
        __syncthreads();
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = value;
}

void divergent_barrier() {
    if (threadIdx.x < 16) {
        __syncthreads();
    }
}

void shuffle_after_exit(float* out) {
    if (threadIdx.x == 3) {
        return;
    }
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

// Thread 0 of each block records the block's index at the next free position: the order in which
// blocks ran.
void block_order(unsigned* counter, unsigned* out) {
    if (threadIdx.x == 0) {
        out[atomicAdd(counter, 1u)] = blockIdx.x;
    }
}

} // namespace

extern "C" {

int emu_selftest_block_order(unsigned blocks, unsigned* out, uint64_t seed) {
    unsigned counter = 0;
    return emu::launch({blocks, 1, 1}, {32, 1, 1}, seed, [&] { block_order(&counter, out); });
}

int emu_selftest_publish(unsigned blocks, unsigned threads, int sync, unsigned* out, uint64_t seed) {
    emu_uint3 g{blocks, 1, 1}, b{threads, 1, 1};
    if (sync) {
        return emu::launch(g, b, seed, [&] { publish<true>(out); });
    }
    return emu::launch(g, b, seed, [&] { publish<false>(out); });
}

int emu_selftest_divergent_barrier(uint64_t seed) {
    return emu::launch({1, 1, 1}, {64, 1, 1}, seed, [&] { divergent_barrier(); });
}

int emu_selftest_shuffle_after_exit(float* out, uint64_t seed) {
    return emu::launch({1, 1, 1}, {32, 1, 1}, seed, [&] { shuffle_after_exit(out); });
}

} // extern "C"
