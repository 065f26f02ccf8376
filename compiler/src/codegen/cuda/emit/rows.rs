//! One block per row: LayerNorm/RMSNorm and softmax (with their fused prologues), and reductions.

use super::*;

pub(super) enum RowKind {
    Norm { kind: NormKind, eps: f32, gamma: usize, beta: Option<usize> },
    Softmax,
}

pub(super) fn emit_row(ctx: &Ctx, kind: RowKind, prologue: &Expr) -> Result<Body> {
    let k = ctx.kernel;
    let shape = k.output.shape.clone();
    let cols = *shape.last().ok_or_else(|| ctx.err("a row kernel of a scalar"))?;
    let lead = shape.len() - 1;
    let rows: usize = shape[..lead].iter().product();
    let (group, threads, rows_per_block) = if cols <= 1024 { (32usize, 128usize, 4usize) } else { (256, 256, 1) };
    let per = cols.div_ceil(group);
    if per > 32 {
        return Err(ctx.err(format!("rows of {cols} elements (at most 8192)")));
    }
    let (row, lane) = if group == 32 {
        ("blockIdx.x * 4u + (threadIdx.x >> 5)".to_string(), "threadIdx.x & 31u".to_string())
    } else {
        ("blockIdx.x".to_string(), "threadIdx.x".to_string())
    };
    let (rc, rnames) = coords_code("    ", "row", &shape[..lead], "r");
    let mut row_coords = rc;
    // Row bases of every input the prologue loads and of the output.
    let mut tails: Vec<Option<BufferView>> = vec![None; k.inputs.len()];
    let param_inputs: Vec<usize> = match &kind {
        RowKind::Norm { gamma, beta, .. } => std::iter::once(*gamma).chain(*beta).collect(),
        RowKind::Softmax => vec![],
    };
    for j in prologue.loads() {
        let t = k.inputs.get(j).ok_or_else(|| ctx.err(format!("prologue loads input {j}")))?;
        if param_inputs.contains(&j) {
            return Err(ctx.err(format!("prologue loads the scale/shift input {j}")));
        }
        ctx.check_shape(&format!("input {j}"), t, &shape)?;
        let (base, tail) = ctx.split_index(t, lead, &rnames)?;
        let _ = writeln!(row_coords, "    const {} rb{j} = {base};", ctx.idx.ty());
        tails[j] = Some(tail);
    }
    let (obase, otail) = ctx.split_index(&k.output, lead, &rnames)?;
    let _ = writeln!(row_coords, "    const {} ob = {obase};", ctx.idx.ty());
    let col = vec!["col".to_string()];
    let mut load = |j: usize| -> Result<String> {
        let t = k.inputs[j].buffer;
        Ok(ctx.load_f32(t, &ctx.tail_index(&format!("rb{j}"), tails[j].as_ref().expect("loaded input"), &col)))
    };
    let (pcode, proot) = expr_code(prologue, "e", "            ", &mut load, None)?;
    let prologue_code = format!("{pcode}            v = {proot};");
    // Group reductions: a warp's shuffles, or the whole block's (through `kiln_red`).
    let (sum, max) = ("sum", "max");
    let red = |f: &str, v: &str| -> String {
        if group == 32 {
            format!("kiln_warp_{f}({v})")
        } else {
            format!("kiln_block_{f}({v}, kiln_red)")
        }
    };
    let loop_valid = |body: &str| -> String {
        format!(
            "#pragma unroll\n    for (int u = 0; u < {per}; ++u) {{\n        const unsigned col = t + (unsigned)u * {group}u;\n        if (col < {cols}u) {{ {body} }}\n    }}\n"
        )
    };
    let out_idx = ctx.tail_index("ob", &otail, &col);
    let param_load = |j: usize| -> Result<String> {
        let t = k.inputs.get(j).ok_or_else(|| ctx.err(format!("no input {j}")))?;
        ctx.check_shape(&format!("scale/shift input {j}"), t, &[cols])?;
        Ok(ctx.load_f32(t.buffer, &ctx.index(t, &col)?))
    };
    let cols_f = f32_lit(cols as f32);
    let (math, store, pad, kind_name) = match kind {
        RowKind::Norm { kind: nk, eps, gamma, beta } => {
            let eps = f32_lit(eps);
            let mut math = String::new();
            let y = match nk {
                NormKind::LayerNorm => {
                    let _ = writeln!(math, "    float s = 0.0f;\n#pragma unroll\n    for (int u = 0; u < {per}; ++u) s += x[u];");
                    let _ = writeln!(math, "    const float mean = {} / {cols_f};", red(sum, "s"));
                    let _ = write!(math, "    float q = 0.0f;\n{}", loop_valid("const float d = x[u] - mean; q = fmaf(d, d, q);"));
                    let _ = writeln!(math, "    const float rstd = 1.0f / sqrtf({} / {cols_f} + {eps});", red(sum, "q"));
                    let beta = match beta {
                        Some(b) => format!(" + {}", param_load(b)?),
                        None => String::new(),
                    };
                    format!("(x[u] - mean) * rstd * {}{beta}", param_load(gamma)?)
                }
                NormKind::RmsNorm => {
                    let _ = writeln!(math, "    float q = 0.0f;\n#pragma unroll\n    for (int u = 0; u < {per}; ++u) q = fmaf(x[u], x[u], q);");
                    let _ = writeln!(math, "    const float rstd = 1.0f / sqrtf({} / {cols_f} + {eps});", red(sum, "q"));
                    format!("x[u] * rstd * {}", param_load(gamma)?)
                }
            };
            let store = format!("            const float y = {y};\n            {}", ctx.store_f32(k.output.buffer, &out_idx, "y"));
            let name = if nk == NormKind::LayerNorm { "layer_norm" } else { "rms_norm" };
            (math, store, "0.0f".to_string(), name)
        }
        RowKind::Softmax => {
            let mut math = String::new();
            let _ = writeln!(math, "    float m = -KILN_INF;\n#pragma unroll\n    for (int u = 0; u < {per}; ++u) m = kiln_max(m, x[u]);");
            let _ = writeln!(math, "    m = {};", red(max, "m"));
            let _ = write!(math, "    float s = 0.0f;\n{}", loop_valid("x[u] = expf(x[u] - m); s += x[u];"));
            let _ = writeln!(math, "    s = {};", red(sum, "s"));
            let store = format!("            {}", ctx.store_f32(k.output.buffer, &out_idx, "x[u] / s"));
            (math, store, "-KILN_INF".to_string(), "softmax")
        }
    };
    let source = specialize(
        "rownorm.cuh",
        template::ROWNORM,
        &[
            ("NAME", ctx.name.clone()),
            ("PARAMS", ctx.param_list()),
            ("THREADS", threads.to_string()),
            ("ROW", row),
            ("LANE", lane),
            ("ROWS", rows.to_string()),
            ("ROW_COORDS", row_coords.trim_end().to_string()),
            ("PER", per.to_string()),
            ("GROUP", group.to_string()),
            ("PAD", pad),
            ("COLS", cols.to_string()),
            ("PROLOGUE", prologue_code),
            ("MATH", math.trim_end().to_string()),
            ("STORE", store),
        ],
    )?;
    let variant = if group == 32 { "warp" } else { "block" };
    Ok(Body {
        kind: format!("{kind_name}/{variant}"),
        source,
        grid: grid_1d(ctx, rows as u64, rows_per_block as u64)?,
        block: [threads as u32, 1, 1],
    })
}

