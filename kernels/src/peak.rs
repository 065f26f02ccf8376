//! The machine's f32 FMA peak, measured: every thread runs a register-only loop of independent
//! FMA chains (no loads or stores), and the best of several short runs is kept (other processes
//! only ever make a run slower). Benchmarks report GFLOP/s as a share of this.
//!
//! The loop uses the widest FMA the kernels run with ([`crate::detect_isa`]): `vfmadd231ps zmm`
//! on the AVX-512 path, `ymm` on the AVX2 one (`KILN_NO_AVX512=1`). The two differ where the
//! 512-bit FMA is native: an Intel Xeon with two 512-bit FMA units peaks at twice its ymm rate
//! (measured on a 2-core Xeon VM: 92-95 GFLOP/s per thread with ymm, 171-175 with zmm, where the
//! AVX-512 GEMM ran at 168, "180% of peak" against the ymm figure), while AMD Zen 4 splits a
//! zmm FMA into two halves and peaks at the same rate with either width.

#[cfg(target_arch = "x86_64")]
use crate::lanes::Lanes;
use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

/// Independent accumulator chains: FMA latency (4 cycles) × 2 pipes needs at least 8.
const CHAINS: usize = 12;

/// `CHAINS` independent chains of `iters` FMAs each, summed at the end (so none is dead code).
///
/// # Safety
/// `V`'s ISA is present (the caller is a `#[target_feature]` function of it).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn chains<V: Lanes>(iters: u64, seed: f32) -> V {
    // SAFETY: the caller's contract.
    unsafe {
        let (x, y) = (V::splat(0.999_999), V::splat(1e-7));
        let mut a = [V::splat(seed); CHAINS];
        for (i, v) in a.iter_mut().enumerate() {
            *v = v.add(V::splat(i as f32));
        }
        for _ in 0..iters {
            for v in a.iter_mut() {
                *v = v.fmadd(x, y);
            }
        }
        a.into_iter().fold(V::splat(0.0), |s, v| s.add(v))
    }
}

/// FLOPs per call: iters · CHAINS chains · 8 lanes · 2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn fma_loop(iters: u64, seed: f32) -> f32 {
    use std::arch::x86_64::*;
    // SAFETY: AVX2+FMA enabled on this function.
    let s: __m256 = unsafe { chains(iters, seed) };
    let mut out = [0.0f32; 8];
    // SAFETY: out has 8 floats.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
    out.iter().sum()
}

/// Whether the kernels (and so the peak loop) run 512-bit FMAs on this machine.
fn zmm() -> bool {
    crate::detect_isa() == crate::Isa::Avx512
}

/// The register the peak loop uses on this machine: "zmm" (AVX-512 path) or "ymm".
pub fn fma_register() -> &'static str {
    if zmm() {
        "zmm"
    } else {
        "ymm"
    }
}

/// FLOPs per call: iters · CHAINS chains · 16 lanes · 2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn fma_loop_512(iters: u64, seed: f32) -> f32 {
    use std::arch::x86_64::*;
    // SAFETY: AVX-512F enabled on this function.
    _mm512_reduce_add_ps(unsafe { chains::<__m512>(iters, seed) })
}

/// Peak GFLOP/s of `threads` threads each running the register FMA loop for about `ms_per_run`
/// milliseconds, best of `runs`. `None` without AVX2+FMA (no SIMD peak to speak of).
pub fn fma_peak_gflops(threads: usize, runs: usize, ms_per_run: f64) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if crate::detect_isa().has_avx2() {
        let threads = threads.max(1);
        let wide = zmm();
        let lanes = if wide { 16 } else { 8 };
        // One iteration = 12 FMAs = 6 cycles on two FMA pipes: ~6e5 iterations per ms at 3.6 GHz.
        let iters = ((ms_per_run.max(0.1)) * 6e5) as u64;
        let mut best = 0.0f64;
        for _ in 0..runs.max(1) {
            // Each thread times its own loop after a common start, and the run takes the
            // slowest: spawning and joining the threads (tens of µs on a VM) stay out of it,
            // so a short run (a probe beside a benchmark's runs) reads as a long one does.
            let start = Barrier::new(threads);
            let dt = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads)
                    .map(|t| {
                        let start = &start;
                        s.spawn(move || {
                            start.wait();
                            let t0 = Instant::now();
                            if wide {
                                // SAFETY: AVX-512F detected (detect_isa).
                                black_box(unsafe { fma_loop_512(black_box(iters), t as f32) });
                            } else {
                                // SAFETY: AVX2+FMA detected above.
                                black_box(unsafe { fma_loop(black_box(iters), t as f32) });
                            }
                            t0.elapsed().as_secs_f64()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap_or(f64::INFINITY)).fold(0.0, f64::max)
            });
            let flops = (iters * CHAINS as u64 * lanes * 2 * threads as u64) as f64;
            best = best.max(flops / dt / 1e9);
        }
        return Some(best);
    }
    let _ = (threads, runs, ms_per_run);
    None
}

/// One short peak reading (about 4 ms) for `threads` threads: what a benchmark takes beside
/// each of its runs, so that a share of the peak compares two rates of the same seconds. (On a
/// shared host the FMA rate itself moves by up to 1.5× within minutes, with turbo and with
/// what the other tenants run: a peak read once before an hour of runs says little about any
/// one of them.)
pub fn fma_peak_probe(threads: usize) -> Option<f64> {
    fma_peak_gflops(threads, 1, 4.0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn peak_is_positive_where_measurable() {
        if let Some(p) = super::fma_peak_gflops(1, 2, 1.0) {
            assert!(p.is_finite() && p > 1.0, "peak {p}");
        }
    }
}
