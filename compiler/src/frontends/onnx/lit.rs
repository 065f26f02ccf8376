//! Import-time evaluation of nodes whose inputs are all literals: shape subgraphs
//! (Shape → Gather → Unsqueeze → Concat → Reshape, ConstantOfShape, Range, Equal/Where over
//! shapes) and weight dequantization fold to literals once a bucket fixes every dim. Float
//! arithmetic goes through `ops::eval` (the ops' one definition); integer arithmetic, indexing
//! and comparisons, which kiln's graph does not have, are here.

use kiln_runtime::graph::{BinaryOp, UnaryOp};

use super::attrs::Attrs;
use super::shape;
use super::tensor::{checked_numel, lit_from_tensor, Elem, Lit, LitData};
use crate::ops::eval;

type R<T> = Result<T, String>;

/// The most elements a folded literal may have beyond the size of its largest input: literals
/// are f64 vectors, and a shape op (ConstantOfShape, Expand, Tile, Range) fed small numbers can
/// ask for any size. 2^28 elements (2 GiB) is far past any mask or table a model folds; weights
/// folded elementwise (dequantization) are as large as their initializer and may exceed it.
const FOLD_MAX: usize = 1 << 28;

/// The element count of a folded literal of `shape` made from inputs of at most `have`
/// elements: refused past [`FOLD_MAX`] (an error, where allocating would abort the process).
pub(super) fn fold_numel(shape: &[usize], have: usize) -> R<usize> {
    let n = checked_numel(shape)?;
    if n > have.max(FOLD_MAX) {
        return Err(format!("folding it would make a literal of shape {shape:?} ({n} elements; kiln folds at most 2^28 beyond its inputs' size)"));
    }
    Ok(n)
}

