//! What the GEMM examples (`gemm_bench`, `model_gemms`, `chain_gemms`) share, `#[path]`-included
//! (cargo builds only `examples/*.rs` and `examples/*/main.rs` as examples).

/// `n` pseudo-random floats in [-0.5, 0.5) from `seed` (xorshift64): the same data on every run.
pub fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}
