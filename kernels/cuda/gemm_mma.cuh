// Batched GEMM on tensor cores ({{DT}} inputs, f32 accumulate): mma.sync m16n8k16.
// Block tile 64x64, 4 warps in 2x2, each warp a 32x32 tile = 2x4 mma tiles; 32-deep slices of
// A (as [m][k]) and B (as [n][k]) staged in shared memory with 8 halves of padding per row,
// which makes the fragment loads bank-conflict free. blockIdx.z walks the batch.
extern "C" __global__ void __launch_bounds__(128) {{NAME}}({{PARAMS}}) {
    __shared__ __align__(16) unsigned short As[64][40];
    __shared__ __align__(16) unsigned short Bs[64][40];
    const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned wm = (warp >> 1) * 32u, wn = (warp & 1u) * 32u;
    const unsigned g = lane >> 2, t4 = lane & 3u;
    const unsigned m0 = blockIdx.y * 64u, n0 = blockIdx.x * 64u;
{{BATCH}}
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
    for (unsigned k0 = 0; k0 < {{K}}u; k0 += 32u) {
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            const unsigned e = tid + (unsigned)r * 128u;
            const unsigned mm = {{A_MM}}, kk = {{A_KK}};
            const unsigned gm = m0 + mm, gk = k0 + kk;
            As[mm][kk] = (gm < {{M}}u && gk < {{K}}u) ? {{A_LOAD}} : (unsigned short)0;
        }
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            const unsigned e = tid + (unsigned)r * 128u;
            const unsigned kk = {{B_KK}}, nn = {{B_NN}};
            const unsigned gk = k0 + kk, gn = n0 + nn;
            Bs[nn][kk] = (gk < {{K}}u && gn < {{N}}u) ? {{B_LOAD}} : (unsigned short)0;
        }
        __syncthreads();
#pragma unroll
        for (unsigned ks = 0; ks < 32u; ks += 16u) {
            unsigned a[2][4], b[4][2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const unsigned r0 = wm + (unsigned)i * 16u + g;
                a[i][0] = kiln_ld_u32(&As[r0][ks + 2u * t4]);
                a[i][1] = kiln_ld_u32(&As[r0 + 8u][ks + 2u * t4]);
                a[i][2] = kiln_ld_u32(&As[r0][ks + 2u * t4 + 8u]);
                a[i][3] = kiln_ld_u32(&As[r0 + 8u][ks + 2u * t4 + 8u]);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const unsigned nr = wn + (unsigned)j * 8u + g;
                b[j][0] = kiln_ld_u32(&Bs[nr][ks + 2u * t4]);
                b[j][1] = kiln_ld_u32(&Bs[nr][ks + 2u * t4 + 8u]);
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) kiln_mma_{{DT}}(acc[i][j], a[i], b[j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const unsigned gi = m0 + wm + (unsigned)i * 16u + g + (q >= 2 ? 8u : 0u);
                const unsigned gj = n0 + wn + (unsigned)j * 8u + 2u * t4 + (unsigned)(q & 1);
                if (gi < {{M}}u && gj < {{N}}u) {
                    const float kiln_acc = {{ALPHA}} * acc[i][j][q];
{{EPILOGUE}}
                }
            }
}
