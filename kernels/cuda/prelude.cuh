// kiln CUDA prelude: element types and helpers every generated kernel uses.
// NVRTC ships no headers, so this file includes none: 16-bit floats are raw storage converted
// with PTX instructions, and the host emulator (emu.h, KILN_EMU) supplies C++ equivalents of
// every inline-assembly helper.
typedef unsigned short kiln_f16;  // IEEE binary16 bits
typedef unsigned short kiln_bf16; // bfloat16 bits

#ifndef KILN_EMU
#define KILN_INF __int_as_float(0x7f800000)
__device__ __forceinline__ float kiln_f16_to_f32(kiln_f16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ kiln_f16 kiln_f32_to_f16(float f) {
    kiln_f16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
// Float to integer like Rust's `as`: truncation toward zero, saturating, NaN to 0 (PTX cvt.rzi).
__device__ __forceinline__ long long kiln_f32_to_i64(float f) {
    long long r;
    asm("cvt.rzi.s64.f32 %0, %1;" : "=l"(r) : "f"(f));
    return r;
}
__device__ __forceinline__ int kiln_f32_to_i32(float f) {
    int r;
    asm("cvt.rzi.s32.f32 %0, %1;" : "=r"(r) : "f"(f));
    return r;
}
__device__ __forceinline__ unsigned kiln_ld_u32(const unsigned short* p) {
    return *reinterpret_cast<const unsigned*>(p);
}
// Vector loads of 2 / 4 consecutive floats (8- / 16-byte aligned) from shared memory.
__device__ __forceinline__ void kiln_ld2(const float* p, float* v) {
    const float2 t = *reinterpret_cast<const float2*>(p);
    v[0] = t.x; v[1] = t.y;
}
__device__ __forceinline__ void kiln_ld4(const float* p, float* v) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
}
// D = A·B + D on tensor cores: m16n8k16, A row-major f16/bf16 pairs, B column-major, f32 accumulate.
__device__ __forceinline__ void kiln_mma_f16(float* c, const unsigned* a, const unsigned* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void kiln_mma_bf16(float* c, const unsigned* a, const unsigned* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

__device__ __forceinline__ float kiln_bf16_to_f32(kiln_bf16 h) {
    return __uint_as_float(((unsigned)h) << 16);
}
// Round to nearest even; NaN stays a (quiet) NaN.
__device__ __forceinline__ kiln_bf16 kiln_f32_to_bf16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (kiln_bf16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (kiln_bf16)(u >> 16);
}

// The NaN contract's max/min (see kiln_compiler::ops): NaN if either operand is NaN, -0 < +0.
// CUDA's fmaxf/fminf return the other operand for a NaN, which would hide it.
__device__ __forceinline__ float kiln_max(float a, float b) {
    if (a != a || b != b) return a + b;
    if (a == b) return __uint_as_float(__float_as_uint(a) & __float_as_uint(b));
    return a > b ? a : b;
}
__device__ __forceinline__ float kiln_min(float a, float b) {
    if (a != a || b != b) return a + b;
    if (a == b) return __uint_as_float(__float_as_uint(a) | __float_as_uint(b));
    return a < b ? a : b;
}

// Reductions across the 32 lanes of a warp; every lane gets the result.
__device__ __forceinline__ float kiln_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float kiln_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = kiln_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Reductions across a whole block (blockDim.x a multiple of 32, at most 1024); `red` is a
// __shared__ float[32]. Every thread gets the result; every thread of the block must call.
__device__ __forceinline__ float kiln_block_sum(float v, float* red) {
    v = kiln_warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31u) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31u) < (blockDim.x >> 5) ? red[threadIdx.x & 31u] : 0.0f;
    return kiln_warp_sum(v);
}
__device__ __forceinline__ float kiln_block_max(float v, float* red) {
    v = kiln_warp_max(v);
    __syncthreads();
    if ((threadIdx.x & 31u) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31u) < (blockDim.x >> 5) ? red[threadIdx.x & 31u] : -KILN_INF;
    return kiln_warp_max(v);
}
