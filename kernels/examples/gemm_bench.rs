//! GEMM benchmark: measures this machine's FMA peak with a register-only microbenchmark, then the
//! GFLOP/s of `kiln_kernels::gemm` at MiniLM shapes, single- and multi-threaded, as % of that peak,
//! and the exact integer GEMM (`gemm_i16`: i16 pairs with and without VNNI, byte quads) against it on the same shapes.
//!
//! `cargo run --release -p kiln-kernels --example gemm_bench [-- --quick]`; `COLD=a|b|c` makes
//! only that operand (A, packed B, or C with the bias) cold in the hot/cold section (default: all);
//! `SHAPES="m,k,n;..."` times those shapes instead of MiniLM's; `EPI=bias` times a bias alone
//! where the default times bias+GELU;
//! `ONLY=shapes` stops after that first table (for profiling it alone).

use std::hint::black_box;
use std::time::{Duration, Instant};

use kiln_kernels::attention::{
    attention_batched, attention_batched_scratch_len, AttnDims, HeadsMut, HeadsRef,
};
use kiln_kernels::gemm::{amx_available, gemm_scratch_len, gemm_split, int_layout_for, IntTiles, pack_b, pack_b_int_into, packed_b_int_bytes, EpilogueRef, IntLayout, PackedB, Split};
use kiln_kernels::math::{self, Activation, Unary};
use kiln_kernels::threadpool::ThreadPool;
use kiln_kernels::{detect_isa, Isa};

/// Peak GFLOP/s of `threads` threads each running the register FMA loop.
fn fma_peak(threads: usize) -> f64 {
    kiln_kernels::peak::fma_peak_gflops(threads, 15, 17.0).unwrap_or(f64::NAN)
}

/// A closure for [`best_of`]'s rounds that reads the peak of `threads` threads once per round
/// and keeps the best in `best` (NaN without a SIMD peak).
fn probe(threads: usize, best: &mut f64) -> impl FnMut() + '_ {
    move || {
        *best = match kiln_kernels::peak::fma_peak_probe(threads) {
            Some(p) => best.max(p),
            None => f64::NAN,
        }
    }
}

#[path = "common/mod.rs"]
mod common;
use common::rand_vec;

/// CPU time of the calling thread in seconds (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)`); unlike
/// wall time it does not count time the thread spent preempted by other processes.
#[cfg(target_os = "linux")]
fn thread_cpu_time() -> Option<f64> {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: libc's clock_gettime (linked by std on Linux) writes one timespec to a valid pointer.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then_some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
}

#[cfg(not(target_os = "linux"))]
fn thread_cpu_time() -> Option<f64> {
    None
}

/// Best per-call CPU time of a single-threaded closure, `reps` calls per sample.
fn best_cpu(min_time: Duration, reps: usize, f: &mut dyn FnMut()) -> Option<f64> {
    f();
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut rounds = 0;
    while start.elapsed() < min_time || rounds < 5 {
        let t0 = thread_cpu_time()?;
        for _ in 0..reps {
            f();
        }
        best = best.min((thread_cpu_time()? - t0) / reps as f64);
        rounds += 1;
    }
    Some(best)
}

/// Best time (seconds) of each closure, measured interleaved (A, B, C, A, B, C, …) for at least
/// `min_time`, so that load from other processes hits all variants alike; the minimum filters it out.
fn best_of(min_time: Duration, fs: &mut [&mut dyn FnMut()]) -> Vec<f64> {
    best_of_bursts(min_time, 1, fs)
}

/// [`best_of`] with each closure called `burst` times in a row per round, each call timed: the
/// calls after the first meet the caches and the pool's workers as a model's next kernel does.
/// On the Zen 3 of 2026-12-07 a 2-thread GEMM of ~200 µs timed once per round, right after a
/// 4 ms peak probe, read 10–20 points of the peak below the same GEMM run back to back
/// (128×384·384×384: 75–82% against 93–95%); waking the pool's worker after the probe did not
/// close the gap, bursts did.
fn best_of_bursts(min_time: Duration, burst: usize, fs: &mut [&mut dyn FnMut()]) -> Vec<f64> {
    for f in fs.iter_mut() {
        f();
    }
    let mut best = vec![f64::INFINITY; fs.len()];
    let start = Instant::now();
    let mut rounds = 0;
    while start.elapsed() < min_time || rounds < 5 {
        for (i, f) in fs.iter_mut().enumerate() {
            for _ in 0..burst {
                let t0 = Instant::now();
                f();
                best[i] = best[i].min(t0.elapsed().as_secs_f64());
            }
        }
        rounds += 1;
    }
    best
}

