// Concatenation along one axis: each output element copies from the input that covers its
// coordinate on that axis.
extern "C" __global__ void __launch_bounds__(256) {{NAME}}({{PARAMS}}) {
    const unsigned long long i = (unsigned long long)blockIdx.x * 256ull + threadIdx.x;
    if (i >= {{NUMEL}}ull) return;
{{COORDS}}
{{BODY}}
}
