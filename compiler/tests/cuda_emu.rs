//! The CUDA code generator's kernels, run on the host: emitted CUDA C compiled as C++20 with
//! `kernels/cuda/emu.h` (real threads for CUDA threads, barriers for `__syncthreads`, slots for
//! warp shuffles and `mma`), checked against the reference interpreter. This is how the
//! generated indexing, tiling, reductions, online softmax and fused epilogues are verified on
//! machines without a GPU. Skipped, with the reason printed, where no host C++ compiler exists.

use kiln_compiler::reference::interpret;
use kiln_testkit::cuda_emu::{host_compiler, EmuModule};
use kiln_compiler::codegen::cuda::{emit_graph, CudaTarget, GemmTile};
use kiln_compiler::ir::GraphBuilder;
use kiln_compiler::models::bert::{build_bert, BertConfig, BertOutputs};
use kiln_runtime::graph::{Dim, InputRole, ReduceOp};
use kiln_runtime::{Bucket, DType, Graph, HostTensor, TensorData};

fn have_cxx() -> bool {
    if host_compiler().is_some() {
        return true;
    }
    eprintln!("SKIPPED: no host C++ compiler (g++/c++/clang++) to emulate CUDA kernels");
    false
}

/// Deterministic pseudo-random values in [-scale, scale).
fn rand_vec(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn weights_for(g: &Graph, seed: u64) -> Vec<HostTensor> {
    g.weights
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let n: usize = w.shape.iter().product();
            let v = rand_vec(n, seed + i as u64, 0.5);
            HostTensor::new(w.shape.clone(), TensorData::F32(v).convert(w.dtype)).unwrap()
        })
        .collect()
}

/// Emits `g` for `bucket` and `arch`, runs it emulated and with the reference interpreter, and
/// checks every output within `tol` (max abs diff relative to max(1, |reference|)).
fn check(name: &str, g: &Graph, weights: &[HostTensor], inputs: &[HostTensor], bucket: Bucket, arch: &str, tol: f64) -> Vec<String> {
    check_on(name, g, weights, inputs, bucket, &CudaTarget::new(arch).unwrap(), tol)
}

/// [`check`] for a given target (a forced GEMM tiling).
fn check_on(name: &str, g: &Graph, weights: &[HostTensor], inputs: &[HostTensor], bucket: Bucket, target: &CudaTarget, tol: f64) -> Vec<String> {
    let e = emit_graph(g, bucket, target).unwrap_or_else(|err| panic!("{name}: emit: {err}"));
    let kinds: Vec<String> = e.module.kernels.iter().map(|k| k.kind.clone()).collect();
    let m = EmuModule::build(&e.module).unwrap_or_else(|err| panic!("{name}: {err}"));
    let got = m.run_plan(&e.spec, weights, inputs).unwrap_or_else(|err| panic!("{name}: {err}"));
    let want = interpret(g, weights, inputs, bucket).unwrap();
    assert_eq!(got.len(), want.len());
    for (o, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(a.shape, b.shape, "{name}: output {o} shape");
        let (a, b) = (a.data.to_f64_vec(), b.data.to_f64_vec());
        let mut worst = (0.0f64, 0usize);
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            let d = (x - y).abs() / y.abs().max(1.0);
            // A NaN difference counts as the worst.
            if d > worst.0 || d.is_nan() {
                worst = (d, i);
            }
        }
        assert!(
            worst.0 <= tol,
            "{name}: output {o} element {} is {} (reference {}), error {:e} > {tol:e}; kernels {kinds:?}",
            worst.1,
            a[worst.1],
            b[worst.1],
            worst.0
        );
    }
    kinds
}

fn ids(shape: [usize; 2], vocab: i64, seed: u64) -> HostTensor {
    let v: Vec<i64> = rand_vec(shape[0] * shape[1], seed, 1.0).iter().map(|x| ((x + 1.0) * 0.5 * vocab as f32) as i64 % vocab).collect();
    HostTensor::i64(shape.to_vec(), v).unwrap()
}

