// Embedding lookup: out[ids..., c] = table[id, c]. Ids outside [0, rows) are clamped into it
// (a GPU kernel cannot raise; the engine checks ids on the host).
extern "C" __global__ void __launch_bounds__(256) {{NAME}}({{PARAMS}}) {
    const unsigned long long i = (unsigned long long)blockIdx.x * 256ull + threadIdx.x;
    if (i >= {{NUMEL}}ull) return;
{{COORDS}}
    long long id = (long long)({{ID_LOAD}});
    id = id < 0 ? 0 : (id >= {{ROWS}}ll ? {{ROWS}}ll - 1 : id);
{{STORE}}
}
