// Fused attention, one problem per blockIdx.y: out = softmax(scale * Q Kt + mask) V without
// materializing the scores. A block of 4 warps owns 16 query rows (4 per warp); keys and values
// stream through shared memory 32 at a time (one key per lane) with an online softmax (running
// max m, running sum l, rescaled accumulators), so any sequence length runs in fixed memory.
// Each lane holds its key in registers where it fits (64 floats or fewer) and reads query rows as
// 4-wide broadcasts; a row's 32 probabilities go through shared memory (Ps), read 4 at a time
// for P.V (a shuffle per key before: the shuffle unit, not the FMAs, set the pace).
extern "C" __global__ void __launch_bounds__(128) {{NAME}}({{PARAMS}}) {
    __shared__ __align__(16) float Qs[16][{{DQ}}];
    __shared__ float Ks[32][{{D}} + 1];
    __shared__ float Vs[32][{{DV}} + 1];
    __shared__ __align__(16) float Ps[4][32];
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
#if {{D}} <= 64
        float kr[{{D}}];
#pragma unroll
        for (int d = 0; d < {{D}}; ++d) kr[d] = Ks[lane][d];
#define KILN_KEY(d) kr[d]
#else
#define KILN_KEY(d) Ks[lane][d]
#endif
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const unsigned qr = warp * 4u + (unsigned)r;
            const unsigned qi = q0 + qr;
            float s = 0.0f;
#pragma unroll
            for (int d = 0; d + 4 <= {{D}}; d += 4) {
                float q[4];
                kiln_ld4(&Qs[qr][d], q);
                s = fmaf(q[0], KILN_KEY(d), s);
                s = fmaf(q[1], KILN_KEY(d + 1), s);
                s = fmaf(q[2], KILN_KEY(d + 2), s);
                s = fmaf(q[3], KILN_KEY(d + 3), s);
            }
#pragma unroll
            for (int d = {{D}} / 4 * 4; d < {{D}}; ++d) s = fmaf(Qs[qr][d], KILN_KEY(d), s);
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
            Ps[warp][lane] = p;
            __syncwarp();
#pragma unroll 2
            for (unsigned j = 0; j < 32u; j += 4u) {
                float pj[4];
                kiln_ld4(&Ps[warp][j], pj);
#pragma unroll
                for (int t = 0; t < 4; ++t)
#pragma unroll
                    for (int dd = 0; dd < {{DV_LANE}}; ++dd) {
                        const unsigned d = lane + 32u * (unsigned)dd;
                        if (d < {{DV}}u) o[r][dd] = fmaf(pj[t], Vs[j + (unsigned)t][d], o[r][dd]);
                    }
            }
            __syncwarp();
        }
#undef KILN_KEY
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