#[allow(clippy::too_many_arguments)]
fn gemm_runner<'a>(
    m: usize,
    k: usize,
    n: usize,
    a: &'a [f32],
    pb: &'a PackedB,
    epi: EpilogueRef<'a>,
    pool: Option<&'a ThreadPool>,
    isa: Isa,
    split: Split,
) -> impl FnMut() + 'a {
    let mut c = vec![0.0f32; m * n];
    let mut scratch = vec![0.0f32; gemm_scratch_len(m, n, k, 2)];
    move || {
        gemm_split(
            m,
            k,
            n,
            a,
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
    }
}

/// [`gemm_runner`] for the integer GEMM (B packed in either layout) with the tiles `tiles` allows.
#[allow(clippy::too_many_arguments)]
fn gemm_i16_runner<'a>(
    m: usize,
    k: usize,
    n: usize,
    a: &'a [f32],
    pb16: &'a [u8],
    pool: Option<&'a ThreadPool>,
    isa: Isa,
    tiles: IntTiles,
) -> impl FnMut() + 'a {
    let mut c = vec![0.0f32; m * n];
    let mut scratch = vec![0.0f32; kiln_kernels::gemm::gemm_i16_scratch_len(m, k, 2)];
    move || {
        kiln_kernels::gemm::gemm_i16_variant(m, k, n, a, k, pb16, &mut c, n, false, &EpilogueRef::default(), &mut scratch, pool, isa, tiles)
            .expect("gemm_i16");
        black_box(&c);
    }
}

