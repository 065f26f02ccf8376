// Elementwise chain: one thread per element of the iteration shape; loads are strided views
// (stride 0 = broadcast), the fused expression computes in f32, the store converts.
extern "C" __global__ void __launch_bounds__(256) {{NAME}}({{PARAMS}}) {
    const unsigned long long i = (unsigned long long)blockIdx.x * 256ull + threadIdx.x;
    if (i >= {{NUMEL}}ull) return;
{{COORDS}}
{{BODY}}
}
