// Row kernels (LayerNorm / RmsNorm / softmax over the last dim). {{GROUP}} threads share a row
// (a warp, or the whole block for long rows); each holds {{PER}} values of it in registers, so
// the row is read once and the statistics are exact two-pass ones.
extern "C" __global__ void __launch_bounds__({{THREADS}}) {{NAME}}({{PARAMS}}) {
    __shared__ float kiln_red[32];
    const unsigned row = {{ROW}};
    const unsigned t = {{LANE}};
    if (row >= {{ROWS}}u) return;
{{ROW_COORDS}}
    float x[{{PER}}];
#pragma unroll
    for (int u = 0; u < {{PER}}; ++u) {
        const unsigned col = t + (unsigned)u * {{GROUP}}u;
        float v = {{PAD}};
        if (col < {{COLS}}u) {
{{PROLOGUE}}
        }
        x[u] = v;
    }
{{MATH}}
#pragma unroll
    for (int u = 0; u < {{PER}}; ++u) {
        const unsigned col = t + (unsigned)u * {{GROUP}}u;
        if (col < {{COLS}}u) {
{{STORE}}
        }
    }
    (void)kiln_red;
}