fn attention_runner<'a>(
    batch: usize,
    dims: AttnDims,
    h: usize,
    qkv: &'a [f32],
    mask: &'a [f32],
    pool: Option<&'a ThreadPool>,
    isa: Isa,
) -> impl FnMut() + 'a {
    let (s, d) = (dims.seq_q, dims.head_dim);
    let hd = h * d;
    let mut out = vec![0.0f32; batch * s * hd];
    let mut scratch = vec![0.0f32; attention_batched_scratch_len(dims, 2)];
    move || {
        let op = |off: usize| HeadsRef {
            data: &qkv[off..],
            batch_stride: s * 3 * hd,
            head_stride: d,
            row_stride: 3 * hd,
        };
        attention_batched(
            batch,
            h,
            dims,
            op(0),
            op(hd),
            op(2 * hd),
            Some(HeadsRef {
                data: mask,
                batch_stride: s,
                head_stride: 0,
                row_stride: 0,
            }),
            HeadsMut {
                data: &mut out,
                batch_stride: s * hd,
                head_stride: d,
                row_stride: hd,
            },
            1.0 / (d as f32).sqrt(),
            &mut scratch,
            pool,
            isa,
        )
        .expect("attention");
        black_box(&out);
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let min_time = Duration::from_millis(if quick { 300 } else { 1500 });
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let isa = detect_isa();
    println!("ISA: {isa:?}, cores: {cores}");

    let peak1 = fma_peak(1);
    let peak2 = fma_peak(2);
    println!(
        "FMA peak (register-only vfmadd231ps {}, 12 chains): 1 thread {peak1:.1} GFLOP/s, 2 threads {peak2:.1} GFLOP/s",
        kiln_kernels::peak::fma_register()
    );

    // `SHAPES="m,k,n;m,k,n"` replaces MiniLM's shapes (e.g. a ResNet's convolutions as GEMMs).
    let custom: Vec<(usize, usize, usize)> = std::env::var("SHAPES")
        .unwrap_or_default()
        .split(';')
        .filter_map(|t| {
            let v: Vec<usize> = t.split(',').filter_map(|x| x.trim().parse().ok()).collect();
            (v.len() == 3).then(|| (v[0], v[1], v[2]))
        })
        .collect();
    let minilm = [(128, 384, 384), (128, 384, 1536), (128, 1536, 384), (1024, 384, 1536)];
    let shapes: &[(usize, usize, usize)] = if custom.is_empty() { &minilm } else { &custom };
    // `EPI=bias` times a bias alone in place of bias+GELU (what the activation adds to the bias).
    let bias_only = std::env::var("EPI").is_ok_and(|e| e == "bias");
    let epi_label = if bias_only { "bias" } else { "bias+gelu" };
    let pool2 = ThreadPool::new(2);
    println!();
    println!("GEMM C[m×n] = A[m×k]·B[k×n] (B packed once), best of interleaved bursts of 3 runs, % of the FMA");
    println!("peak read in the same rounds (a probe of that many threads between the GEMMs):");
    let mut window: Vec<(f64, f64)> = Vec::new();
    println!(
        "{:>20} {:>10} {:>9} {:>7} {:>9} {:>7}",
        "m×k·k×n", "epilogue", "1T GF/s", "%peak", "2T GF/s", "%peak"
    );
    for &(m, k, n) in shapes {
        let a = rand_vec(m * k, 1);
        let w = rand_vec(n * k, 2); // [n, k] like a PyTorch Linear weight
        let bias = rand_vec(n, 3);
        let pb = pack_b(&w, k, n, k, true).expect("pack");
        let flops = 2.0 * (m * n * k) as f64;
        let gelu = EpilogueRef {
            bias: Some(&bias),
            activation: if bias_only { Activation::None } else { Activation::GeluErf },
            ..Default::default()
        };
        let plain = EpilogueRef::default();
        let mk = |epi, pool| gemm_runner(m, k, n, &a, &pb, epi, pool, isa, Split::Auto);
        let (mut p1, mut g1, mut p2, mut g2) = (
            mk(plain, None),
            mk(gelu, None),
            mk(plain, Some(&pool2)),
            mk(gelu, Some(&pool2)),
        );
        // One-thread and two-thread variants are interleaved apart: between two-thread runs the
        // pool's worker stays awake, as it does between the kernels of a model; after a
        // one-thread run it has parked, and waking it (~50-100 µs on a VM) would be charged to a
        // GEMM of ~200 µs.
        // A peak probe in each round: the share of the peak compares rates of the same seconds.
        let (mut w1, mut w2) = (0f64, 0f64);
        let t1 = best_of_bursts(min_time, 3, &mut [&mut p1, &mut g1, &mut probe(1, &mut w1)]);
        let t2 = best_of_bursts(min_time, 3, &mut [&mut p2, &mut g2, &mut probe(2, &mut w2)]);
        window.push((w1, w2));
        let (peak1, peak2) = (w1, w2);
        let t = [t1[0], t1[1], t2[0], t2[1]];
        for (label, t1, t2) in [("none", t[0], t[2]), (epi_label, t[1], t[3])] {
            let (f1, f2) = (flops / t1 / 1e9, flops / t2 / 1e9);
            println!(
                "{:>20} {:>10} {:>9.1} {:>6.1}% {:>9.1} {:>6.1}%",
                format!("{m}×{k}·{k}×{n}"),
                label,
                f1,
                100.0 * f1 / peak1,
                f2,
                100.0 * f2 / peak2
            );
        }
    }

    let range = |f: fn(&(f64, f64)) -> f64| window.iter().map(f).fold((f64::INFINITY, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let ((l1, h1), (l2, h2)) = (range(|w| w.0), range(|w| w.1));
    println!("(the peak read beside those runs: 1 thread {l1:.1}–{h1:.1}, 2 threads {l2:.1}–{h2:.1} GFLOP/s)");
    if std::env::var("ONLY").is_ok_and(|o| o == "shapes") {
        return;
    }

    // In a model each GEMM meets its weights (and often its input) cold: the next layer's B was
    // last touched a whole forward pass ago. Cycling through enough copies of the operands to
    // overflow the caches shows what that costs against the hot loop above.
    println!();
    println!("2 threads, operands hot (one copy) vs cold (copies cycled, 256 MiB in all):");
    let cold_what = std::env::var("COLD").unwrap_or_default();
    println!("{:>20} {:>10} {:>9} {:>9}", "m×k·k×n", "epilogue", "hot GF/s", "cold GF/s");
    for &(m, k, n) in shapes {
        let flops = 2.0 * (m * n * k) as f64;
        let bytes = 4 * (m * k + k * n + m * n);
        let copies = ((256usize << 20) / bytes).max(2);
        let ops: Vec<(Vec<f32>, PackedB, Vec<f32>)> = (0..copies)
            .map(|i| {
                let w = rand_vec(n * k, 2 + i as u64);
                (rand_vec(m * k, 1 + i as u64), pack_b(&w, k, n, k, true).expect("pack"), rand_vec(n, 3))
            })
            .collect();
        for gelu in [false, true] {
            let mut scratch = vec![0.0f32; gemm_scratch_len(m, n, k, 2)];
            let mut cs: Vec<Vec<f32>> = (0..copies).map(|_| vec![0.0f32; m * n]).collect();
            let mut i = 0;
            let one = |which: usize, scratch: &mut [f32], cs: &mut [Vec<f32>]| {
                let (wa, wb, wc) = match cold_what.as_str() {
                    "b" => (0, which, 0),
                    "a" => (which, 0, 0),
                    "c" => (0, 0, which),
                    _ => (which, which, which),
                };
                let (a, _, bias) = &ops[wa];
                let pb = &ops[wb].1;
                let which = wc;
                let epi = EpilogueRef {
                    bias: gelu.then_some(&bias[..]),
                    activation: if gelu { Activation::GeluErf } else { Activation::None },
                    ..Default::default()
                };
                gemm_split(m, k, n, a, k, pb.as_slice(), &mut cs[which], n, false, &epi, scratch, Some(&pool2), isa, Split::Auto)
                    .expect("gemm");
            };
            let mut hot = || one(0, &mut scratch, &mut cs);
            let th = best_of(min_time, &mut [&mut hot])[0];
            let mut cold = || {
                i = (i + 1) % copies;
                one(i, &mut scratch, &mut cs);
            };
            let tc = best_of(min_time, &mut [&mut cold])[0];
            println!(
                "{:>20} {:>10} {:>9.1} {:>9.1}",
                format!("{m}×{k}·{k}×{n}"),
                if gelu { "bias+gelu" } else { "none" },
                flops / th / 1e9,
                flops / tc / 1e9
            );
        }
    }

    // The two ways to cut a GEMM over 2 threads, interleaved (Auto picks rows once every thread
    // gets 4 strips of A rows).
    println!();
    println!("2-thread split, no epilogue, best of interleaved bursts of 3 runs (% of the 2-thread peak read in the same rounds):");
    println!("{:>20} {:>12} {:>12}", "m×k·k×n", "B panels", "A rows");
    for &(m, k, n) in shapes {
        let a = rand_vec(m * k, 1);
        let w = rand_vec(n * k, 2);
        let pb = pack_b(&w, k, n, k, true).expect("pack");
        let flops = 2.0 * (m * n * k) as f64;
        let plain = EpilogueRef::default();
        let mut by_panels = gemm_runner(m, k, n, &a, &pb, plain, Some(&pool2), isa, Split::Panels);
        let mut by_rows = gemm_runner(m, k, n, &a, &pb, plain, Some(&pool2), isa, Split::Rows);
        let mut w2 = 0f64;
        let t = best_of_bursts(min_time, 3, &mut [&mut by_panels, &mut by_rows, &mut probe(2, &mut w2)]);
        let pc = |t: f64| 100.0 * flops / t / 1e9 / w2;
        println!("{:>20} {:>11.1}% {:>11.1}%", format!("{m}×{k}·{k}×{n}"), pc(t[0]), pc(t[1]));
    }

    // The integer GEMM (quantized models' MatMulInteger): the same shapes over a quantized
    // activation's integers (256 consecutive values, [-127, 128]) × [-127, 127] against the f32
    // GEMM of the same values, 1 and 2 threads: B as i16 pairs (with VNNI where the machine has
    // it, and without: `vpmaddwd` + `vpaddd`) and as byte quads (`vpdpbusd`, where the machine
    // has AVX512-VNNI), and the byte quads on AMX's tiles where the process has AMX-INT8 ("amx",
    // else "-"); GOP/s counts a multiply and an add per product, as GFLOP/s does.
    println!();
    let quads = int_layout_for(&[0.0], 1, 1, 1, 1) == IntLayout::S8Quads;
    let amx = quads && amx_available();
    println!(
        "integer GEMM (exact), best of interleaved runs, GOP/s and × the f32 GEMM{}:",
        if quads { "" } else { " (no byte-quad tile on this machine)" }
    );
    println!(
        "{:>20} {:>8} {:>8} {:>6} {:>8} {:>6} {:>8} {:>6} {:>8} {:>8} {:>6} {:>8} {:>6} {:>8} {:>6} {:>8} {:>6}",
        "m×k·k×n", "1T f32", "1T i16", "×", "1T u8", "×", "1T amx", "×", "2T f32", "2T i16", "×", "2T madd", "×", "2T u8", "×", "2T amx", "×"
    );
    for &(m, k, n) in shapes {
        let ints = |len: usize, seed: u64, r: f32| rand_vec(len, seed).iter().map(|x| (x * 2.0 * r).round()).collect::<Vec<f32>>();
        let a = ints(m * k, 1, 127.5);
        let w = ints(n * k, 2, 127.0);
        let pb = pack_b(&w, k, n, k, true).expect("pack");
        let pack = |layout| {
            let mut p = vec![0u8; packed_b_int_bytes(k, n, layout)];
            pack_b_int_into(&w, k, n, 1, k, 127, layout, &mut p).expect("pack integers");
            p
        };
        let (pb16, pb8) = (pack(IntLayout::I16Pairs), pack(IntLayout::S8Quads));
        let flops = 2.0 * (m * n * k) as f64;
        // Each row: the f32 GEMM first, then the integer variants this machine has.
        let row = |pool: Option<&ThreadPool>, madd: bool| -> Vec<Option<f64>> {
            let mut f = gemm_runner(m, k, n, &a, &pb, EpilogueRef::default(), pool, isa, Split::Auto);
            let mut v = gemm_i16_runner(m, k, n, &a, &pb16, pool, isa, IntTiles::Best);
            let mut p = gemm_i16_runner(m, k, n, &a, &pb16, pool, isa, IntTiles::NoVnni);
            let mut u = gemm_i16_runner(m, k, n, &a, &pb8, pool, isa, IntTiles::NoAmx);
            let mut x = gemm_i16_runner(m, k, n, &a, &pb8, pool, isa, IntTiles::Best);
            let mut fs: Vec<(bool, &mut dyn FnMut())> = vec![(true, &mut f), (true, &mut v), (madd, &mut p), (quads, &mut u), (amx, &mut x)];
            let mut on: Vec<&mut dyn FnMut()> = Vec::new();
            let shown: Vec<bool> = fs.iter().map(|(s, _)| *s).collect();
            for (s, f) in fs.iter_mut() {
                if *s {
                    on.push(&mut **f);
                }
            }
            let mut t = best_of(min_time, &mut on).into_iter();
            shown.iter().map(|&s| if s { t.next() } else { None }).collect()
        };
        let (t1, t2) = (row(None, false), row(Some(&pool2), true));
        let cols = |t: &[Option<f64>], skip_madd: bool| -> String {
            let f = t[0].unwrap_or(f64::NAN);
            let mut out = format!("{:>8.1}", flops / f / 1e9);
            for (i, ti) in t.iter().enumerate().skip(1) {
                if skip_madd && i == 2 {
                    continue;
                }
                match ti {
                    Some(ti) => out += &format!(" {:>8.1} {:>5.2}×", flops / ti / 1e9, f / ti),
                    None => out += &format!(" {:>8} {:>6}", "-", "-"),
                }
            }
            out
        };
        println!("{:>20} {} {}", format!("{m}×{k}·{k}×{n}"), cols(&t1, true), cols(&t2, false));
    }

    println!();
    let n_math: usize = std::env::var("MATH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4096);
    println!("Vector math ({n_math} floats, in place), 1 thread:");
    let mut x = rand_vec(n_math, 5);
    for v in x.iter_mut() {
        *v *= 8.0;
    }
    for f in [
        Unary::Exp,
        Unary::Erf,
        Unary::Act(Activation::Tanh),
        Unary::Act(Activation::GeluErf),
        Unary::Act(Activation::GeluTanh),
        Unary::Act(Activation::Silu),
    ] {
        let mut y = x.clone();
        let mut run = || {
            math::map(f, &x, &mut y).expect("map");
            black_box(&y);
        };
        let t = best_cpu(min_time / 4, 20, &mut run)
            .unwrap_or_else(|| best_of(min_time / 4, &mut [&mut run])[0]);
        println!(
            "{:>24}: {:.2} ns/element",
            format!("{f:?}"),
            t * 1e9 / x.len() as f64
        );
    }

    println!();
    println!(
        "Fused attention, MiniLM layer (batch 1 and 8, 12 heads, seq 128, head dim 32, key mask):"
    );
    for batch in [1usize, 8] {
        let (h, s, d) = (12usize, 128usize, 32usize);
        let hd = h * d;
        let qkv = rand_vec(batch * s * 3 * hd, 7);
        let mask = vec![0.0f32; batch * s];
        let dims = AttnDims {
            seq_q: s,
            seq_k: s,
            head_dim: d,
            head_dim_v: d,
        };
        let flops = (batch * h) as f64 * 4.0 * (s * s * d) as f64;
        let mk = |pool| attention_runner(batch, dims, h, &qkv, &mask, pool, isa);
        let (mut a1, mut a2) = (mk(None), mk(Some(&pool2)));
        // Apart, as the GEMMs above: interleaved with one-thread runs the pool's worker parks.
        let t = [best_of(min_time / 2, &mut [&mut a1])[0], best_of(min_time / 2, &mut [&mut a2])[0]];
        println!(
            "  batch {batch}: 1T {:.1} µs ({:.1} GF/s), 2T {:.1} µs ({:.1} GF/s)",
            t[0] * 1e6,
            flops / t[0] / 1e9,
            t[1] * 1e6,
            flops / t[1] / 1e9
        );
    }
}
