//! Fused attention at the MiniLM layer shape (12 heads, head dim 32, key mask) for seq 128, 256
//! and 512 (or the seqs given as arguments), best of many runs; `THREADS` (default 1) and `BATCH`
//! (default 1) in the environment.
//! `cargo run --release -p kiln-kernels --example attn_bench [-- 128 512]`

use std::hint::black_box;
use std::time::Instant;

use kiln_kernels::attention::{
    attention_batched, attention_batched_scratch_len, AttnDims, HeadsMut, HeadsRef,
};
use kiln_kernels::detect_isa;
use kiln_kernels::threadpool::ThreadPool;

fn env(name: &str) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(1).max(1)
}

fn main() {
    let mut seqs: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    if seqs.is_empty() {
        seqs = vec![128, 256, 512];
    }
    let (threads, batch) = (env("THREADS"), env("BATCH"));
    let pool = ThreadPool::new(threads);
    for s in seqs {
        bench(s, s, batch, &pool);
        // A text of half the bucket's length: the padded keys are skipped.
        bench(s, s / 2, batch, &pool);
    }
}

/// `open` keys of `s` are real, the rest padded with BERT's -10000.
fn bench(s: usize, open: usize, batch: usize, pool: &ThreadPool) {
    let (d, h) = (32usize, 12usize);
    let hd = h * d;
    let dims = AttnDims { seq_q: s, seq_k: s, head_dim: d, head_dim_v: d };
    let qkv: Vec<f32> = (0..batch * s * 3 * hd).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let mask: Vec<f32> = (0..batch * s).map(|j| if j % s < open { 0.0 } else { -10000.0 }).collect();
    let mut out = vec![0.0f32; batch * s * hd];
    let mut scratch = vec![0.0f32; attention_batched_scratch_len(dims, pool.threads())];
    let isa = detect_isa();
    let mut all = Vec::new();
    let runs = (2000 * 128 * 128 / (batch * s * s)).max(20);
    for _ in 0..runs {
        let t0 = Instant::now();
        let op = |off: usize| HeadsRef { data: &qkv[off..], batch_stride: s * 3 * hd, head_stride: d, row_stride: 3 * hd };
        attention_batched(
            batch,
            h,
            dims,
            op(0),
            op(hd),
            op(2 * hd),
            Some(HeadsRef { data: &mask, batch_stride: s, head_stride: 0, row_stride: 0 }),
            HeadsMut { data: &mut out, batch_stride: s * hd, head_stride: d, row_stride: hd },
            1.0 / (d as f32).sqrt(),
            &mut scratch,
            (pool.threads() > 1).then_some(pool),
            isa,
        )
        .expect("attention");
        black_box(&out);
        all.push(t0.elapsed().as_secs_f64());
    }
    let flops = 4.0 * (batch * h * s * s * d) as f64;
    all.sort_by(f64::total_cmp);
    let (best, median) = (all[0], all[all.len() / 2]);
    println!(
        "attention {batch}x{s} ({open} keys open), {h} heads, {isa:?}, {} thread(s): best {:.1} µs ({:.1} GF/s over all keys), median {:.1} µs",
        pool.threads(),
        best * 1e6,
        flops / best / 1e9,
        median * 1e6
    );
}