#[test]
fn tiny_bert_matches_reference() {
    if !have_cxx() {
        return;
    }
    let g = build_bert(&BertConfig::tiny(), "", BertOutputs { embeddings: true, last_hidden_state: true }).unwrap();
    let w = weights_for(&g, 7);
    let b = Bucket::new(2, 8);
    // Row 1 is padded after 5 tokens.
    let mask: Vec<i64> = (0..16).map(|i| if i >= 8 + 5 { 0 } else { 1 }).collect();
    let inputs = vec![ids([2, 8], 50, 1), HostTensor::i64(vec![2, 8], mask).unwrap(), HostTensor::i64(vec![2, 8], vec![0; 16]).unwrap()];
    let kinds = check("tiny bert", &g, &w, &inputs, b, "sm_90", 2e-5);
    eprintln!("tiny bert kernels: {kinds:?}");
    for want in ["gemm", "layer_norm", "gather", "reduce"] {
        assert!(kinds.iter().any(|k| k.starts_with(want)), "no {want} kernel among {kinds:?}");
    }
}

/// GEMMs whose sizes are not multiples of any tile, with a transposed (nn.Linear) weight, a
/// bias + GELU epilogue, and a residual add; each of the three SIMT tile shapes.
#[test]
fn linear_layers_at_odd_sizes() {
    if !have_cxx() {
        return;
    }
    for (rows, seq, k, n, want) in [
        (3usize, 5usize, 50usize, 70usize, "gemm/simt_32x32"),
        (37, 5, 33, 129, "gemm/simt_32x32"),
        (55, 20, 17, 1000, "gemm/simt_64x64"),
        (110, 20, 17, 1000, "gemm/simt_128x64"),
    ] {
        let (g, w, xin, b) = linear_layers(rows, seq, k, n);
        let kinds = check(&format!("linear {rows}x{seq}x{k}x{n}"), &g, &w, &[xin], b, "sm_90", 2e-5);
        assert!(kinds.iter().any(|k| k == want), "want {want}: {kinds:?}");
    }
}

/// A linear + GELU, a matmul with a transposed weight and a residual add, and its input.
fn linear_layers(rows: usize, seq: usize, k: usize, n: usize) -> (Graph, Vec<HostTensor>, HostTensor, Bucket) {
    let mut gb = GraphBuilder::new();
    let x = gb.input("x", DType::F32, vec![Dim::Batch, Dim::Seq, Dim::Fixed(k)], InputRole::Other).unwrap();
    let w1 = gb.weight("w1", DType::F32, &[n, k]).unwrap();
    let b1 = gb.weight("b1", DType::F32, &[n]).unwrap();
    let w2 = gb.weight("w2", DType::F32, &[n, k]).unwrap();
    let h = gb.linear(x, w1, Some(b1)).unwrap();
    let h = gb.gelu(h).unwrap();
    let y = gb.matmul(h, w2).unwrap();
    let y = gb.add(y, x).unwrap();
    gb.output("y", y);
    let g = gb.finish().unwrap();
    let w = weights_for(&g, 3);
    let xin = HostTensor::f32(vec![rows, seq, k], rand_vec(rows * seq * k, 11, 1.0)).unwrap();
    (g, w, xin, Bucket::new(rows, seq))
}

/// Every tiling of the SIMT template, with and without prefetch, forced on sizes that are not
/// multiples of any tile and k spanning several slices (the prefetch's last-slice edge).
#[test]
fn every_gemm_tile_at_odd_sizes() {
    if !have_cxx() {
        return;
    }
    let (g, w, xin, b) = linear_layers(7, 19, 41, 150);
    for tile in GemmTile::ALL {
        for prefetch in [true, false] {
            let tile = GemmTile { prefetch, ..tile };
            let target = CudaTarget::new("sm_90").unwrap().with_gemm_tile(tile);
            let kinds = check_on(&format!("{tile:?}"), &g, &w, std::slice::from_ref(&xin), b, &target, 2e-5);
            let sp = if tile.split { "_split" } else { "" };
            let want = format!("gemm/simt_{}x{}{sp}{}", tile.bm, tile.bn, if prefetch { "" } else { "_noprefetch" });
            assert!(kinds.contains(&want), "want {want}: {kinds:?}");
        }
    }
}