pub(super) fn emit_reduce(ctx: &Ctx, op: ReduceOp, shape: &[usize], reduced: usize, prologue: &Expr) -> Result<Body> {
    let k = ctx.kernel;
    if reduced > shape.len() {
        return Err(Error::internal("cuda emit", format!("reduce `{}` of {reduced} dims of {shape:?}", k.name)));
    }
    let lead = shape.len() - reduced;
    let outer: usize = shape[..lead].iter().product();
    let inner: usize = shape[lead..].iter().product();
    ctx.check_shape("output", &k.output, &shape[..lead])?;
    let (oc, onames) = coords_code("    ", "o", &shape[..lead], "oc");
    let mut outer_code = oc;
    let (ic, inames) = coords_code("        ", "r", &shape[lead..], "ic");
    let mut tails: Vec<Option<BufferView>> = vec![None; k.inputs.len()];
    for j in prologue.loads() {
        let t = k.inputs.get(j).ok_or_else(|| ctx.err(format!("prologue loads input {j}")))?;
        ctx.check_shape(&format!("input {j}"), t, shape)?;
        let (base, tail) = ctx.split_index(t, lead, &onames)?;
        let _ = writeln!(outer_code, "    const {} rb{j} = {base};", ctx.idx.ty());
        tails[j] = Some(tail);
    }
    let mut load = |j: usize| -> Result<String> {
        let t = k.inputs[j].buffer;
        Ok(ctx.load_f32(t, &ctx.tail_index(&format!("rb{j}"), tails[j].as_ref().expect("loaded input"), &inames)))
    };
    let (pcode, proot) = expr_code(prologue, "e", "        ", &mut load, None)?;
    let (init, combine, warp) = match op {
        ReduceOp::Sum | ReduceOp::Mean => ("0.0f", format!("acc + {proot}"), "kiln_warp_sum"),
        ReduceOp::Max => ("-KILN_INF", format!("kiln_max(acc, {proot})"), "kiln_warp_max"),
    };
    let finish = match op {
        ReduceOp::Mean => format!("acc / {}", f32_lit(inner as f32)),
        _ => "acc".into(),
    };
    let out_idx = ctx.index(&k.output, &onames)?;
    let source = specialize(
        "reduce.cuh",
        template::REDUCE,
        &[
            ("NAME", ctx.name.clone()),
            ("PARAMS", ctx.param_list()),
            ("OUTER", outer.to_string()),
            ("OUTER_COORDS", outer_code.trim_end().to_string()),
            ("INIT", init.to_string()),
            ("INNER", inner.to_string()),
            ("INNER_COORDS", ic.trim_end().to_string()),
            ("PROLOGUE", pcode.trim_end().to_string()),
            ("COMBINE", combine),
            ("WARP_REDUCE", warp.to_string()),
            ("FINISH", finish),
            ("STORE", format!("        {}", ctx.store_f32(k.output.buffer, &out_idx, "v"))),
        ],
    )?;
    Ok(Body { kind: "reduce".into(), source, grid: grid_1d(ctx, outer as u64, 8)?, block: [256, 1, 1] })
}
