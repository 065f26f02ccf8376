//! Shape rules of the ONNX layout ops, shared by the literal folder and the graph importer:
//! axis normalization, numpy broadcasting, Reshape's 0/-1, Squeeze/Unsqueeze, Slice ranges.

/// `axis` (negative counts from the end) in `0..rank`.
pub fn axis(a: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let x = if a < 0 { a + r } else { a };
    if (0..r).contains(&x) {
        Ok(x as usize)
    } else {
        Err(format!("axis {a} is out of range for rank {rank}"))
    }
}

/// Flatten's axis, in `0..=rank` (negative counts from the end).
pub fn flatten_axis(a: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let x = if a < 0 { a + r } else { a };
    if (0..=r).contains(&x) {
        Ok(x as usize)
    } else {
        Err(format!("flatten axis {a} is out of range for rank {rank}"))
    }
}

/// Numpy broadcasting.
pub fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let da = if i + a.len() >= r { a[i + a.len() - r] } else { 1 };
            let db = if i + b.len() >= r { b[i + b.len() - r] } else { 1 };
            match (da, db) {
                (x, y) if x == y => Ok(x),
                (1, y) => Ok(y),
                (x, 1) => Ok(x),
                _ => Err(format!("shapes {a:?} and {b:?} do not broadcast")),
            }
        })
        .collect()
}

/// Reshape's target: 0 copies the input dim (unless `allowzero`), one -1 is inferred.
pub fn reshape(from: &[usize], to: &[i64], allowzero: bool) -> Result<Vec<usize>, String> {
    let n: usize = from.iter().product();
    let mut out = Vec::with_capacity(to.len());
    let mut infer = None;
    for (i, &d) in to.iter().enumerate() {
        match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            0 if !allowzero => out.push(*from.get(i).ok_or_else(|| format!("reshape copies dim {i} of {from:?}"))?),
            d if d >= 0 => out.push(d as usize),
            _ => return Err(format!("bad reshape target {to:?}")),
        }
    }
    // Products checked: a target like [2^40, 2^40] is refused, not wrapped around.
    let product = |v: &[usize]| v.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let bad = || format!("cannot reshape {from:?} into {to:?}");
    let known = product(&out).ok_or_else(bad)?;
    if let Some(i) = infer {
        if known == 0 || !n.is_multiple_of(known) {
            return Err(bad());
        }
        out[i] = n / known;
    }
    if product(&out) != Some(n) {
        return Err(format!("cannot reshape {from:?} into {to:?}"));
    }
    Ok(out)
}

pub fn unsqueeze(from: &[usize], axes: &[i64]) -> Result<Vec<usize>, String> {
    let r = from.len() + axes.len();
    let mut ax: Vec<usize> = axes.iter().map(|&a| axis(a, r)).collect::<Result<_, _>>()?;
    ax.sort();
    ax.dedup();
    if ax.len() != axes.len() {
        return Err(format!("repeated unsqueeze axes {axes:?}"));
    }
    let mut it = from.iter();
    Ok((0..r).map(|i| if ax.contains(&i) { 1 } else { *it.next().unwrap() }).collect())
}

pub fn squeeze(from: &[usize], axes: Option<&[i64]>) -> Result<Vec<usize>, String> {
    match axes {
        None => Ok(from.iter().copied().filter(|&d| d != 1).collect()),
        Some(axes) => {
            let ax: Vec<usize> = axes.iter().map(|&a| axis(a, from.len())).collect::<Result<_, _>>()?;
            if let Some(&a) = ax.iter().find(|&&a| from[a] != 1) {
                return Err(format!("cannot squeeze dim {a} of {from:?}"));
            }
            Ok(from.iter().enumerate().filter(|(i, _)| !ax.contains(i)).map(|(_, &d)| d).collect())
        }
    }
}

/// One axis of a Slice: the clamped `start`, `end` and `step` (ONNX's rules for negative and
/// out-of-range values), and the resulting length.
pub fn slice_range(dim: usize, start: i64, end: i64, step: i64) -> Result<(i64, i64, i64, usize), String> {
    if step == 0 {
        return Err("slice step 0".into());
    }
    let d = dim as i64;
    let norm = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
    let (s, e) = (norm(start), norm(end));
    let (s, e) = if step > 0 { (s.clamp(0, d), e.clamp(0, d)) } else { (s.clamp(-1, d - 1), e.clamp(-1, d - 1)) };
    // ceil(span / |step|), without overflow for any step (i64::MIN included).
    let steps = |span: i64| ((span - 1) as u64 / step.unsigned_abs() + 1) as usize;
    let len = if step > 0 && e > s {
        steps(e - s)
    } else if step < 0 && s > e {
        steps(s - e)
    } else {
        0
    };
    Ok((s, e, step, len))
}

/// The axes a Slice cuts, each with its clamped start, its step and its length (see
/// [`slice_range`]), from the starts, ends and optional axes (default 0, 1, ...) and steps
/// (default 1): one entry each, axes in range and not repeated.
pub fn slice_axes(shape: &[usize], starts: &[i64], ends: &[i64], axes: Option<&[i64]>, steps: Option<&[i64]>) -> Result<Vec<(usize, i64, i64, usize)>, String> {
    let axes: Vec<usize> = match axes {
        Some(v) => v.iter().map(|&d| axis(d, shape.len())).collect::<Result<_, _>>()?,
        None if starts.len() <= shape.len() => (0..starts.len()).collect(),
        None => return Err(format!("Slice of {} axes of a rank-{} input", starts.len(), shape.len())),
    };
    let n_steps = steps.map_or(axes.len(), |v| v.len());
    if starts.len() != axes.len() || ends.len() != axes.len() || n_steps != axes.len() {
        return Err(format!("Slice with {} starts, {} ends, {} axes and {n_steps} steps", starts.len(), ends.len(), axes.len()));
    }
    if axes.iter().enumerate().any(|(i, a)| axes[..i].contains(a)) {
        return Err(format!("Slice axes {axes:?} repeat an axis"));
    }
    axes.iter()
        .enumerate()
        .map(|(k, &ax)| {
            let (b, _, st, len) = slice_range(shape[ax], starts[k], ends[k], steps.map_or(1, |v| v[k]))?;
            Ok((ax, b, st, len))
        })
        .collect()
}

/// Transpose's `perm` for a rank-`r` input (default: the axes reversed): a permutation of 0..r.
pub fn perm(p: Option<&[i64]>, r: usize) -> Result<Vec<usize>, String> {
    let Some(p) = p else { return Ok((0..r).rev().collect()) };
    let axes: Vec<usize> = p.iter().map(|&d| axis(d, r)).collect::<Result<_, _>>()?;
    if axes.len() != r || (0..r).any(|a| !axes.contains(&a)) {
        return Err(format!("Transpose perm {p:?} of a rank-{r} input"));
    }
    Ok(axes)
}

pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}
