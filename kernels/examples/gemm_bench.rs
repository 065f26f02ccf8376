//! GEMM benchmark: measures this machine's FMA peak with a register-only microbenchmark, then the
//! GFLOP/s of `kiln_kernels::gemm` at MiniLM shapes, single- and multi-threaded, as % of that peak.
//!
//! `cargo run --release -p kiln-kernels --example gemm_bench [-- --quick]`

use std::hint::black_box;
use std::time::{Duration, Instant};

use kiln_kernels::gemm::{gemm_scratch_len, gemm_split, pack_b, EpilogueRef, Split};
use kiln_kernels::math::Activation;
use kiln_kernels::threadpool::ThreadPool;
use kiln_kernels::{detect_isa, Isa};

/// FLOPs per call of `fma_loop`: iters · 12 chains · 8 lanes · 2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn fma_loop(iters: u64, seed: f32) -> f32 {
    use std::arch::x86_64::*;
    // 12 independent accumulator chains: FMA latency (4 cycles) × 2 pipes needs at least 8.
    let x = _mm256_set1_ps(0.999_999);
    let y = _mm256_set1_ps(1e-7);
    let mut a = [_mm256_set1_ps(seed); 12];
    for (i, v) in a.iter_mut().enumerate() {
        *v = _mm256_add_ps(*v, _mm256_set1_ps(i as f32));
    }
    for _ in 0..iters {
        for v in a.iter_mut() {
            *v = _mm256_fmadd_ps(*v, x, y);
        }
    }
    let mut s = _mm256_setzero_ps();
    for v in a {
        s = _mm256_add_ps(s, v);
    }
    let mut out = [0.0f32; 8];
    // SAFETY: out has 8 floats.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
    out.iter().sum()
}

/// Peak GFLOP/s of `threads` threads each running the register FMA loop.
fn fma_peak(threads: usize) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if detect_isa() == Isa::Avx2Fma {
        let iters: u64 = 50_000_000;
        let mut best = 0.0f64;
        for _ in 0..3 {
            let t0 = Instant::now();
            std::thread::scope(|s| {
                for t in 0..threads {
                    s.spawn(move || {
                        // SAFETY: AVX2+FMA detected above.
                        black_box(unsafe { fma_loop(black_box(iters), t as f32) })
                    });
                }
            });
            let dt = t0.elapsed().as_secs_f64();
            let flops = (iters * 12 * 8 * 2 * threads as u64) as f64;
            best = best.max(flops / dt / 1e9);
        }
        return best;
    }
    let _ = threads;
    f64::NAN
}

fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

/// Best-of time (seconds) of `f` over `min_time`.
fn time_it(min_time: Duration, mut f: impl FnMut()) -> f64 {
    f();
    f();
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut runs = 0;
    while start.elapsed() < min_time || runs < 5 {
        let t0 = Instant::now();
        f();
        best = best.min(t0.elapsed().as_secs_f64());
        runs += 1;
    }
    best
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let min_time = Duration::from_millis(if quick { 150 } else { 600 });
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let isa = detect_isa();
    println!("ISA: {isa:?}, cores: {cores}");

    let peak1 = fma_peak(1);
    let peak2 = fma_peak(2);
    println!("FMA peak (register-only vfmadd231ps ymm, 12 chains): 1 thread {peak1:.1} GFLOP/s, 2 threads {peak2:.1} GFLOP/s");

    let shapes: &[(usize, usize, usize)] = &[
        (128, 384, 384),
        (128, 384, 1536),
        (128, 1536, 384),
        (1024, 384, 1536),
    ];
    let pool2 = ThreadPool::new(2);
    println!(
        "{:>22} {:>9} {:>10} {:>8} {:>10} {:>8} {:>10} {:>8}",
        "m×k·k×n", "variant", "1T GF/s", "%peak1", "2T GF/s", "%peak2", "2T rows", "2T pan"
    );
    for &(m, k, n) in shapes {
        let a = rand_vec(m * k, 1);
        let w = rand_vec(n * k, 2); // [n, k] like a PyTorch Linear weight
        let bias = rand_vec(n, 3);
        let pb = pack_b(&w, k, n, k, true).expect("pack");
        let mut c = vec![0.0f32; m * n];
        let mut scratch = vec![0.0f32; gemm_scratch_len(m, n, k, 2)];
        let flops = 2.0 * (m * n * k) as f64;
        for (label, epi) in [
            ("plain", EpilogueRef::default()),
            (
                "bias+gelu",
                EpilogueRef {
                    bias: Some(&bias),
                    activation: Activation::GeluErf,
                    ..Default::default()
                },
            ),
        ] {
            let mut run = |pool: Option<&ThreadPool>, split: Split| {
                time_it(min_time, || {
                    gemm_split(
                        m,
                        k,
                        n,
                        &a,
                        k,
                        pb.as_slice(),
                        &mut c,
                        n,
                        false,
                        &epi,
                        &mut scratch,
                        pool,
                        isa,
                        split,
                    )
                    .expect("gemm");
                    black_box(&c);
                })
            };
            let t1 = run(None, Split::Auto);
            let t2 = run(Some(&pool2), Split::Auto);
            let t2r = run(Some(&pool2), Split::Rows);
            let t2p = run(Some(&pool2), Split::Panels);
            println!(
                "{:>22} {:>9} {:>10.1} {:>7.1}% {:>10.1} {:>7.1}% {:>10.1} {:>8.1}",
                format!("{m}×{k}·{k}×{n}"),
                label,
                flops / t1 / 1e9,
                100.0 * flops / t1 / 1e9 / peak1,
                flops / t2 / 1e9,
                100.0 * flops / t2 / 1e9 / peak2,
                flops / t2r / 1e9,
                flops / t2p / 1e9,
            );
        }
    }
}
