// Batched GEMM, f32 SIMT: out[b,i,j] = epilogue(alpha * sum_p A[b,i,p] * B[b,p,j]).
// A {{BM}}x{{BN}} output tile per block, {{BK}}-deep slices of A and B staged in shared memory
// (A transposed to [k][m]), a {{TM}}x{{TN}} register tile per thread (row r: {{ROW}},
// column c: {{COL}}) fed by vector shared-memory loads: {{TM}}+{{TN}} floats in {{LDS}} loads per
// {{TM}}x{{TN}} FMAs. blockIdx.z walks the batch. With PREFETCH ({{PREFETCH}}), the global
// loads of slice k+1 are issued into registers before slice k's FMAs, so their latency hides
// behind this block's own arithmetic (one shared buffer: stored after the trailing sync).
extern "C" __global__ void __launch_bounds__({{THREADS}}) {{NAME}}({{PARAMS}}) {
    __shared__ __align__(16) float As[{{BK}}][{{BM}} + 4];
    __shared__ __align__(16) float Bs[{{BK}}][{{BN}} + 4];
    const unsigned tid = threadIdx.x;
    const unsigned tx = tid % {{TX}}u, ty = tid / {{TX}}u;
    const unsigned m0 = blockIdx.y * {{BM}}u, n0 = blockIdx.x * {{BN}}u;
{{BATCH}}
    float acc[{{TM}}][{{TN}}];
#pragma unroll
    for (int r = 0; r < {{TM}}; ++r)
#pragma unroll
        for (int c = 0; c < {{TN}}; ++c) acc[r][c] = 0.0f;
    float ra[{{A_PER}}], rb[{{B_PER}}];
    auto fetch = [&](unsigned k0) {
#pragma unroll
        for (int r = 0; r < {{A_PER}}; ++r) {
            const unsigned e = tid + (unsigned)r * {{THREADS}}u;
            const unsigned mm = {{A_MM}}, kk = {{A_KK}};
            const unsigned gm = m0 + mm, gk = k0 + kk;
            ra[r] = (gm < {{M}}u && gk < {{K}}u) ? {{A_LOAD}} : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < {{B_PER}}; ++r) {
            const unsigned e = tid + (unsigned)r * {{THREADS}}u;
            const unsigned kk = {{B_KK}}, nn = {{B_NN}};
            const unsigned gk = k0 + kk, gn = n0 + nn;
            rb[r] = (gk < {{K}}u && gn < {{N}}u) ? {{B_LOAD}} : 0.0f;
        }
    };
    auto stage = [&]() {
#pragma unroll
        for (int r = 0; r < {{A_PER}}; ++r) {
            const unsigned e = tid + (unsigned)r * {{THREADS}}u;
            As[{{A_KK}}][{{A_MM}}] = ra[r];
        }
#pragma unroll
        for (int r = 0; r < {{B_PER}}; ++r) {
            const unsigned e = tid + (unsigned)r * {{THREADS}}u;
            Bs[{{B_KK}}][{{B_NN}}] = rb[r];
        }
    };
    if ({{PREFETCH}}) fetch(0u);
    for (unsigned k0 = 0; k0 < {{K}}u; k0 += {{BK}}u) {
        if (!{{PREFETCH}}) fetch(k0);
        stage();
        __syncthreads();
        if ({{PREFETCH}} && k0 + {{BK}}u < {{K}}u) fetch(k0 + {{BK}}u);
#pragma unroll
        for (int kk = 0; kk < {{BK}}; ++kk) {
            float a[{{TM}}], b[{{TN}}];
{{FRAGS}}
#pragma unroll
            for (int r = 0; r < {{TM}}; ++r)
#pragma unroll
                for (int c = 0; c < {{TN}}; ++c) acc[r][c] = fmaf(a[r], b[c], acc[r][c]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < {{TM}}; ++r) {
        const unsigned gi = m0 + {{ROW}};
#pragma unroll
        for (int c = 0; c < {{TN}}; ++c) {
            const unsigned gj = n0 + {{COL}};
            if (gi < {{M}}u && gj < {{N}}u) {
                const float kiln_acc = {{ALPHA}} * acc[r][c];
{{EPILOGUE}}
            }
        }
    }
}