/// f16 GEMM on the tensor-core template (emulated mma.sync m16n8k16), odd sizes.
#[test]
fn f16_gemm_uses_mma() {
    if !have_cxx() {
        return;
    }
    for dt in [DType::F16, DType::BF16] {
        let (k, n) = (40usize, 72usize);
        let mut gb = GraphBuilder::new();
        let x = gb.input("x", dt, vec![Dim::Batch, Dim::Seq, Dim::Fixed(k)], InputRole::Other).unwrap();
        let w1 = gb.weight("w1", dt, &[n, k]).unwrap();
        let b1 = gb.weight("b1", dt, &[n]).unwrap();
        let y = gb.linear(x, w1, Some(b1)).unwrap();
        gb.output("y", y);
        let g = gb.finish().unwrap();
        let w = weights_for(&g, 5);
        let b = Bucket::new(3, 23);
        let xin = HostTensor::new(vec![3, 23, k], TensorData::F32(rand_vec(3 * 23 * k, 13, 1.0)).convert(dt)).unwrap();
        // Rounding the f32 accumulator to f16/bf16 once: within one unit of the last place.
        let tol = if dt == DType::F16 { 2e-3 } else { 1e-2 };
        let kinds = check(&format!("{dt} gemm"), &g, &w, std::slice::from_ref(&xin), b, "sm_80", tol);
        assert!(kinds.iter().any(|k| k.starts_with("gemm/mma_")), "{kinds:?}");
        // sm_75 has no m16n8k16: the SIMT template converts on load.
        let kinds = check(&format!("{dt} gemm sm_75"), &g, &w, &[xin], b, "sm_75", tol);
        assert!(kinds.iter().any(|k| k.starts_with("gemm/simt")), "{kinds:?}");
    }
}

/// Attention shapes that exercise partial key tiles and partial query blocks, and head dims
/// that are not multiples of 32; softmax and LayerNorm rows long enough for the block variant.
#[test]
fn attention_and_long_rows() {
    if !have_cxx() {
        return;
    }
    // Attention: q/k/v from inputs [b, h, s, d], additive mask [b, 1, 1, s]; head dims with
    // keys in registers (40), a row length not a multiple of 4 (13), keys read from shared
    // memory and 3 output columns per lane (72).
    for d in [40usize, 13, 72] {
        let heads = 3usize;
        let mut gb = GraphBuilder::new();
        let q = gb.input("q", DType::F32, vec![Dim::Batch, Dim::Fixed(heads), Dim::Seq, Dim::Fixed(d)], InputRole::Other).unwrap();
        let k = gb.input("k", DType::F32, vec![Dim::Batch, Dim::Fixed(heads), Dim::Seq, Dim::Fixed(d)], InputRole::Other).unwrap();
        let v = gb.input("v", DType::F32, vec![Dim::Batch, Dim::Fixed(heads), Dim::Seq, Dim::Fixed(d)], InputRole::Other).unwrap();
        let m = gb.input("m", DType::F32, vec![Dim::Batch, Dim::Fixed(1), Dim::Fixed(1), Dim::Seq], InputRole::Other).unwrap();
        let s = gb.matmul_t(q, k, false, true).unwrap();
        let sc = gb.scalar(0.15).unwrap();
        let s = gb.mul(s, sc).unwrap();
        let p = gb.softmax(s, 3, Some(m)).unwrap();
        let o = gb.matmul(p, v).unwrap();
        gb.output("o", o);
        let g = gb.finish().unwrap();
        let (bb, ss) = (2usize, 45usize);
        let n = bb * heads * ss * d;
        let mask: Vec<f32> = (0..bb * ss).map(|i| if i % ss >= 40 && i / ss == 1 { -10000.0 } else { 0.0 }).collect();
        let inputs = vec![
            HostTensor::f32(vec![bb, heads, ss, d], rand_vec(n, 1, 1.0)).unwrap(),
            HostTensor::f32(vec![bb, heads, ss, d], rand_vec(n, 2, 1.0)).unwrap(),
            HostTensor::f32(vec![bb, heads, ss, d], rand_vec(n, 3, 1.0)).unwrap(),
            HostTensor::f32(vec![bb, 1, 1, ss], mask).unwrap(),
        ];
        let kinds = check(&format!("attention d{d}"), &g, &[], &inputs, Bucket::new(bb, ss), "sm_90", 2e-5);
        assert!(kinds.iter().any(|k| k == "attention"), "{kinds:?}");
    }

    // Long rows: softmax and LayerNorm over 1500 columns (block per row), and a reduction.
    let cols = 1500usize;
    let mut gb = GraphBuilder::new();
    let x = gb.input("x", DType::F32, vec![Dim::Batch, Dim::Fixed(cols)], InputRole::Other).unwrap();
    let gam = gb.weight("g", DType::F32, &[cols]).unwrap();
    let bet = gb.weight("b", DType::F32, &[cols]).unwrap();
    let sm = gb.softmax(x, 1, None).unwrap();
    let ln = gb.layer_norm(x, gam, bet, 1e-5).unwrap();
    let mx = gb.reduce(ReduceOp::Max, x, &[1], false).unwrap();
    let mean = gb.reduce_mean(x, &[1], true).unwrap();
    let cent = gb.sub(x, mean).unwrap();
    gb.output("sm", sm);
    gb.output("ln", ln);
    gb.output("mx", mx);
    gb.output("cent", cent);
    let g = gb.finish().unwrap();
    let w = weights_for(&g, 9);
    let xin = HostTensor::f32(vec![3, cols], rand_vec(3 * cols, 4, 3.0)).unwrap();
    let kinds = check("long rows", &g, &w, &[xin], Bucket::new(3, 1), "sm_90", 2e-5);
    assert!(kinds.iter().any(|k| k.ends_with("/block")), "{kinds:?}");
}

