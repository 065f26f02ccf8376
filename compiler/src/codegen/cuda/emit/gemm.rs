//! GEMM: SIMT tiles through shared memory (or tensor-core `mma` where the target has them), the
//! epilogue fused.

use super::*;

#[allow(clippy::too_many_arguments)]
pub(super) fn emit_gemm(
    ctx: &Ctx,
    target: &CudaTarget,
    batch: &[usize],
    m: usize,
    n: usize,
    kd: usize,
    alpha: f32,
    epilogue: Option<&Expr>,
) -> Result<Body> {
    let k = ctx.kernel;
    if k.inputs.len() < 2 {
        return Err(Error::internal("cuda emit", format!("gemm `{}` has {} inputs", k.name, k.inputs.len())));
    }
    let bshape = |tail: [usize; 2]| -> Vec<usize> { batch.iter().copied().chain(tail).collect() };
    ctx.check_shape("A", &k.inputs[0], &bshape([m, kd]))?;
    ctx.check_shape("B", &k.inputs[1], &bshape([kd, n]))?;
    ctx.check_shape("output", &k.output, &bshape([m, n]))?;
    for j in 2..k.inputs.len() {
        ctx.check_shape(&format!("epilogue input {j}"), &k.inputs[j], &bshape([m, n]))?;
    }
    if let Some(e) = epilogue {
        if e.loads().iter().any(|&j| j < 2 || j >= k.inputs.len()) {
            return Err(ctx.err("the epilogue loads A, B or a missing input"));
        }
    }
    let nbatch: usize = batch.iter().product();
    if nbatch > 65535 {
        return Err(ctx.err(format!("a batch of {nbatch} GEMMs (grid z is at most 65535)")));
    }
    let (adt, bdt) = (ctx.dtype(k.inputs[0].buffer), ctx.dtype(k.inputs[1].buffer));
    if !adt.is_float() || !bdt.is_float() {
        return Err(ctx.err(format!("a GEMM of {adt} x {bdt}")));
    }
    let mma = adt == bdt && matches!(adt, DType::F16 | DType::BF16) && target.has_mma_m16n8k16();

    // Batch coordinates and per-operand bases.
    let (zcode, znames) = coords_code("    ", "blockIdx.z", batch, "z");
    let mut views: Vec<(String, &BufferView)> = vec![("a_base".into(), &k.inputs[0]), ("b_base".into(), &k.inputs[1])];
    for j in 2..k.inputs.len() {
        views.push((format!("e{j}_base"), &k.inputs[j]));
    }
    views.push(("o_base".into(), &k.output));
    let vrefs: Vec<(&str, &BufferView)> = views.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    let (bcode, tails) = batch_code(ctx, batch, &znames, &vrefs)?;
    let batch_block = format!("{zcode}{bcode}");
    let (at, bt) = (&tails[0], &tails[1]);
    let a_kcontig = at.strides[1] == 1 || at.shape[1] == 1;
    let b_ncontig = bt.strides[1] == 1 || bt.shape[1] == 1;
    let sv = |s: &[String]| s.to_vec();
    let a_idx = ctx.tail_index("a_base", at, &sv(&["gm".into(), "gk".into()]));
    let b_idx = ctx.tail_index("b_base", bt, &sv(&["gk".into(), "gn".into()]));

    // The epilogue, per output element (gi, gj).
    let ij = sv(&["gi".into(), "gj".into()]);
    let ind = if mma { "                    " } else { "                " };
    let mut epi = String::new();
    let vroot = match epilogue {
        Some(e) => {
            let mut load = |j: usize| -> Result<String> {
                Ok(ctx.load_f32(k.inputs[j].buffer, &ctx.tail_index(&format!("e{j}_base"), &tails[j], &ij)))
            };
            let (code, root) = expr_code(e, "e", ind, &mut load, Some("kiln_acc"))?;
            epi.push_str(&code);
            root
        }
        None => "kiln_acc".to_string(),
    };
    let otail = tails.last().expect("output tail");
    let _ = write!(epi, "{ind}{}", ctx.store_f32(k.output.buffer, &ctx.tail_index("o_base", otail, &ij), &vroot));

    if mma {
        let dt = if adt == DType::F16 { "f16" } else { "bf16" };
        let (a_mm, a_kk) = if a_kcontig { ("e / 32u", "e % 32u") } else { ("e % 64u", "e / 64u") };
        let (b_kk, b_nn) = if b_ncontig { ("e / 64u", "e % 64u") } else { ("e % 32u", "e / 32u") };
        let grid = [n.div_ceil(64) as u32, m.div_ceil(64) as u32, nbatch.max(1) as u32];
        if grid[1] > 65535 {
            return Err(ctx.err(format!("m = {m} needs {} row blocks (at most 65535)", grid[1])));
        }
        let source = specialize(
            "gemm_mma.cuh",
            template::GEMM_MMA,
            &[
                ("NAME", ctx.name.clone()),
                ("PARAMS", ctx.param_list()),
                ("DT", dt.to_string()),
                ("BATCH", batch_block.trim_end().to_string()),
                ("M", m.to_string()),
                ("N", n.to_string()),
                ("K", kd.to_string()),
                ("A_MM", a_mm.into()),
                ("A_KK", a_kk.into()),
                ("B_KK", b_kk.into()),
                ("B_NN", b_nn.into()),
                ("A_LOAD", format!("{}[{a_idx}]", ctx.p(k.inputs[0].buffer))),
                ("B_LOAD", format!("{}[{b_idx}]", ctx.p(k.inputs[1].buffer))),
                ("ALPHA", f32_lit(alpha)),
                ("EPILOGUE", epi),
            ],
        )?;
        return Ok(Body { kind: format!("gemm/mma_{dt}"), source, grid, block: [128, 1, 1] });
    }

    let tile = target.gemm_tile.unwrap_or_else(|| GemmTile::pick(nbatch, m, n));
    let (bm, bn, tm, tn) = (tile.bm, tile.bn, tile.tm, tile.tn);
    let bk = 16usize;
    let tx = bn / tn;
    let threads = tile.threads();
    let (a_per, b_per) = (bm * bk / threads, bk * bn / threads);
    let (a_mm, a_kk) = if a_kcontig { (format!("e / {bk}u"), format!("e % {bk}u")) } else { (format!("e % {bm}u"), format!("e / {bm}u")) };
    let (b_kk, b_nn) = if b_ncontig { (format!("e / {bn}u"), format!("e % {bn}u")) } else { (format!("e % {bk}u"), format!("e / {bk}u")) };
    // Vector shared-memory loads of each thread's TM rows of A and TN columns of B.
    if tile.split && (tm % 4 != 0 || tn % 4 != 0) {
        return Err(ctx.err(format!("split GEMM tile {tile:?}: tm and tn must be multiples of 4")));
    }
    // Where a thread's `t` rows (or columns) of the block tile start: adjacent, or in groups of
    // 4 spread `span*4/t` apart (`split`). Returns the vector loads of them from shared memory
    // and the index expression of element `v` (the epilogue's loop variable).
    let frag = |arr: &str, dst: &str, idx: &str, t: usize, span: usize, v: &str| -> (String, String) {
        let mut f = String::new();
        if tile.split {
            let gap = span * 4 / t;
            for g in 0..t / 4 {
                let off = if g == 0 { String::new() } else { format!(" + {}u", g * gap) };
                let d = if g == 0 { dst.to_string() } else { format!("{dst} + {}", 4 * g) };
                let _ = writeln!(f, "            kiln_ld4(&{arr}[kk][{idx} * 4u{off}], {d});");
            }
            return (f, format!("{idx} * 4u + (unsigned)({v} % 4) + (unsigned)({v} / 4) * {gap}u"));
        }
        let mut o = 0;
        while o < t {
            let w = if t - o >= 4 { 4 } else { 2 };
            let off = if o == 0 { String::new() } else { format!(" + {o}u") };
            let d = if o == 0 { dst.to_string() } else { format!("{dst} + {o}") };
            let _ = writeln!(f, "            kiln_ld{w}(&{arr}[kk][{idx} * {t}u{off}], {d});");
            o += w;
        }
        (f, format!("{idx} * {t}u + (unsigned){v}"))
    };
    let (fa, row_of) = frag("As", "a", "ty", tm, bm, "r");
    let (fb, col_of) = frag("Bs", "b", "tx", tn, bn, "c");
    let frags = format!("{fa}{fb}");
    let lds = tm.div_ceil(4) + tn.div_ceil(4);
    let grid = [n.div_ceil(bn) as u32, m.div_ceil(bm) as u32, nbatch.max(1) as u32];
    if grid[1] > 65535 {
        return Err(ctx.err(format!("m = {m} needs {} row blocks (at most 65535)", grid[1])));
    }
    let source = specialize(
        "gemm_simt.cuh",
        template::GEMM_SIMT,
        &[
            ("NAME", ctx.name.clone()),
            ("PARAMS", ctx.param_list()),
            ("THREADS", threads.to_string()),
            ("BM", bm.to_string()),
            ("BN", bn.to_string()),
            ("BK", bk.to_string()),
            ("TM", tm.to_string()),
            ("TN", tn.to_string()),
            ("TX", tx.to_string()),
            ("PREFETCH", if tile.prefetch { "true" } else { "false" }.to_string()),
            ("ROW", row_of),
            ("COL", col_of),
            ("LDS", lds.to_string()),
            ("FRAGS", frags.trim_end().to_string()),
            ("BATCH", batch_block.trim_end().to_string()),
            ("M", m.to_string()),
            ("N", n.to_string()),
            ("K", kd.to_string()),
            ("A_PER", a_per.to_string()),
            ("B_PER", b_per.to_string()),
            ("A_MM", a_mm),
            ("A_KK", a_kk),
            ("B_KK", b_kk),
            ("B_NN", b_nn),
            ("A_LOAD", ctx.load_f32(k.inputs[0].buffer, &a_idx)),
            ("B_LOAD", ctx.load_f32(k.inputs[1].buffer, &b_idx)),
            ("ALPHA", f32_lit(alpha)),
            ("EPILOGUE", epi),
        ],
    )?;
    let pf = if tile.prefetch { "" } else { "_noprefetch" };
    let sp = if tile.split { "_split" } else { "" };
    Ok(Body { kind: format!("gemm/simt_{bm}x{bn}{sp}{pf}"), source, grid, block: [threads as u32, 1, 1] })
}
