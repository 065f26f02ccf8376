//! Helpers shared by the kernel tests.
#![allow(dead_code)]

/// Deterministic pseudo-random floats in [-1, 1).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03)
    }
    pub fn next_u64(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// The ISAs this machine can run (scalar always; AVX2 when detected; AVX-512 when detected).
pub fn isas() -> Vec<kiln_kernels::Isa> {
    let best = kiln_kernels::detect_isa();
    let mut v = vec![kiln_kernels::Isa::Scalar];
    if best.has_avx2() {
        v.push(kiln_kernels::Isa::Avx2Fma);
    }
    if best == kiln_kernels::Isa::Avx512 {
        v.push(kiln_kernels::Isa::Avx512);
    }
    v
}

/// f64 GELU (erf form) reference; `1 + erf(u) = erfc(-u)` avoids cancellation for negative x.
pub fn gelu_erf64(x: f64) -> f64 {
    0.5 * x * libm::erfc(-x / std::f64::consts::SQRT_2)
}

/// f64 GELU (tanh form) reference.
pub fn gelu_tanh64(x: f64) -> f64 {
    let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    // 1 + tanh(u) = 2 / (1 + exp(-2u)), without cancellation for negative u.
    0.5 * x * (2.0 / (1.0 + (-2.0 * u).exp()))
}

pub fn sigmoid64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// f64 reference of an activation.
pub fn act64(a: kiln_kernels::math::Activation, x: f64) -> f64 {
    use kiln_kernels::math::Activation::*;
    match a {
        None => x,
        Relu => x.max(0.0),
        GeluErf => gelu_erf64(x),
        GeluTanh => gelu_tanh64(x),
        Tanh => x.tanh(),
        Sigmoid => sigmoid64(x),
        Silu => x * sigmoid64(x),
        Relu6 => if x.is_nan() { x } else { x.clamp(0.0, 6.0) + 0.0 },
    }
}
