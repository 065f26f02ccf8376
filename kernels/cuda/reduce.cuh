// Reduction of the trailing dims: one warp per output element; lanes stride over the reduced
// elements, then a shuffle reduction.
extern "C" __global__ void __launch_bounds__(256) {{NAME}}({{PARAMS}}) {
    const unsigned long long o = (unsigned long long)blockIdx.x * 8ull + (threadIdx.x >> 5);
    const unsigned lane = threadIdx.x & 31u;
    if (o >= {{OUTER}}ull) return;
{{OUTER_COORDS}}
    float acc = {{INIT}};
    for (unsigned long long r = lane; r < {{INNER}}ull; r += 32ull) {
{{INNER_COORDS}}
{{PROLOGUE}}
        acc = {{COMBINE}};
    }
    acc = {{WARP_REDUCE}}(acc);
    if (lane == 0) {
        const float v = {{FINISH}};
{{STORE}}
    }
}
