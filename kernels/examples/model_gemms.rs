//! The GEMM sequence of MiniLM-L6 (6 layers: Q, K, V, out 384×384; FFN 384×1536, 1536×384) at one
//! token count, each layer with its own packed weights (42 MB in all, as in the model), 1 thread
//! and 2 threads, best of several passes. `KILN_NO_AVX512=1` compares the AVX2 tile;
//! `SPLIT=rows|panels` forces the 2-thread work split (default: the kernel's choice).
//!
//! `cargo run --release -p kiln-kernels --example model_gemms -- [m ...]` (default: 16 128)

use std::hint::black_box;
use std::time::Instant;

use kiln_kernels::detect_isa;
use kiln_kernels::gemm::{gemm_scratch_len, gemm_split, pack_b, EpilogueRef, PackedB, Split};
use kiln_kernels::math::Activation;
use kiln_kernels::threadpool::ThreadPool;

#[path = "common/mod.rs"]
mod common;
use common::rand_vec;

fn main() {
    let ms: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let ms = if ms.is_empty() { vec![16, 128] } else { ms };
    let isa = detect_isa();
    let shapes = [(384, 384), (384, 384), (384, 384), (384, 384), (384, 1536), (1536, 384)];
    let mut weights: Vec<(usize, usize, PackedB, Vec<f32>)> = Vec::new();
    for l in 0..6 {
        for (i, &(k, n)) in shapes.iter().enumerate() {
            let w = rand_vec(n * k, (l * 10 + i) as u64);
            weights.push((k, n, pack_b(&w, k, n, k, true).expect("pack"), rand_vec(n, 7)));
        }
    }
    let pool = ThreadPool::new(2);
    let split = match std::env::var("SPLIT").as_deref() {
        Ok("rows") => Split::Rows,
        Ok("panels") => Split::Panels,
        _ => Split::Auto,
    };
    println!("ISA {isa:?}");
    for &m in &ms {
        let a = rand_vec(m * 1536, 3);
        let mut c = vec![0.0f32; m * 1536];
        let mut scratch = vec![0.0f32; gemm_scratch_len(m, 1536, 1536, 2)];
        let flops: f64 = weights.iter().map(|(k, n, _, _)| 2.0 * (m * k * n) as f64).sum();
        for (label, p) in [("1T", None), ("2T", Some(&pool))] {
            let mut best = f64::MAX;
            for _ in 0..30 {
                let t0 = Instant::now();
                for (k, n, pb, bias) in &weights {
                    let epi = EpilogueRef {
                        bias: Some(bias),
                        activation: if *n == 1536 { Activation::GeluErf } else { Activation::None },
                        ..Default::default()
                    };
                    gemm_split(
                        m, *k, *n, &a, *k, pb.as_slice(), &mut c, *n, false, &epi, &mut scratch, p,
                        isa, split,
                    )
                    .expect("gemm");
                }
                black_box(&c);
                best = best.min(t0.elapsed().as_secs_f64());
            }
            println!(
                "m {m:4} {label}: {:.3} ms, {:.1} GF/s",
                best * 1e3,
                flops / best / 1e9
            );
        }
    }
}
