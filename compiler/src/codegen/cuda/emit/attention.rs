//! Fused attention: a query tile per block, an online softmax over key tiles.

use super::*;

#[allow(clippy::too_many_arguments)]
pub(super) fn emit_attention(
    ctx: &Ctx,
    batch: &[usize],
    sq: usize,
    skv: usize,
    d: usize,
    dv: usize,
    scale: f32,
    mask: Option<usize>,
    zero_nan_rows: bool,
) -> Result<Body> {
    let k = ctx.kernel;
    let bshape = |tail: [usize; 2]| -> Vec<usize> { batch.iter().copied().chain(tail).collect() };
    if k.inputs.len() < 3 {
        return Err(Error::internal("cuda emit", format!("attention `{}` has {} inputs", k.name, k.inputs.len())));
    }
    ctx.check_shape("Q", &k.inputs[0], &bshape([sq, d]))?;
    ctx.check_shape("K", &k.inputs[1], &bshape([skv, d]))?;
    ctx.check_shape("V", &k.inputs[2], &bshape([skv, dv]))?;
    ctx.check_shape("output", &k.output, &bshape([sq, dv]))?;
    if d > 128 || dv > 128 || d == 0 || dv == 0 {
        return Err(ctx.err(format!("head dims {d}/{dv} (the fused kernel supports 1..=128)")));
    }
    let shared = (16 * d.next_multiple_of(4) + 32 * (d + 1) + 32 * (dv + 1) + 4 * 32) * 4;
    if shared > 48 * 1024 {
        return Err(ctx.err(format!("{shared} bytes of shared memory")));
    }
    let nbatch: usize = batch.iter().product::<usize>().max(1);
    if nbatch > 65535 {
        return Err(ctx.err(format!("{nbatch} attention problems (grid y is at most 65535)")));
    }
    let (zcode, znames) = coords_code("    ", "blockIdx.y", batch, "z");
    let mut views: Vec<(&str, &BufferView)> = vec![("q_base", &k.inputs[0]), ("k_base", &k.inputs[1]), ("v_base", &k.inputs[2])];
    if let Some(mi) = mask {
        let mv = k.inputs.get(mi).ok_or_else(|| ctx.err(format!("mask input {mi} missing")))?;
        ctx.check_shape("mask", mv, &bshape([sq, skv]))?;
        views.push(("m_base", mv));
    }
    views.push(("o_base", &k.output));
    let (bcode, tails) = batch_code(ctx, batch, &znames, &views)?;
    let s2 = |a: &str, b: &str| vec![a.to_string(), b.to_string()];
    let q_load = ctx.load_f32(k.inputs[0].buffer, &ctx.tail_index("q_base", &tails[0], &s2("qi", "d")));
    let k_load = ctx.load_f32(k.inputs[1].buffer, &ctx.tail_index("k_base", &tails[1], &s2("kj", "d")));
    let v_load = ctx.load_f32(k.inputs[2].buffer, &ctx.tail_index("v_base", &tails[2], &s2("kj", "d")));
    let mask_code = match mask {
        Some(mi) => format!(
            "                    s += {};",
            ctx.load_f32(k.inputs[mi].buffer, &ctx.tail_index("m_base", &tails[3], &s2("qi", "kj")))
        ),
        None => "                    (void)0;".to_string(),
    };
    // A row whose probabilities are NaN becomes Σ_j 0·V[j] (NaN only where V is not finite), as
    // the guard `Where(IsNaN(p), 0, p)` before P·V gives on the reference; so does a fully
    // masked row (sum 0), whose softmax is NaN there too.
    let nan_rows = if zero_nan_rows {
        format!(
            "        if (isnan(l_i[r]) || l_i[r] == 0.0f) {{\n            l_i[r] = 1.0f;\n#pragma unroll\n            for (int dd = 0; dd < {lanes}; ++dd) {{\n                const unsigned d = lane + 32u * (unsigned)dd;\n                float z = 0.0f;\n                if (d < {dv}u)\n                    for (unsigned kj = 0; kj < {skv}u; ++kj) z = fmaf(0.0f, {v_load}, z);\n                o[r][dd] = z;\n            }}\n        }}\n",
            lanes = dv.div_ceil(32)
        )
    } else {
        String::new()
    };
    let otail = tails.last().expect("output tail");
    let store = format!("                {}", ctx.store_f32(k.output.buffer, &ctx.tail_index("o_base", otail, &s2("qi", "d")), "v"));
    let source = specialize(
        "attention.cuh",
        template::ATTENTION,
        &[
            ("NAME", ctx.name.clone()),
            ("PARAMS", ctx.param_list()),
            ("D", d.to_string()),
            ("DQ", d.next_multiple_of(4).to_string()),
            ("DV", dv.to_string()),
            ("DV_LANE", dv.div_ceil(32).to_string()),
            ("BATCH", format!("{zcode}{bcode}").trim_end().to_string()),
            ("SQ", sq.to_string()),
            ("SKV", skv.to_string()),
            ("Q_LOAD", q_load),
            ("K_LOAD", k_load),
            ("V_LOAD", v_load),
            ("SCALE", f32_lit(scale)),
            ("MASK", mask_code),
            ("NAN_ROWS", nan_rows),
            ("STORE", store),
        ],
    )?;
    Ok(Body { kind: "attention".into(), source, grid: [sq.div_ceil(16) as u32, nbatch as u32, 1], block: [128, 1, 1] })
}
