// Test-only emulation of the parts of the CUDA thread model that the care kernels use, so that the
// very same kernels/cuda/*.cu text compiles as host C++ and runs on a CPU.
//
// Model: blocks run one after another on the calling OS thread, in an order drawn from `seed`
// (a random permutation of the grid); the threads of a block are cooperative fibers (ucontext
// for the first entry, _setjmp/_longjmp afterwards, which avoids the signal-mask syscall of
// swapcontext). A fiber runs until it reaches a block barrier
// (__syncthreads) or a warp collective (__shfl_*_sync, __syncwarp), or returns. The scheduler
// resumes the runnable fibers in an order drawn from `seed` again at every round, and between two
// block barriers it holds a random half of the warps back until the others cannot move, so a
// kernel that reads shared memory written by another warp without a barrier in between sees
// different data under different seeds, and the tests compare seeds bit for bit.
//
// Strictness, to catch divergence bugs the hardware might forgive: a block barrier or a warp
// collective that some thread of the block (of the warp) can never reach, because it already
// returned or waits elsewhere, aborts the launch with an error code instead of hanging.
//
// __shared__ becomes `static thread_local`: one copy per OS thread, shared by the fibers of the
// running block; Rust's test harness runs tests on several OS threads at once, and each launch
// stays on its own thread.
#pragma once
#undef _FORTIFY_SOURCE // __longjmp_chk would reject the jumps between fiber stacks

#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <vector>

struct emu_uint3 {
    unsigned int x, y, z;
};

