// Fused attention, one problem per blockIdx.y: out = softmax(scale * Q Kt + mask) V without
// materializing the scores. A block of 4 warps owns 16 query rows (4 per warp); keys and values
// stream through shared memory 32 at a time (one key per lane) with an online softmax (running
// max m, running sum l, rescaled accumulators), so any sequence length runs in fixed memory.
extern "C" __global__ void __launch_bounds__(128) {{NAME}}({{PARAMS}}) {
    __shared__ float Qs[16][{{D}}];
    __shared__ float Ks[32][{{D}} + 1];
    __shared__ float Vs[32][{{DV}} + 1];
    const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned q0 = blockIdx.x * 16u;
{{BATCH}}
    for (unsigned e = tid; e < 16u * {{D}}u; e += 128u) {
        const unsigned r = e / {{D}}u, d = e % {{D}}u;
        const unsigned qi = q0 + r;
        Qs[r][d] = qi < {{SQ}}u ? {{Q_LOAD}} : 0.0f;
    }
    float m_i[4], l_i[4], o[4][{{DV_LANE}}];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        m_i[r] = -KILN_INF;
        l_i[r] = 0.0f;
#pragma unroll
        for (int dd = 0; dd < {{DV_LANE}}; ++dd) o[r][dd] = 0.0f;
    }
    for (unsigned kt = 0; kt < {{SKV}}u; kt += 32u) {
        __syncthreads();
        for (unsigned e = tid; e < 32u * {{D}}u; e += 128u) {
            const unsigned j = e / {{D}}u, d = e % {{D}}u;
            const unsigned kj = kt + j;
            Ks[j][d] = kj < {{SKV}}u ? {{K_LOAD}} : 0.0f;
        }
        for (unsigned e = tid; e < 32u * {{DV}}u; e += 128u) {
            const unsigned j = e / {{DV}}u, d = e % {{DV}}u;
            const unsigned kj = kt + j;
            Vs[j][d] = kj < {{SKV}}u ? {{V_LOAD}} : 0.0f;
        }
        __syncthreads();
        const unsigned kj = kt + lane;
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const unsigned qr = warp * 4u + (unsigned)r;
            const unsigned qi = q0 + qr;
            float s = 0.0f;
#pragma unroll 8
            for (unsigned d = 0; d < {{D}}u; ++d) s = fmaf(Qs[qr][d], Ks[lane][d], s);
            s *= {{SCALE}};
            if (kj < {{SKV}}u) {
                if (qi < {{SQ}}u) {
{{MASK}}
                }
            } else {
                s = -KILN_INF;
            }
            const float m_new = kiln_max(m_i[r], kiln_warp_max(s));
            const float base = m_new == -KILN_INF ? 0.0f : m_new;
            const float p = expf(s - base);
            const float corr = expf(m_i[r] - base);
            l_i[r] = l_i[r] * corr + kiln_warp_sum(p);
            m_i[r] = m_new;
#pragma unroll
            for (int dd = 0; dd < {{DV_LANE}}; ++dd) o[r][dd] *= corr;
            for (unsigned j = 0; j < 32u; ++j) {
                const float pj = __shfl_sync(0xffffffffu, p, (int)j);
#pragma unroll
                for (int dd = 0; dd < {{DV_LANE}}; ++dd) {
                    const unsigned d = lane + 32u * (unsigned)dd;
                    if (d < {{DV}}u) o[r][dd] = fmaf(pj, Vs[j][d], o[r][dd]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const unsigned qi = q0 + warp * 4u + (unsigned)r;
        if (qi >= {{SQ}}u) continue;
{{NAN_ROWS}}        const float inv = 1.0f / l_i[r];
#pragma unroll
        for (int dd = 0; dd < {{DV_LANE}}; ++dd) {
            const unsigned d = lane + 32u * (unsigned)dd;
            if (d < {{DV}}u) {
                const float v = o[r][dd] * inv;
{{STORE}}
            }
        }
    }
}
