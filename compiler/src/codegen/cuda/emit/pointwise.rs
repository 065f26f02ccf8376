//! One thread per output element: fused elementwise expressions, the embedding-table gather and
//! concat.

use super::*;

/// Threads per block of the one-thread-per-element templates (their `__launch_bounds__(256)` and
/// `blockIdx.x * 256ull`).
const PER_ELEMENT_BLOCK: u32 = 256;

/// A one-thread-per-element kernel: `template` (file name, text) specialized with the kernel's
/// name, parameters, element count and coordinate code plus `parts`, over a 1-D grid.
fn per_element(ctx: &Ctx, kind: &str, template: (&str, &str), numel: usize, coords: &str, parts: Vec<(&str, String)>) -> Result<Body> {
    let mut subs = vec![
        ("NAME", ctx.name.clone()),
        ("PARAMS", ctx.param_list()),
        ("NUMEL", numel.to_string()),
        ("COORDS", coords.trim_end().to_string()),
    ];
    subs.extend(parts);
    let source = specialize(template.0, template.1, &subs)?;
    let grid = grid_1d(ctx, numel as u64, PER_ELEMENT_BLOCK as u64)?;
    Ok(Body { kind: kind.to_string(), source, grid, block: [PER_ELEMENT_BLOCK, 1, 1] })
}

pub(super) fn emit_elementwise(ctx: &Ctx, expr: &Expr) -> Result<Body> {
    let k = ctx.kernel;
    let shape = k.output.shape.clone();
    let numel: usize = shape.iter().product();
    for (j, t) in k.inputs.iter().enumerate() {
        ctx.check_shape(&format!("input {j}"), t, &shape)?;
    }
    let (coords, names) = coords_code("    ", "i", &shape, "c");
    let out_idx = ctx.index(&k.output, &names)?;
    let out_dt = ctx.dtype(k.output.buffer);
    let mut body = String::new();
    let copy_of = expr.as_copy().filter(|&j| {
        let in_dt = ctx.dtype(k.inputs[j].buffer);
        in_dt == out_dt || (in_dt.is_int() && out_dt.is_int())
    });
    let kind;
    if let Some(j) = copy_of {
        // A raw copy: exact for every element type (ints never go through f32).
        let t = &k.inputs[j];
        let src = format!("{}[{}]", ctx.p(t.buffer), ctx.index(t, &names)?);
        let _ = writeln!(body, "    {}[{out_idx}] = ({}){src};", ctx.p(k.output.buffer), c_type(out_dt));
        kind = "copy";
    } else {
        let mut load = |j: usize| -> Result<String> {
            let t = k.inputs.get(j).ok_or_else(|| ctx.err(format!("expression loads input {j}")))?;
            Ok(ctx.load_f32(t.buffer, &ctx.index(t, &names)?))
        };
        let (code, root) = expr_code(expr, "e", "    ", &mut load, None)?;
        body.push_str(&code);
        let _ = writeln!(body, "    {}", ctx.store_f32(k.output.buffer, &out_idx, &root));
        kind = "elementwise";
    }
    per_element(ctx, kind, ("elementwise.cuh", template::ELEMENTWISE), numel, &coords, vec![("BODY", body.trim_end().to_string())])
}

pub(super) fn emit_gather(ctx: &Ctx) -> Result<Body> {
    let k = ctx.kernel;
    if k.inputs.len() != 2 || k.inputs[0].rank() != 2 {
        return Err(Error::internal("cuda emit", format!("gather `{}` needs a rank-2 table and ids", k.name)));
    }
    let (table, ids) = (&k.inputs[0], &k.inputs[1]);
    let ids_dt = ctx.dtype(ids.buffer);
    if !ids_dt.is_int() {
        return Err(ctx.err(format!("ids of type {ids_dt}")));
    }
    let mut shape = ids.shape.clone();
    shape.push(table.shape[1]);
    ctx.check_shape("output", &k.output, &shape)?;
    let numel: usize = shape.iter().product();
    let (coords, names) = coords_code("    ", "i", &shape, "c");
    let id_load = format!("{}[{}]", ctx.p(ids.buffer), ctx.index(ids, &names[..names.len() - 1])?);
    let (tdt, odt) = (ctx.dtype(table.buffer), ctx.dtype(k.output.buffer));
    let tv = ctx.device_view(table)?;
    let t_idx = {
        let mut terms = Vec::new();
        if tv.offset != 0 {
            terms.push(format!("{}ull", tv.offset));
        }
        terms.push(format!("(unsigned long long)id * {}ull", tv.strides[0]));
        if tv.shape[1] > 1 && tv.strides[1] != 0 {
            terms.push(format!("(unsigned long long){} * {}ull", names[names.len() - 1], tv.strides[1]));
        }
        terms.join(" + ")
    };
    let out_idx = ctx.index(&k.output, &names)?;
    let src = format!("{}[{t_idx}]", ctx.p(table.buffer));
    let store = if tdt == odt {
        format!("    {}[{out_idx}] = {src};", ctx.p(k.output.buffer))
    } else {
        format!("    {}", ctx.store_f32(k.output.buffer, &out_idx, &to_f32(tdt, &src)))
    };
    let parts = vec![("ID_LOAD", id_load), ("ROWS", table.shape[0].to_string()), ("STORE", store)];
    per_element(ctx, "gather", ("gather.cuh", template::GATHER), numel, &coords, parts)
}

pub(super) fn emit_concat(ctx: &Ctx, axis: usize) -> Result<Body> {
    let k = ctx.kernel;
    let shape = k.output.shape.clone();
    if axis >= shape.len() || k.inputs.is_empty() {
        return Err(Error::internal("cuda emit", format!("concat `{}` along axis {axis} of {:?}", k.name, shape)));
    }
    let numel: usize = shape.iter().product();
    let (coords, names) = coords_code("    ", "i", &shape, "c");
    let out_idx = ctx.index(&k.output, &names)?;
    let odt = ctx.dtype(k.output.buffer);
    let mut body = String::new();
    let mut start = 0usize;
    for (j, t) in k.inputs.iter().enumerate() {
        let mut want = shape.clone();
        want[axis] = t.shape.get(axis).copied().unwrap_or(0);
        ctx.check_shape(&format!("input {j}"), t, &want)?;
        let end = start + t.shape[axis];
        let mut cs = names.clone();
        cs[axis] = format!("(c{axis} - {start}u)");
        let src = format!("{}[{}]", ctx.p(t.buffer), ctx.index(t, &cs)?);
        let idt = ctx.dtype(t.buffer);
        let store = if idt == odt || (idt.is_int() && odt.is_int()) {
            format!("{}[{out_idx}] = ({}){src};", ctx.p(k.output.buffer), c_type(odt))
        } else {
            ctx.store_f32(k.output.buffer, &out_idx, &to_f32(idt, &src))
        };
        let cond = if j + 1 == k.inputs.len() { "else".to_string() } else { format!("{}if (c{axis} < {end}u)", if j == 0 { "" } else { "else " }) };
        let cond = if k.inputs.len() == 1 { "".to_string() } else { cond };
        let _ = writeln!(body, "    {cond} {{ {store} }}");
        start = end;
    }
    if start != shape[axis] {
        return Err(Error::internal("cuda emit", format!("concat `{}`: inputs cover {start} of {} along axis {axis}", k.name, shape[axis])));
    }
    per_element(ctx, "concat", ("concat.cuh", template::CONCAT), numel, &coords, vec![("BODY", body.trim_end().to_string())])
}