namespace emu {

enum Wait { RUNNING = 0, AT_BLOCK = 1, AT_WARP = 2, DONE = 3 };

struct Fiber {
    ucontext_t uc;
    jmp_buf jb;
    bool started = false;
    int state = RUNNING;
    emu_uint3 tid{0, 0, 0};
    unsigned linear = 0;
    unsigned collectives = 0; // warp collectives passed: selects the slot buffer (double buffering)
    char* stack = nullptr;
};

struct Block {
    std::vector<Fiber> fibers;
    std::vector<unsigned> order;
    emu_uint3 block_idx{0, 0, 0}, block_dim{1, 1, 1}, grid_dim{1, 1, 1};
    jmp_buf sched;
    Fiber* cur = nullptr;
    const std::function<void()>* body = nullptr;
    // Warp shuffle slots: [parity][warp][lane], 8 bytes each (enough for double).
    std::vector<uint64_t> slots;
    uint64_t rng = 1;
    int error = 0;
};

inline Block*& tl_block() {
    static thread_local Block* b = nullptr;
    return b;
}

inline uint64_t next_rand(Block* b) {
    // xorshift64*: deterministic per seed
    uint64_t x = b->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    b->rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

inline void yield_to_scheduler() {
    Block* b = tl_block();
    Fiber* f = b->cur;
    if (!_setjmp(f->jb)) {
        _longjmp(b->sched, 1);
    }
}

// A fiber is started once per launch (makecontext/swapcontext cost syscalls) and then runs the
// kernel body once per block: after the body returns it parks as DONE, and the scheduler resumes
// it at the top of the loop for the next block.
inline void fiber_entry() {
    for (;;) {
        Block* b = tl_block();
        (*b->body)();
        b->cur->state = DONE;
        yield_to_scheduler();
    }
}

inline unsigned lane_id() { return tl_block()->cur->linear & 31u; }
inline unsigned warp_id() { return tl_block()->cur->linear >> 5; }

inline void syncthreads() {
    tl_block()->cur->state = AT_BLOCK;
    yield_to_scheduler();
}

template <typename T>
inline T shfl(T v, int src_lane_or_xor, bool is_xor) {
    static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
    Block* b = tl_block();
    Fiber* f = b->cur;
    unsigned nwarps = ((unsigned)b->fibers.size() + 31u) / 32u;
    unsigned parity = f->collectives & 1u;
    f->collectives += 1;
    unsigned lane = lane_id(), warp = warp_id();
    uint64_t* base = &b->slots[(size_t)parity * nwarps * 32u + (size_t)warp * 32u];
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    base[lane] = bits;
    f->state = AT_WARP;
    yield_to_scheduler();
    unsigned src = is_xor ? (lane ^ (unsigned)src_lane_or_xor) : (unsigned)src_lane_or_xor & 31u;
    unsigned warp_size = (unsigned)b->fibers.size() - warp * 32u;
    warp_size = warp_size < 32u ? warp_size : 32u;
    if (src >= warp_size) {
        return v; // like the hardware: an out-of-range source lane returns the caller's value
    }
    T out;
    memcpy(&out, &base[src], sizeof(T));
    return out;
}

inline void syncwarp() {
    Block* b = tl_block();
    b->cur->collectives += 1;
    b->cur->state = AT_WARP;
    yield_to_scheduler();
}

// Runs `body` for every thread of every block. Returns 0, or a nonzero code on a barrier that can
// never complete (1: block barrier, 2: warp collective) or a bad geometry (3).
inline int launch(emu_uint3 grid, emu_uint3 block, uint64_t seed, const std::function<void()>& body) {
    size_t nthreads = (size_t)block.x * block.y * block.z;
    if (nthreads == 0 || nthreads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
        return 3;
    }
    const size_t stack_size = 256 * 1024;
    // On the heap and reached through a pointer only: the fibers mutate it between the
    // scheduler's _setjmp and the _longjmp back, so no field may live in a saved register.
    Block* bp = new Block();
    Block& b = *bp;
    b.fibers.resize(nthreads);
    b.order.resize(nthreads);
    b.block_dim = block;
    b.grid_dim = grid;
    b.body = &body;
    b.rng = seed * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL;
    if (b.rng == 0) {
        b.rng = 1;
    }
    size_t nwarps = (nthreads + 31) / 32;
    b.slots.assign(2 * nwarps * 32, 0);
    for (auto& f : b.fibers) {
        f.started = false;
        f.stack = (char*)malloc(stack_size);
        if (f.stack == nullptr) {
            abort();
        }
    }
    Block* saved = tl_block();
    tl_block() = &b;
    int err = 0;
    // Blocks run one at a time, in an order drawn from the seed (a random permutation of the
    // grid): on the hardware any block may finish first, so a result that depends on the order
    // in which blocks reach global memory (float atomics on one address, a last-block merge
    // that reads in arrival order) differs between seeds, and the tests compare seeds bit for
    // bit.
    const size_t nblocks = (size_t)grid.x * grid.y * grid.z;
    std::vector<size_t> block_order;
    if (nblocks <= ((size_t)1 << 24)) {
        block_order.resize(nblocks);
        for (size_t i = 0; i < nblocks; ++i) block_order[i] = i;
        for (size_t i = nblocks; i > 1; --i) {
            size_t j = (size_t)(next_rand(&b) % i);
            size_t t = block_order[i - 1];
            block_order[i - 1] = block_order[j];
            block_order[j] = t;
        }
    }
    for (size_t bi = 0; bi < nblocks && !err; ++bi) {
                // Grids too large to permute (never in the tests) run in index order.
                size_t lin = block_order.empty() ? bi : block_order[bi];
                unsigned bx = (unsigned)(lin % grid.x);
                unsigned by = (unsigned)((lin / grid.x) % grid.y);
                unsigned bz = (unsigned)(lin / ((size_t)grid.x * grid.y));
                b.block_idx = {bx, by, bz};
                for (size_t i = 0; i < nthreads; ++i) {
                    Fiber& f = b.fibers[i];
                    f.state = RUNNING;
                    f.collectives = 0;
                    f.linear = (unsigned)i;
                    f.tid = {(unsigned)(i % block.x), (unsigned)((i / block.x) % block.y),
                             (unsigned)(i / ((size_t)block.x * block.y))};
                    b.order[i] = (unsigned)i;
                }
                // volatile: these live across the _setjmp/_longjmp round trips of the fibers
                // (GCC's -Wclobbered; their values never change in between, so it is only the
                // compiler's caution).
                volatile size_t live = nthreads;
                volatile uint64_t held = next_rand(&b);
                while (live > 0) {
                    // A fresh random order of the runnable fibers at every phase.
                    for (size_t i = nthreads; i > 1; --i) {
                        size_t j = (size_t)(next_rand(&b) % i);
                        unsigned t = b.order[i - 1];
                        b.order[i - 1] = b.order[j];
                        b.order[j] = t;
                    }
                    // Between two block barriers a random half of the warps is held back
                    // until the others cannot move (all at the barrier, or done): the early
                    // warps race through the whole phase before the late ones start it, as
                    // warps drift apart on the hardware, so a missing __syncthreads shows up as
                    // a seed-dependent result.
                    bool any_free = false;
                    for (size_t k = 0; k < nthreads; ++k) {
                        const Fiber& f = b.fibers[k];
                        if (f.state == RUNNING && !((held >> ((k >> 5) & 63)) & 1u)) {
                            any_free = true;
                            break;
                        }
                    }
                    if (!any_free) {
                        held = 0; // the late warps' turn
                    }
                    volatile bool progress = false;
                    for (volatile size_t k = 0; k < nthreads; ++k) {
                        Fiber& f = b.fibers[b.order[k]];
                        if (f.state != RUNNING || ((held >> ((f.linear >> 5) & 63)) & 1u)) {
                            continue;
                        }
                        progress = true;
                        b.cur = &f;
                        if (!_setjmp(b.sched)) {
                            if (!f.started) {
                                f.started = true;
                                getcontext(&f.uc);
                                f.uc.uc_stack.ss_sp = f.stack;
                                f.uc.uc_stack.ss_size = stack_size;
                                f.uc.uc_link = nullptr;
                                makecontext(&f.uc, (void (*)())fiber_entry, 0);
                                ucontext_t here;
                                swapcontext(&here, &f.uc);
                            } else {
                                _longjmp(f.jb, 1);
                            }
                        }
                        if (f.state == DONE) {
                            live = live - 1;
                        }
                    }
                    if (live == 0) {
                        break;
                    }
                    // Release barriers whose participants have all arrived.
                    bool released = false;
                    size_t at_block = 0, done = 0;
                    for (auto& f : b.fibers) {
                        at_block += f.state == AT_BLOCK;
                        done += f.state == DONE;
                    }
                    if (at_block > 0 && at_block == nthreads) {
                        for (auto& f : b.fibers) f.state = RUNNING;
                        released = true;
                        held = next_rand(&b);
                    } else if (at_block > 0 && at_block + done == nthreads) {
                        err = 1; // some threads returned before a __syncthreads the others wait at
                        break;
                    }
                    for (size_t w = 0; w < nwarps; ++w) {
                        size_t lo = w * 32, hi = lo + 32 < nthreads ? lo + 32 : nthreads;
                        size_t at_warp = 0, wdone = 0;
                        for (size_t i = lo; i < hi; ++i) {
                            at_warp += b.fibers[i].state == AT_WARP;
                            wdone += b.fibers[i].state == DONE;
                        }
                        if (at_warp > 0 && at_warp == hi - lo) {
                            for (size_t i = lo; i < hi; ++i) b.fibers[i].state = RUNNING;
                            released = true;
                        } else if (at_warp > 0 && wdone > 0) {
                            err = 2; // a collective some lanes of the warp can never reach
                        }
                    }
                    if (err) {
                        break;
                    }
                    if (!progress && !released) {
                        err = 2; // lanes of a warp wait at different barriers: divergence
                        break;
                    }
                }
            }
    tl_block() = saved;
    for (auto& f : b.fibers) free(f.stack);
    delete bp;
    return err;
}

} // namespace emu

// ---- the CUDA surface used by the kernels ---------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local

#define threadIdx (::emu::tl_block()->cur->tid)
#define blockIdx (::emu::tl_block()->block_idx)
#define blockDim (::emu::tl_block()->block_dim)
#define gridDim (::emu::tl_block()->grid_dim)

inline void __syncthreads() { emu::syncthreads(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::syncwarp(); }
inline void __threadfence() {}

template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask, int = 32) {
    return emu::shfl(v, lane_mask, true);
}
template <typename T>
inline T __shfl_sync(unsigned, T v, int src, int = 32) {
    return emu::shfl(v, src, false);
}

inline float __uint_as_float(unsigned int u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    memcpy(&u, &f, 4);
    return u;
}
inline long long __double_as_longlong(double d) {
    long long u;
    memcpy(&u, &d, 8);
    return u;
}
inline double __longlong_as_double(long long u) {
    double d;
    memcpy(&d, &u, 8);
    return d;
}

// Rounded double arithmetic: the host build has contraction off (build.rs), so plain operators
// round each operation as the device intrinsics do.
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }

// Atomics: fibers never interleave inside one, so plain read-modify-write is atomic here.
template <typename T>
inline T atomicAdd(T* a, T v) {
    T old = *a;
    *a = old + v;
    return old;
}
inline unsigned atomicMin(unsigned* a, unsigned v) {
    unsigned old = *a;
    *a = v < old ? v : old;
    return old;
}
inline unsigned atomicMax(unsigned* a, unsigned v) {
    unsigned old = *a;
    *a = v > old ? v : old;
    return old;
}
inline unsigned atomicOr(unsigned* a, unsigned v) {
    unsigned old = *a;
    *a = old | v;
    return old;
}