/// Gather, concat, slice, where and casts (integer and float paths).
#[test]
fn gather_concat_where_cast() {
    if !have_cxx() {
        return;
    }
    let mut gb = GraphBuilder::new();
    let ids = gb.input("ids", DType::I64, vec![Dim::Batch, Dim::Seq], InputRole::TokenIds).unwrap();
    let tab = gb.weight("tab", DType::F32, &[20, 6]).unwrap();
    let e = gb.gather(tab, ids).unwrap();
    let c = gb.concat(&[e, e], 2).unwrap();
    let idf = gb.cast(ids, DType::F32).unwrap();
    let five = gb.scalar(5.0).unwrap();
    let gt = gb.sub(idf, five).unwrap();
    let gt = gb.relu(gt).unwrap();
    let gt3 = gb.reshape(gt, vec![Dim::Batch, Dim::Seq, Dim::Fixed(1)]).unwrap();
    let zero = gb.scalar(0.0).unwrap();
    let z = gb.where_(gt3, c, zero).unwrap();
    let back = gb.cast(idf, DType::I32).unwrap();
    gb.output("z", z);
    gb.output("back", back);
    let g = gb.finish().unwrap();
    let w = weights_for(&g, 2);
    let b = Bucket::new(2, 7);
    check("gather/concat/where", &g, &w, &[ids_in(b)], b, "sm_90", 1e-6);
}

fn ids_in(b: Bucket) -> HostTensor {
    ids([b.batch, b.seq], 20, 5)
}

/// all-MiniLM-L6-v2 through the emitted CUDA C, emulated, against the golden embeddings of an
/// independent float64 implementation (where the model has been fetched; skipped otherwise).
#[test]
fn minilm_emulated_matches_golden() {
    if !have_cxx() {
        return;
    }
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::var_os("KILN_MODEL_DIR").map(std::path::PathBuf::from).unwrap_or_else(|| root.join("models/all-MiniLM-L6-v2"));
    if !dir.join("model.safetensors").is_file() {
        eprintln!("SKIPPED: MiniLM not found in {} (run `kiln fetch-model minilm`)", dir.display());
        return;
    }
    let cfg = BertConfig::from_file(&dir.join("config.json")).unwrap();
    let g = build_bert(&cfg, "", BertOutputs::default()).unwrap();
    let w = kiln_runtime::load_graph_weights(&kiln_runtime::SafetensorsLoader::new(), &dir.join("model.safetensors"), &g.weights).unwrap();
    let gold: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(root.join("tests/data/minilm/golden.json")).unwrap()).unwrap();
    let sentences = gold["sentences"].as_array().unwrap();
    let seqs: Vec<Vec<i64>> = sentences.iter().take(2).map(|s| s["ids"].as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect()).collect();
    let b = Bucket::new(2, 16);
    let batch = kiln_runtime::Batch::from_token_ids(&g, &seqs).unwrap().pad_to(&g, b).unwrap();
    let e = emit_graph(&g, b, &CudaTarget::new("sm_90").unwrap()).unwrap();
    let m = EmuModule::build(&e.module).unwrap();
    let t = std::time::Instant::now();
    let out = m.run_plan(&e.spec, &w, &batch.tensors).unwrap();
    let got = out[0].to_f32_vec();
    for (i, s) in sentences.iter().take(2).enumerate() {
        let want: Vec<f32> = s["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        let row = &got[i * 384..(i + 1) * 384];
        let dot: f64 = row.iter().zip(&want).map(|(a, b)| *a as f64 * *b as f64).sum();
        let na: f64 = row.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
        let nb: f64 = want.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
        let cos = dot / (na * nb);
        eprintln!("MiniLM emulated, sentence {i}: cosine {cos:.8} ({:.1} s)", t.elapsed().as_secs_f64());
        assert!(cos >= 0.99999, "sentence {i}: cosine {cos}");
    }
}
