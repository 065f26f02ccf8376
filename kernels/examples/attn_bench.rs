//! Fused attention at the MiniLM layer shape (batch 1, 12 heads, seq 128, head dim 32, key mask),
//! 1 thread, best of many runs. `cargo run --release -p kiln-kernels --example attn_bench`

use std::hint::black_box;
use std::time::Instant;

use kiln_kernels::attention::{
    attention_batched, attention_batched_scratch_len, AttnDims, HeadsMut, HeadsRef,
};
use kiln_kernels::detect_isa;

fn main() {
    let (s, d, h) = (128usize, 32usize, 12usize);
    let hd = h * d;
    let dims = AttnDims { seq_q: s, seq_k: s, head_dim: d, head_dim_v: d };
    let qkv: Vec<f32> = (0..s * 3 * hd).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let mask = vec![0.0f32; s];
    let mut out = vec![0.0f32; s * hd];
    let mut scratch = vec![0.0f32; attention_batched_scratch_len(dims, 1)];
    let isa = detect_isa();
    let mut best = f64::MAX;
    for _ in 0..2000 {
        let t0 = Instant::now();
        let op = |off: usize| HeadsRef { data: &qkv[off..], batch_stride: s * 3 * hd, head_stride: d, row_stride: 3 * hd };
        attention_batched(
            1,
            h,
            dims,
            op(0),
            op(hd),
            op(2 * hd),
            Some(HeadsRef { data: &mask, batch_stride: s, head_stride: 0, row_stride: 0 }),
            HeadsMut { data: &mut out, batch_stride: s * hd, head_stride: d, row_stride: hd },
            1.0 / (d as f32).sqrt(),
            &mut scratch,
            None,
            isa,
        )
        .expect("attention");
        black_box(&out);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    let flops = 4.0 * (h * s * s * d) as f64;
    println!("attention 1x{s}, {h} heads, {isa:?}: best {:.1} µs ({:.1} GF/s)", best * 1e6, flops / best / 1e9);
}
