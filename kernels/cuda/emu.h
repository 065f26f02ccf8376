// Host emulation of the CUDA subset kiln's generated kernels use (kernels/cuda/emu.h).
//
// Lets the emitted CUDA C run on a machine without a GPU, compiled as C++20 by the host
// compiler, so tests can check the generated kernels' indexing, tiling, reductions and fused
// epilogues against the reference interpreter. A launch runs the blocks one after another;
// the threads of a block are real threads meeting at std::barrier for __syncthreads, and warp
// shuffles and mma exchange values through per-warp slots between warp barriers. Shared memory
// is `static` storage, which is sound because one block runs at a time.
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#define KILN_EMU 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct kiln_dim3 {
    unsigned x, y, z;
};
static thread_local kiln_dim3 threadIdx, blockIdx;
static kiln_dim3 blockDim, gridDim;

struct KilnEmuState {
    std::unique_ptr<std::barrier<>> block;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    std::vector<float> fslot;     // 32 per warp
    std::vector<unsigned> uslot;  // 32 * 8 per warp (mma fragments)
};
static KilnEmuState* kiln_emu;
static thread_local unsigned kiln_emu_tid;

#define KILN_INF std::numeric_limits<float>::infinity()

inline void __syncthreads() { kiln_emu->block->arrive_and_wait(); }
inline void kiln_emu_warp_sync() { kiln_emu->warps[kiln_emu_tid / 32]->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { kiln_emu_warp_sync(); }
inline float kiln_emu_shfl(float v, unsigned src) {
    float* s = &kiln_emu->fslot[(kiln_emu_tid / 32) * 32];
    s[kiln_emu_tid % 32] = v;
    kiln_emu_warp_sync();
    const float r = s[src & 31u];
    kiln_emu_warp_sync();
    return r;
}
inline float __shfl_xor_sync(unsigned, float v, int m) { return kiln_emu_shfl(v, (kiln_emu_tid % 32) ^ (unsigned)m); }
inline float __shfl_sync(unsigned, float v, int src) { return kiln_emu_shfl(v, (unsigned)src); }

inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}

inline float kiln_f16_to_f32(unsigned short h) {
    _Float16 x;
    std::memcpy(&x, &h, 2);
    return (float)x;
}
inline unsigned short kiln_f32_to_f16(float f) {
    _Float16 x = (_Float16)f;
    unsigned short h;
    std::memcpy(&h, &x, 2);
    return h;
}
inline long long kiln_f32_to_i64(float f) {
    if (std::isnan(f)) return 0;
    if (f >= 9.2233720368547758e18f) return std::numeric_limits<long long>::max();
    if (f <= -9.2233720368547758e18f) return std::numeric_limits<long long>::min();
    return (long long)f;
}
inline int kiln_f32_to_i32(float f) {
    if (std::isnan(f)) return 0;
    if (f >= 2147483648.0f) return std::numeric_limits<int>::max();
    if (f <= -2147483648.0f) return std::numeric_limits<int>::min();
    return (int)f;
}
inline void kiln_ld2(const float* p, float* v) { std::memcpy(v, p, 8); }
inline void kiln_ld4(const float* p, float* v) { std::memcpy(v, p, 16); }
inline unsigned kiln_ld_u32(const unsigned short* p) {
    unsigned u;
    std::memcpy(&u, p, 4);
    return u;
}

// mma.sync m16n8k16 row.col, f32 accumulate, emulated with the PTX ISA fragment layout:
// g = lane/4, t = lane%4; A regs {(g,2t..) (g+8,2t..) (g,2t+8..) (g+8,2t+8..)}, B regs
// {(k=2t..,n=g) (k=2t+8..,n=g)}, C {(g,2t) (g,2t+1) (g+8,2t) (g+8,2t+1)}.
template <float (*CVT)(unsigned short)>
inline void kiln_emu_mma(float* c, const unsigned* a, const unsigned* b) {
    const unsigned lane = kiln_emu_tid % 32;
    unsigned* s = &kiln_emu->uslot[(kiln_emu_tid / 32) * 32 * 8];
    for (int i = 0; i < 4; ++i) s[lane * 8 + i] = a[i];
    for (int i = 0; i < 2; ++i) s[lane * 8 + 4 + i] = b[i];
    kiln_emu_warp_sync();
    float A[16][16], B[16][8];
    for (unsigned l = 0; l < 32; ++l) {
        const unsigned g = l / 4, t = l % 4;
        const unsigned* f = &s[l * 8];
        auto lo = [](unsigned u) { return (unsigned short)(u & 0xffffu); };
        auto hi = [](unsigned u) { return (unsigned short)(u >> 16); };
        A[g][2 * t] = CVT(lo(f[0]));
        A[g][2 * t + 1] = CVT(hi(f[0]));
        A[g + 8][2 * t] = CVT(lo(f[1]));
        A[g + 8][2 * t + 1] = CVT(hi(f[1]));
        A[g][2 * t + 8] = CVT(lo(f[2]));
        A[g][2 * t + 9] = CVT(hi(f[2]));
        A[g + 8][2 * t + 8] = CVT(lo(f[3]));
        A[g + 8][2 * t + 9] = CVT(hi(f[3]));
        B[2 * t][g] = CVT(lo(f[4]));
        B[2 * t + 1][g] = CVT(hi(f[4]));
        B[2 * t + 8][g] = CVT(lo(f[5]));
        B[2 * t + 9][g] = CVT(hi(f[5]));
    }
    kiln_emu_warp_sync();
    const unsigned g = lane / 4, t = lane % 4;
    const unsigned rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int q = 0; q < 4; ++q) {
        float acc = c[q];
        for (int k = 0; k < 16; ++k) acc += A[rows[q]][k] * B[k][cols[q]];
        c[q] = acc;
    }
}
inline float kiln_bf16_to_f32_emu(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
inline void kiln_mma_f16(float* c, const unsigned* a, const unsigned* b) { kiln_emu_mma<kiln_f16_to_f32>(c, a, b); }
inline void kiln_mma_bf16(float* c, const unsigned* a, const unsigned* b) { kiln_emu_mma<kiln_bf16_to_f32_emu>(c, a, b); }

typedef void (*kiln_emu_kernel)(void** args);

// Runs one launch to completion. Returns 0, or -1 for a block size it cannot emulate.
extern "C" int kiln_emu_launch(kiln_emu_kernel f, void** args, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz) {
    const unsigned n = bx * by * bz;
    if (n == 0 || n > 1024 || n % 32 != 0) return -1;
    KilnEmuState st;
    st.block = std::make_unique<std::barrier<>>((std::ptrdiff_t)n);
    for (unsigned w = 0; w < n / 32; ++w) st.warps.push_back(std::make_unique<std::barrier<>>(32));
    st.fslot.assign(n, 0.0f);
    st.uslot.assign(n * 8, 0u);
    kiln_emu = &st;
    blockDim = {bx, by, bz};
    gridDim = {gx, gy, gz};
    std::vector<std::thread> threads;
    threads.reserve(n);
    for (unsigned t = 0; t < n; ++t) {
        threads.emplace_back([=, &st] {
            kiln_emu_tid = t;
            threadIdx = {t % bx, (t / bx) % by, t / (bx * by)};
            for (unsigned z = 0; z < gz; ++z)
                for (unsigned y = 0; y < gy; ++y)
                    for (unsigned x = 0; x < gx; ++x) {
                        blockIdx = {x, y, z};
                        f(args);
                        st.block->arrive_and_wait();
                    }
        });
    }
    for (auto& th : threads) th.join();
    kiln_emu = nullptr;
    return 0;
}