/// Visits the `n` row-major coordinates of `shape`.
fn for_each_index(shape: &[usize], n: usize, mut f: impl FnMut(&[usize])) {
    let mut idx = vec![0usize; shape.len()];
    for _ in 0..n {
        f(&idx);
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// `out[i] = x[map(index of i)]` over `out_shape`.
fn select(x: &Lit, out_shape: Vec<usize>, map: impl Fn(&[usize]) -> usize) -> R<Lit> {
    let n = fold_numel(&out_shape, x.numel())?;
    let mut src = Vec::with_capacity(n);
    for_each_index(&out_shape, n, |idx| src.push(map(idx)));
    let data = match &x.data {
        LitData::F(v) => LitData::F(src.iter().map(|&i| v[i]).collect()),
        LitData::I(v) => LitData::I(src.iter().map(|&i| v[i]).collect()),
    };
    Ok(Lit { elem: x.elem, shape: out_shape, data, weight: x.weight })
}

/// `x` with its dims permuted by `perm` (an error unless a permutation of its rank).
pub(super) fn transpose(x: &Lit, perm: &[usize]) -> R<Lit> {
    let mut seen = vec![false; x.shape.len()];
    if perm.len() != x.shape.len() || perm.iter().any(|&p| p >= seen.len() || std::mem::replace(&mut seen[p], true)) {
        return Err(format!("a permutation {perm:?} of a rank-{} value", x.shape.len()));
    }
    let st = shape::strides(&x.shape);
    let out: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    select(x, out, |o| o.iter().zip(perm).map(|(&i, &p)| i * st[p]).sum())
}

/// Index of `x` (shape `s`) read at broadcast output coordinates `o`.
fn bidx(s: &[usize], st: &[usize], o: &[usize]) -> usize {
    let off = o.len() - s.len();
    s.iter().enumerate().map(|(d, &n)| if n == 1 { 0 } else { o[off + d] * st[d] }).sum()
}

/// The broadcast shape of `xs`; `f` gets, for each output element in order, every input's
/// offset of the element it reads.
fn broadcast_each(xs: &[&Lit], mut f: impl FnMut(&[usize])) -> R<Vec<usize>> {
    let mut out = xs[0].shape.clone();
    for x in &xs[1..] {
        out = shape::broadcast(&out, &x.shape)?;
    }
    let sts: Vec<Vec<usize>> = xs.iter().map(|x| shape::strides(&x.shape)).collect();
    let mut offs = vec![0usize; xs.len()];
    for_each_index(&out, fold_numel(&out, xs.iter().map(|x| x.numel()).max().unwrap_or(0))?, |idx| {
        for (k, x) in xs.iter().enumerate() {
            offs[k] = bidx(&x.shape, &sts[k], idx);
        }
        f(&offs)
    });
    Ok(out)
}

/// Elementwise over broadcast inputs.
fn zip_map(xs: &[&Lit], elem: Elem, f: impl Fn(&[f64], &[i64]) -> f64) -> R<Lit> {
    let fl: Vec<Vec<f64>> = xs.iter().map(|x| x.floats()).collect();
    let il: Vec<Vec<i64>> = xs.iter().map(|x| x.ints()).collect();
    let mut v = Vec::new();
    let out = broadcast_each(xs, |o| {
        let fs: Vec<f64> = o.iter().zip(&fl).map(|(&i, l)| l[i]).collect();
        let is: Vec<i64> = o.iter().zip(&il).map(|(&i, l)| l[i]).collect();
        v.push(f(&fs, &is));
    })?;
    let mut l = Lit::of(elem, out, v);
    l.weight = xs.iter().any(|x| x.weight);
    Ok(l)
}

fn int_binary(op: &str, a: i64, b: i64) -> R<i64> {
    Ok(match op {
        "Add" => a.wrapping_add(b),
        "Sub" => a.wrapping_sub(b),
        "Mul" => a.wrapping_mul(b),
        "Div" if b == 0 => return Err("integer division by zero".into()),
        "Div" => a.wrapping_div(b),
        "Max" => a.max(b),
        "Min" => a.min(b),
        "Mod" if b == 0 => return Err("integer modulo by zero".into()),
        // The sign of the divisor, as Python's `%` (ONNX Mod with fmod = 0).
        "Mod" => {
            let m = a.wrapping_rem(b);
            if m != 0 && ((m < 0) != (b < 0)) { m + b } else { m }
        }
        _ => return Err(format!("{op} on integers")),
    })
}

fn float_binary(op: &str, a: f64, b: f64) -> f64 {
    let k = match op {
        "Add" => BinaryOp::Add,
        "Sub" => BinaryOp::Sub,
        "Mul" => BinaryOp::Mul,
        "Div" => BinaryOp::Div,
        "Max" => BinaryOp::Max,
        "Min" => BinaryOp::Min,
        "Pow" => return a.powf(b),
        _ => unreachable!("only the arithmetic ops above reach float_binary"),
    };
    eval::binary::<f64>(k, false, a, b)
}

/// Folds node `op` over literal inputs (`None`: an absent optional input). `Ok(None)`: this op
/// is not evaluated at import (the importer emits a graph node instead).
pub fn fold(op: &str, ins: &[Option<&Lit>], at: &Attrs, opset: i64, dir: &std::path::Path) -> R<Option<Vec<Lit>>> {
    let x = |k: usize| ins.get(k).copied().flatten().ok_or_else(|| format!("input {k} is missing"));
    let one = |l: Lit| Ok(Some(vec![l]));
    match op {
        "Identity" => one(x(0)?.clone()),
        "Dropout" if ins.get(2).copied().flatten().is_some_and(|t| t.ints().first().is_some_and(|&v| v != 0)) => {
            Err("Dropout in training mode (kiln runs inference)".into())
        }
        "Dropout" => one(x(0)?.clone()),
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" => {
            let (a, b) = (x(0)?, x(1)?);
            // Mod with fmod = 1 is C's fmod, the dividend's sign (Rust's `%` on f64 and i64);
            // with fmod = 0 (integers only) the divisor's, as Python's `%` (`int_binary`).
            let fmod = op == "Mod" && at.int("fmod", 0) != 0;
            if a.elem.is_float() {
                if op == "Mod" && !fmod && opset < 28 {
                    return Err("Mod of floats needs fmod = 1 (before opset 28)".into());
                }
                // Python's `%` for floats (opset 28): fmod moved to the divisor's sign.
                let floor_mod = |x: f64, y: f64| {
                    let m = x % y;
                    if m != 0.0 && (m < 0.0) != (y < 0.0) { m + y } else { m }
                };
                let f = |f: &[f64], _: &[i64]| match (op, fmod) {
                    ("Mod", true) => f[0] % f[1],
                    ("Mod", false) => floor_mod(f[0], f[1]),
                    _ => float_binary(op, f[0], f[1]),
                };
                one(zip_map(&[a, b], a.elem, f)?)
            } else {
                if matches!(op, "Div" | "Mod") && b.ints().contains(&0) {
                    return Err(format!("integer {op} by zero"));
                }
                if op == "Pow" {
                    return one(zip_ints(&[a, b], |i| (i[0] as f64).powf(i[1] as f64) as i64)?);
                }
                if fmod {
                    return one(zip_ints(&[a, b], |i| i[0].wrapping_rem(i[1]))?);
                }
                one(zip_ints(&[a, b], |i| int_binary(op, i[0], i[1]).unwrap_or(0))?)
            }
        }
        "Max" | "Min" | "Sum" => {
            let xs: Vec<&Lit> = ins.iter().flatten().copied().collect();
            let Some(&first) = xs.first() else { return Err(format!("{op} of no inputs")) };
            let mut acc = first.clone();
            for b in &xs[1..] {
                let o = if op == "Sum" { "Add" } else { op };
                acc = if acc.elem.is_float() {
                    zip_map(&[&acc, b], acc.elem, |f, _| float_binary(o, f[0], f[1]))?
                } else {
                    zip_ints(&[&acc, b], |i| int_binary(o, i[0], i[1]).unwrap_or(0))?
                };
            }
            one(acc)
        }
        "Sqrt" | "Neg" | "Abs" | "Exp" | "Erf" | "Reciprocal" | "Tanh" | "Sigmoid" | "Relu" | "Floor" | "Ceil" | "Round" | "Log"
        | "Softplus" | "Sin" | "Cos" | "Sign" => {
            let a = x(0)?;
            if !a.elem.is_float() {
                return match op {
                    "Sign" => one(zip_ints(&[a], |i| i[0].signum())?),
                    "Neg" => one(zip_ints(&[a], |i| i[0].wrapping_neg())?),
                    "Abs" => one(zip_ints(&[a], |i| i[0].wrapping_abs())?),
                    "Relu" => one(zip_ints(&[a], |i| i[0].max(0))?),
                    _ => Err(format!("{op} of integers")),
                };
            }
            let u = match op {
                "Sqrt" => Some(UnaryOp::Sqrt),
                "Neg" => Some(UnaryOp::Neg),
                "Abs" => Some(UnaryOp::Abs),
                "Exp" => Some(UnaryOp::Exp),
                "Erf" => Some(UnaryOp::Erf),
                "Reciprocal" => Some(UnaryOp::Recip),
                "Tanh" => Some(UnaryOp::Tanh),
                "Sigmoid" => Some(UnaryOp::Sigmoid),
                "Relu" => Some(UnaryOp::Relu),
                "Log" => Some(UnaryOp::Log),
                "Softplus" => Some(UnaryOp::Softplus),
                "Floor" => Some(UnaryOp::Floor),
                "Ceil" => Some(UnaryOp::Ceil),
                "Round" => Some(UnaryOp::Round),
                _ => None,
            };
            // Known Sin and Cos fold with f64's libm (rotary tables of the positions a bucket
            // fixes, exact to the last bit of f32); kiln's `sin`/`cos` are for run-time values.
            one(zip_map(&[a], a.elem, |f, _| match (u, op) {
                (Some(u), _) => eval::unary::<f64>(u, f[0]),
                (None, "Sin") => f[0].sin(),
                (None, "Sign") if f[0] == 0.0 || f[0].is_nan() => f[0],
                (None, "Sign") => f[0].signum(),
                (None, _) => f[0].cos(),
            })?)
        }
        "Equal" | "Greater" | "GreaterOrEqual" | "Less" | "LessOrEqual" => {
            let (a, b) = (x(0)?, x(1)?);
            let cmp = |o: std::cmp::Ordering| match op {
                "Equal" => o.is_eq(),
                "Greater" => o.is_gt(),
                "GreaterOrEqual" => o.is_ge(),
                "Less" => o.is_lt(),
                _ => o.is_le(),
            };
            if a.elem.is_float() {
                one(zip_map(&[a, b], Elem::Bool, |f, _| f[0].partial_cmp(&f[1]).is_some_and(cmp) as i64 as f64)?)
            } else {
                one(zip_ints(&[a, b], |i| cmp(i[0].cmp(&i[1])) as i64)?.with_elem(Elem::Bool))
            }
        }
        "And" | "Or" | "Xor" => {
            let f = |i: &[i64]| match op {
                "And" => (i[0] != 0 && i[1] != 0) as i64,
                "Or" => (i[0] != 0 || i[1] != 0) as i64,
                _ => ((i[0] != 0) ^ (i[1] != 0)) as i64,
            };
            one(zip_ints(&[x(0)?, x(1)?], f)?.with_elem(Elem::Bool))
        }
        "Not" => one(zip_ints(&[x(0)?], |i| (i[0] == 0) as i64)?.with_elem(Elem::Bool)),
        "IsNaN" => one(zip_map(&[x(0)?], Elem::Bool, |f, _| f[0].is_nan() as i64 as f64)?),
        "Where" => {
            let (c, a, b) = (x(0)?, x(1)?, x(2)?);
            if a.elem.is_float() {
                one(zip_map(&[c, a, b], a.elem, |f, i| if i[0] != 0 { f[1] } else { f[2] })?)
            } else {
                one(zip_ints(&[c, a, b], |i| if i[0] != 0 { i[1] } else { i[2] })?.with_elem(a.elem))
            }
        }
        "Cast" | "CastLike" => {
            let code = if op == "CastLike" { x(1)?.elem.code() } else { at.int("to", 1) as i32 };
            let to = Elem::from_code(code).ok_or_else(|| format!("Cast to {}", Elem::name_of(code)))?;
            let a = x(0)?;
            let v = a.floats();
            let mut l = match to {
                Elem::Bool => Lit::of(Elem::Bool, a.shape.clone(), v.iter().map(|&f| (f != 0.0) as i64 as f64).collect()),
                Elem::F16 => Lit::of(to, a.shape.clone(), v.iter().map(|&f| half::f16::from_f64(f).to_f64()).collect()),
                Elem::BF16 => Lit::of(to, a.shape.clone(), v.iter().map(|&f| half::bf16::from_f64(f).to_f64()).collect()),
                Elem::F32 => Lit::of(to, a.shape.clone(), v.iter().map(|&f| f as f32 as f64).collect()),
                t if t.is_float() => Lit::of(to, a.shape.clone(), v),
                _ if !a.elem.is_float() => Lit { elem: to, shape: a.shape.clone(), data: LitData::I(a.ints()), weight: false },
                _ => Lit::of(to, a.shape.clone(), v.iter().map(|f| f.trunc()).collect()),
            };
            l.weight = a.weight;
            one(l)
        }
        "Shape" | "Size" => Ok(None), // from the value's type, done by the importer
        "Constant" => {
            if let Some(t) = at.tensor("value") {
                return one(lit_from_tensor(t, dir)?);
            }
            if at.has("value_float") {
                return one(Lit::of(Elem::F32, vec![], vec![at.float("value_float", 0.0) as f64]));
            }
            if let Some(v) = at.floats("value_floats") {
                return one(Lit::of(Elem::F32, vec![v.len()], v.iter().map(|&x| x as f64).collect()));
            }
            if at.has("value_int") {
                return one(Lit::int(vec![], vec![at.int("value_int", 0)]));
            }
            if let Some(v) = at.ints("value_ints") {
                return one(Lit::int(vec![v.len()], v));
            }
            Err(format!("Constant with attributes {:?} is not supported", at.names()))
        }
        "ConstantOfShape" => {
            let s: Vec<usize> = x(0)?.ints().iter().map(|&d| usize::try_from(d).map_err(|_| format!("negative dim {d}"))).collect::<R<_>>()?;
            let n = fold_numel(&s, 0)?;
            let v = match at.tensor("value") {
                Some(t) => lit_from_tensor(t, dir)?,
                None => Lit::of(Elem::F32, vec![1], vec![0.0]),
            };
            let fill = v.floats().first().copied().unwrap_or(0.0);
            one(Lit::of(v.elem, s, vec![fill; n]))
        }
        // Window functions of `size` points: Σ (-1)^k a_k cos(2πkn/N), N = size (periodic) or
        // size - 1 (symmetric); Hamming's a = 25/46, 21/46 as ONNX defines them.
        "HannWindow" | "HammingWindow" | "BlackmanWindow" => {
            let size = x(0)?.ints().first().copied().ok_or("a window without a size")?;
            let n = usize::try_from(size).map_err(|_| format!("window size {size}"))?;
            fold_numel(&[n], 0)?;
            let denom = if at.int("periodic", 1) != 0 { n as f64 } else { n as f64 - 1.0 };
            let a: &[f64] = match op {
                "HannWindow" => &[0.5, 0.5],
                "HammingWindow" => &[25.0 / 46.0, 21.0 / 46.0],
                _ => &[0.42, 0.5, 0.08],
            };
            let v: Vec<f64> = (0..n)
                .map(|i| {
                    let t = 2.0 * std::f64::consts::PI * i as f64 / denom;
                    a.iter().enumerate().map(|(k, &ak)| if k % 2 == 0 { ak } else { -ak } * (k as f64 * t).cos()).sum()
                })
                .collect();
            let elem = Elem::from_code(at.int("output_datatype", 1) as i32).ok_or("window output_datatype")?;
            one(Lit::of(elem, vec![n], v))
        }
        "CumSum" => {
            let a = x(0)?;
            let ax = shape::axis(x(1)?.ints().first().copied().ok_or("CumSum without an axis")?, a.shape.len())?;
            let (exclusive, reverse) = (at.int("exclusive", 0) != 0, at.int("reverse", 0) != 0);
            let (n, inner) = (a.shape[ax], a.shape[ax + 1..].iter().product::<usize>());
            let outer = a.numel() / (n * inner).max(1);
            let order: Vec<usize> = if reverse { (0..n).rev().collect() } else { (0..n).collect() };
            let mut out = a.clone();
            macro_rules! scan {
                ($v:expr, $o:expr, $zero:expr, $add:expr) => {
                    for o in 0..outer {
                        for i in 0..inner {
                            let mut acc = $zero;
                            for &k in &order {
                                let at = (o * n + k) * inner + i;
                                let v = $v[at];
                                if !exclusive {
                                    acc = $add(acc, v);
                                }
                                $o[at] = acc;
                                if exclusive {
                                    acc = $add(acc, v);
                                }
                            }
                        }
                    }
                };
            }
            match (&a.data, &mut out.data) {
                (LitData::F(v), LitData::F(o)) => scan!(v, o, 0.0f64, |p: f64, q: f64| p + q),
                (LitData::I(v), LitData::I(o)) => scan!(v, o, 0i64, |p: i64, q: i64| p.wrapping_add(q)),
                _ => return Err("CumSum of mixed data".into()),
            }
            out.weight = false;
            one(out)
        }
        "Range" => {
            let (s, l, d) = (x(0)?, x(1)?, x(2)?);
            if [s, l, d].iter().any(|t| t.numel() != 1) {
                return Err(format!("Range of start {:?}, limit {:?}, delta {:?} (scalars)", s.shape, l.shape, d.shape));
            }
            if s.elem.is_float() {
                let (a, b, st) = (s.floats()[0], l.floats()[0], d.floats()[0]);
                let n = ((b - a) / st).ceil().max(0.0) as usize;
                fold_numel(&[n], 0)?;
                one(Lit::of(s.elem, vec![n], (0..n).map(|i| a + i as f64 * st).collect()))
            } else {
                let (a, b, st) = (s.ints()[0], l.ints()[0], d.ints()[0]);
                if st == 0 {
                    return Err("Range with delta 0".into());
                }
                let n = ((b as f64 - a as f64) / st as f64).ceil().max(0.0) as usize;
                fold_numel(&[n], 0)?;
                let v = (0..n as i64).map(|i| a.wrapping_add(i.wrapping_mul(st))).collect();
                one(Lit { elem: s.elem, shape: vec![n], data: LitData::I(v), weight: false })
            }
        }
        "Unsqueeze" | "Squeeze" | "Flatten" | "Reshape" => {
            let a = x(0)?;
            let axes = if opset >= 13 { ins.get(1).copied().flatten().map(|l| l.ints()) } else { at.ints("axes") };
            let s = match op {
                "Unsqueeze" => shape::unsqueeze(&a.shape, &axes.ok_or("Unsqueeze needs axes")?)?,
                "Squeeze" => shape::squeeze(&a.shape, axes.as_deref())?,
                "Flatten" => {
                    let k = shape::flatten_axis(at.int("axis", 1), a.shape.len())?;
                    vec![a.shape[..k].iter().product(), a.shape[k..].iter().product()]
                }
                _ => shape::reshape(&a.shape, &x(1)?.ints(), at.int("allowzero", 0) != 0)?,
            };
            let mut l = a.clone();
            l.shape = s;
            one(l)
        }
        "Transpose" => {
            let a = x(0)?;
            one(transpose(a, &shape::perm(at.ints("perm").as_deref(), a.shape.len())?)?)
        }
        "Concat" => {
            let xs: Vec<&Lit> = ins.iter().flatten().copied().collect();
            let Some(&first) = xs.first() else { return Err("Concat of no inputs".into()) };
            let r = first.shape.len();
            let ax = shape::axis(at.int("axis", 0), r)?;
            let fits = |l: &Lit| {
                l.elem.is_float() == first.elem.is_float()
                    && l.shape.len() == r
                    && l.shape.iter().zip(&first.shape).enumerate().all(|(d, (a, b))| d == ax || a == b)
            };
            if let Some(l) = xs.iter().find(|l| !fits(l)) {
                return Err(format!("Concat of {:?} {:?} and {:?} {:?} along axis {ax}", first.elem, first.shape, l.elem, l.shape));
            }
            let mut out = xs[0].shape.clone();
            out[ax] = xs.iter().map(|l| l.shape[ax]).sum();
            let mut parts = Vec::new();
            for l in &xs {
                parts.push((l, shape::strides(&l.shape)));
            }
            let merged = Lit {
                elem: xs[0].elem,
                shape: vec![xs.iter().map(|l| l.numel()).sum()],
                data: if xs[0].elem.is_float() {
                    LitData::F(xs.iter().flat_map(|l| l.floats()).collect())
                } else {
                    LitData::I(xs.iter().flat_map(|l| l.ints()).collect())
                },
                weight: xs.iter().any(|l| l.weight),
            };
            let bases: Vec<usize> = xs.iter().scan(0, |acc, l| {
                let b = *acc;
                *acc += l.numel();
                Some(b)
            }).collect();
            one(select(&merged, out, |o| {
                let mut a = o[ax];
                let mut k = 0;
                while a >= xs[k].shape[ax] {
                    a -= xs[k].shape[ax];
                    k += 1;
                }
                let st = &parts[k].1;
                bases[k] + o.iter().enumerate().map(|(d, &i)| if d == ax { a * st[d] } else { i * st[d] }).sum::<usize>()
            })?)
        }
        "Gather" => {
            let (a, ids) = (x(0)?, x(1)?);
            let ax = shape::axis(at.int("axis", 0), a.shape.len())?;
            let n = a.shape[ax] as i64;
            let ids: Vec<usize> = ids
                .ints()
                .iter()
                .map(|&i| {
                    let j = if i < 0 { i + n } else { i };
                    if (0..n).contains(&j) { Ok(j as usize) } else { Err(format!("Gather index {i} out of range for dim {n}")) }
                })
                .collect::<R<_>>()?;
            let ishape = x(1)?.shape.clone();
            let ist = shape::strides(&ishape);
            let st = shape::strides(&a.shape);
            let mut out: Vec<usize> = a.shape[..ax].to_vec();
            out.extend(&ishape);
            out.extend(&a.shape[ax + 1..]);
            let q = ishape.len();
            one(select(a, out, |o| {
                let pre: usize = (0..ax).map(|d| o[d] * st[d]).sum();
                let id = ids[(0..q).map(|d| o[ax + d] * ist[d]).sum::<usize>()];
                let post: usize = (ax + 1..a.shape.len()).map(|d| o[d + q - 1] * st[d]).sum();
                pre + id * st[ax] + post
            })?)
        }
        "Slice" => {
            let a = x(0)?;
            let r = a.shape.len();
            let (starts, ends, axes, steps) = if opset >= 10 {
                (x(1)?.ints(), x(2)?.ints(), ins.get(3).copied().flatten().map(|l| l.ints()), ins.get(4).copied().flatten().map(|l| l.ints()))
            } else {
                (at.ints("starts").unwrap_or_default(), at.ints("ends").unwrap_or_default(), at.ints("axes"), None)
            };
            let mut begin = vec![0i64; r];
            let mut step = vec![1i64; r];
            let mut out = a.shape.clone();
            for (ax, s, st, len) in shape::slice_axes(&a.shape, &starts, &ends, axes.as_deref(), steps.as_deref())? {
                begin[ax] = s;
                step[ax] = st;
                out[ax] = len;
            }
            let sst = shape::strides(&a.shape);
            one(select(a, out, |o| o.iter().enumerate().map(|(d, &i)| (begin[d] + i as i64 * step[d]) as usize * sst[d]).sum())?)
        }
        "Expand" => {
            let a = x(0)?;
            let to: Vec<usize> = x(1)?.ints().iter().map(|&d| d.max(0) as usize).collect();
            let out = shape::broadcast(&a.shape, &to)?;
            let st = shape::strides(&a.shape);
            one(select(a, out, |o| bidx(&a.shape, &st, o))?)
        }
        "Tile" => {
            let a = x(0)?;
            let reps = x(1)?.ints();
            if reps.len() != a.shape.len() || reps.iter().any(|&k| k < 0) {
                return Err(format!("Tile repeats {reps:?} of a rank-{} input", a.shape.len()));
            }
            let out: Vec<usize> = a.shape.iter().zip(&reps).map(|(&d, &k)| d * k.max(0) as usize).collect();
            let st = shape::strides(&a.shape);
            one(select(a, out, |o| o.iter().enumerate().map(|(d, &i)| (i % a.shape[d]) * st[d]).sum())?)
        }
        "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1" | "ReduceL2" | "ReduceSumSquare" | "ReduceLogSum"
        | "ReduceLogSumExp" => {
            let a = x(0)?;
            let axes_as_input = match op {
                "ReduceSum" => opset >= 13,
                _ => opset >= 18,
            };
            let axes = if axes_as_input { ins.get(1).copied().flatten().map(|l| l.ints()) } else { at.ints("axes") };
            let r = a.shape.len();
            let axes: Vec<usize> = match axes {
                Some(v) if !v.is_empty() => v.iter().map(|&d| shape::axis(d, r)).collect::<R<_>>()?,
                _ if at.int("noop_with_empty_axes", 0) != 0 => return one(a.clone()),
                _ => (0..r).collect(),
            };
            let keep = at.int("keepdims", 1) != 0;
            let kept: Vec<usize> = a.shape.iter().enumerate().map(|(d, &n)| if axes.contains(&d) { 1 } else { n }).collect();
            let n = fold_numel(&kept, a.numel())?;
            let st = shape::strides(&a.shape);
            let v = a.floats();
            let mut acc: Vec<Vec<f64>> = vec![Vec::new(); n];
            let kst = shape::strides(&kept);
            for (i, &x) in v.iter().enumerate() {
                let k: usize = (0..r).map(|d| if axes.contains(&d) { 0 } else { (i / st[d]) % a.shape[d] * kst[d] }).sum();
                acc[k].push(x);
            }
            let red: Vec<f64> = acc
                .iter()
                .map(|xs| match op {
                    "ReduceSum" => xs.iter().sum(),
                    "ReduceMean" => xs.iter().sum::<f64>() / xs.len() as f64,
                    // Over nothing: -inf / +inf, the type's least / greatest value (false / true).
                    "ReduceMax" if xs.is_empty() && a.elem == Elem::Bool => 0.0,
                    "ReduceMin" if xs.is_empty() && a.elem == Elem::Bool => 1.0,
                    "ReduceMax" => xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    "ReduceMin" => xs.iter().copied().fold(f64::INFINITY, f64::min),
                    "ReduceL1" => xs.iter().map(|x| x.abs()).sum(),
                    "ReduceL2" => xs.iter().map(|x| x * x).sum::<f64>().sqrt(),
                    "ReduceSumSquare" => xs.iter().map(|x| x * x).sum(),
                    "ReduceLogSum" => xs.iter().sum::<f64>().ln(),
                    "ReduceLogSumExp" => {
                        let m = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                        if m.is_finite() { m + xs.iter().map(|x| (x - m).exp()).sum::<f64>().ln() } else { xs.iter().map(|x| x.exp()).sum::<f64>().ln() }
                    }
                    _ => xs.iter().product(),
                })
                .collect();
            let out = if keep { kept } else { a.shape.iter().enumerate().filter(|(d, _)| !axes.contains(d)).map(|(_, &n)| n).collect() };
            one(Lit::of(a.elem, out, red))
        }
        // (q - zero)·scale and clamp(round(x / scale) + zero), scale and zero point per tensor,
        // per slice along `axis`, or per block of `block_size` along it (opset 21).
        "DequantizeLinear" | "QuantizeLinear" => {
            let (v, scale) = (x(0)?, x(1)?);
            let zp = ins.get(2).copied().flatten();
            let param = param_index(op, &v.shape, scale, zp, at)?;
            let (ss, zs) = (scale.floats(), zp.map(|z| z.ints()).unwrap_or_default());
            let z = |c: usize| zs.get(c).copied().unwrap_or(0);
            let mut l = if op == "DequantizeLinear" {
                let out: Vec<f64> = v.ints().iter().enumerate().map(|(i, &q)| (q.wrapping_sub(z(param(i))) as f64 * ss[param(i)]) as f32 as f64).collect();
                Lit::of(scale.elem, v.shape.clone(), out)
            } else {
                let elem = q_elem(zp, at)?;
                let (lo, hi) = elem.q_range().ok_or_else(|| format!("QuantizeLinear to {elem:?}"))?;
                let out: Vec<f64> = v
                    .floats()
                    .iter()
                    .enumerate()
                    .map(|(i, &f)| ((f as f32 / ss[param(i)] as f32).round_ties_even() + z(param(i)) as f32).clamp(lo, hi) as f64)
                    .collect();
                Lit::of(elem, v.shape.clone(), out)
            };
            l.weight = v.weight;
            one(l)
        }
        _ => Ok(None),
    }
}

/// For (De)QuantizeLinear of `shape`: the index into the scale (and zero point) of each
/// element, per tensor, per slice along `axis` or per `block_size` elements along it.
fn param_index(op: &str, shape: &[usize], scale: &Lit, zp: Option<&Lit>, at: &Attrs) -> R<impl Fn(usize) -> usize> {
    let r = shape.len();
    let block = at.int("block_size", 0);
    let bad = || format!("{op} of {shape:?} by scales {:?} (zero points {:?}, block_size {block})", scale.shape, zp.map(|z| z.shape.clone()));
    if scale.numel() == 0 || zp.is_some_and(|z| z.numel() != scale.numel()) {
        return Err(bad());
    }
    let st = shape::strides(shape);
    let shape = shape.to_vec();
    // (axis, block length along it, the scale's strides): one scale for all when axis is None.
    let (ax, blen, sst) = if block < 0 {
        return Err(bad());
    } else if block > 0 {
        let ax = shape::axis(at.int("axis", 1), r)?;
        let b = block as usize;
        let want: Vec<usize> = shape.iter().enumerate().map(|(d, &n)| if d == ax { n.div_ceil(b) } else { n }).collect();
        if scale.shape != want {
            return Err(bad());
        }
        (Some(ax), b, shape::strides(&want))
    } else if scale.numel() > 1 {
        let ax = shape::axis(at.int("axis", 1), r)?;
        if scale.shape.len() != 1 || scale.numel() != shape[ax] {
            return Err(bad());
        }
        (Some(ax), 1, vec![])
    } else {
        (None, 1, vec![])
    };
    Ok(move |i: usize| match ax {
        None => 0,
        Some(ax) if sst.is_empty() => (i / st[ax]) % shape[ax],
        Some(ax) => (0..r).map(|d| (i / st[d]) % shape[d] / if d == ax { blen } else { 1 } * sst[d]).sum(),
    })
}

/// QuantizeLinear's output type: its zero point's, else `output_dtype`, else uint8.
fn q_elem(zp: Option<&Lit>, at: &Attrs) -> R<Elem> {
    match (zp, at.int("output_dtype", 0)) {
        (Some(z), 0) => Ok(z.elem),
        (Some(z), c) if Elem::from_code(c as i32) == Some(z.elem) => Ok(z.elem),
        (Some(z), c) => Err(format!("output_dtype {} but a zero point of type {:?}", Elem::name_of(c as i32), z.elem)),
        (None, 0) => Ok(Elem::U8),
        (None, c) => Elem::from_code(c as i32).ok_or_else(|| format!("QuantizeLinear to {}", Elem::name_of(c as i32))),
    }
}

/// Elementwise over broadcast integer inputs, exactly (no f64 detour).
fn zip_ints(xs: &[&Lit], f: impl Fn(&[i64]) -> i64) -> R<Lit> {
    let il: Vec<Vec<i64>> = xs.iter().map(|x| x.ints()).collect();
    let mut v = Vec::new();
    let out = broadcast_each(xs, |o| {
        let is: Vec<i64> = o.iter().zip(&il).map(|(&i, l)| l[i]).collect();
        v.push(f(&is));
    })?;
    Ok(Lit { elem: xs[0].elem, shape: out, data: LitData::I(v), weight: xs.iter().any(|x| x.weight) })
}

impl Lit {
    fn with_elem(mut self, e: Elem) -> Lit {
        self.elem = e;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A permutation of the wrong length or with a repeated or out-of-range axis is an error (a
    /// QGemm with `transB` of a rank-1 B reached here with [1, 0] and indexed past the shape).
    #[test]
    fn transpose_checks_its_permutation() {
        let m = Lit::of(Elem::F32, vec![2, 3], (0..6).map(f64::from).collect());
        assert_eq!(transpose(&m, &[1, 0]).unwrap().floats(), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        let v = Lit::of(Elem::F32, vec![3], vec![1.0, 2.0, 3.0]);
        for perm in [&[1, 0][..], &[0, 0], &[2, 0], &[]] {
            let on = if perm.len() == 2 && perm != [1, 0] { &m } else { &v };
            assert!(transpose(on, perm).is_err(), "{perm:?}");
        }
    }
}
