//! The numeric kernels of the reference interpreter: plain f64 loops over row-major buffers.
//!
//! Every kernel writes a whole output buffer that `lower` allocated; none allocates. Operands that
//! are read through broadcasting, a permutation or a slice go through a [`Walk`]: the iteration
//! space is cut into rows (its last dim), and each operand has its own strides, so the inner loop
//! is a plain strided loop and only the row start needs index arithmetic.

use half::{bf16, f16};
use kiln_runtime::graph::{BinaryOp, ReduceOp, UnaryOp};
use kiln_runtime::DType;

use crate::ops;

/// Row-major strides of `shape`.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Strides that read an operand of shape `from` as if it were broadcast (numpy rules: dims
/// aligned on the right, a dim of 1 repeats) to the shape `to`. Broadcast dims get stride 0.
pub fn broadcast_strides(from: &[usize], to: &[usize]) -> Vec<usize> {
    debug_assert!(from.len() <= to.len());
    let own = strides(from);
    let lead = to.len() - from.len();
    (0..to.len())
        .map(|d| if d < lead || from[d - lead] == 1 { 0 } else { own[d - lead] })
        .collect()
}

/// A walk over the rows (last dim) of an iteration shape, with `N` operands each addressed by its
/// own strides and base offset. A rank-0 shape walks one row of one element.
#[derive(Debug, Clone)]
pub struct Walk<const N: usize> {
    shape: Vec<usize>,
    strides: [Vec<usize>; N],
    base: [usize; N],
}

impl<const N: usize> Walk<N> {
    pub fn new(shape: &[usize], strides: [Vec<usize>; N]) -> Self {
        let (shape, strides) = if shape.is_empty() {
            (vec![1], std::array::from_fn(|_| vec![0]))
        } else {
            (shape.to_vec(), strides)
        };
        debug_assert!(strides.iter().all(|s| s.len() == shape.len()));
        Walk { shape, strides, base: [0; N] }
    }

    pub fn with_base(mut self, base: [usize; N]) -> Self {
        self.base = base;
        self
    }

    /// Elements per row.
    pub fn row_len(&self) -> usize {
        *self.shape.last().expect("a walk has rank >= 1")
    }

    /// Operand `k`'s stride along a row.
    pub fn step(&self, k: usize) -> usize {
        *self.strides[k].last().expect("a walk has rank >= 1")
    }

    /// Calls `f` with every operand's offset of each row's first element, rows in row-major order.
    pub fn for_each_row(&self, mut f: impl FnMut([usize; N])) {
        let r = self.shape.len();
        let rows: usize = self.shape[..r - 1].iter().product();
        for row in 0..rows {
            let mut off = self.base;
            let mut rest = row;
            for d in (0..r - 1).rev() {
                let i = rest % self.shape[d];
                rest /= self.shape[d];
                for (o, s) in off.iter_mut().zip(&self.strides) {
                    *o += i * s[d];
                }
            }
            f(off);
        }
    }
}

/// Elementwise binary op; `walk` operands are [out (contiguous), a, b]. `int` gives integer
/// division (truncating toward zero) for integer tensors.
pub fn binary(op: BinaryOp, int: bool, walk: &Walk<3>, out: &mut [f64], a: &[f64], b: &[f64]) {
    binary_with(walk, out, a, b, |x, y| ops::eval::binary(op, int, x, y))
}

fn binary_with(walk: &Walk<3>, out: &mut [f64], a: &[f64], b: &[f64], f: impl Fn(f64, f64) -> f64) {
    let (n, sa, sb) = (walk.row_len(), walk.step(1), walk.step(2));
    walk.for_each_row(|[o, ia, ib]| {
        for (i, y) in out[o..o + n].iter_mut().enumerate() {
            *y = f(a[ia + i * sa], b[ib + i * sb]);
        }
    });
}

pub fn unary(op: UnaryOp, out: &mut [f64], x: &[f64]) {
    for (y, &v) in out.iter_mut().zip(x) {
        *y = ops::eval::unary(op, v);
    }
}

/// Rounds `v` to what a value of `to` can hold: floats round to nearest, integers truncate toward
/// zero (saturating at the type's range; NaN becomes 0), exactly like storing into `to`.
pub fn cast_value(to: DType, v: f64) -> f64 {
    match to {
        DType::F32 => v as f32 as f64,
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        DType::I64 => v as i64 as f64,
        DType::I32 => v as i32 as f64,
    }
}

pub fn cast(to: DType, out: &mut [f64], x: &[f64]) {
    for (y, &v) in out.iter_mut().zip(x) {
        *y = cast_value(to, v);
    }
}

/// Softmax in place over the middle dim of `y` seen as `[outer, n, inner]`: subtracts the max
/// first, so large inputs do not overflow.
pub fn softmax_in_place(y: &mut [f64], outer: usize, n: usize, inner: usize) {
    for o in 0..outer {
        for j in 0..inner {
            let base = o * n * inner + j;
            let mut m = f64::NEG_INFINITY;
            for i in 0..n {
                m = m.max(y[base + i * inner]);
            }
            let mut sum = 0.0;
            for i in 0..n {
                let e = (y[base + i * inner] - m).exp();
                y[base + i * inner] = e;
                sum += e;
            }
            for i in 0..n {
                y[base + i * inner] /= sum;
            }
        }
    }
}

/// LayerNorm over rows of `h`: `(x - mean) / sqrt(var + eps) * gamma + beta`, biased variance.
pub fn layer_norm(out: &mut [f64], x: &[f64], gamma: &[f64], beta: &[f64], h: usize, eps: f64) {
    for (yr, xr) in out.chunks_exact_mut(h).zip(x.chunks_exact(h)) {
        let mean = xr.iter().sum::<f64>() / h as f64;
        let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / h as f64;
        let inv = 1.0 / (var + eps).sqrt();
        for (((y, &v), &g), &b) in yr.iter_mut().zip(xr).zip(gamma).zip(beta) {
            *y = (v - mean) * inv * g + b;
        }
    }
}

/// RmsNorm over rows of `h`: `x / sqrt(mean(x²) + eps) * gamma`.
pub fn rms_norm(out: &mut [f64], x: &[f64], gamma: &[f64], h: usize, eps: f64) {
    for (yr, xr) in out.chunks_exact_mut(h).zip(x.chunks_exact(h)) {
        let ms = xr.iter().map(|v| v * v).sum::<f64>() / h as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((y, &v), &g) in yr.iter_mut().zip(xr).zip(gamma) {
            *y = v * inv * g;
        }
    }
}

/// Strided copy; `walk` operands are [out (contiguous), x].
pub fn copy(walk: &Walk<2>, out: &mut [f64], x: &[f64]) {
    let (n, sx) = (walk.row_len(), walk.step(1));
    walk.for_each_row(|[o, ix]| {
        for (i, y) in out[o..o + n].iter_mut().enumerate() {
            *y = x[ix + i * sx];
        }
    });
}

/// `cond != 0 ? a : b`; `walk` operands are [out (contiguous), cond, a, b].
pub fn where_(walk: &Walk<4>, out: &mut [f64], cond: &[f64], a: &[f64], b: &[f64]) {
    let (n, sc, sa, sb) = (walk.row_len(), walk.step(1), walk.step(2), walk.step(3));
    walk.for_each_row(|[o, ic, ia, ib]| {
        for (i, y) in out[o..o + n].iter_mut().enumerate() {
            *y = if cond[ic + i * sc] != 0.0 { a[ia + i * sa] } else { b[ib + i * sb] };
        }
    });
}

/// Reduction; `walk` runs over the input's shape with operands [x (contiguous), out (stride 0
/// on the reduced axes)]. `count` is the number of elements folded into each output.
pub fn reduce(op: ReduceOp, int: bool, walk: &Walk<2>, out: &mut [f64], x: &[f64], count: usize) {
    out.fill(match op {
        ReduceOp::Sum | ReduceOp::Mean => 0.0,
        ReduceOp::Max => f64::NEG_INFINITY,
    });
    let (n, so) = (walk.row_len(), walk.step(1));
    walk.for_each_row(|[ix, io]| {
        for (i, &v) in x[ix..ix + n].iter().enumerate() {
            let t = &mut out[io + i * so];
            *t = match op {
                ReduceOp::Sum | ReduceOp::Mean => *t + v,
                ReduceOp::Max => ops::eval::binary(BinaryOp::Max, false, *t, v),
            };
        }
    });
    if op == ReduceOp::Mean {
        for t in out.iter_mut() {
            *t /= count as f64;
            if int {
                *t = t.trunc();
            }
        }
    }
}

/// Rows of a `[vocab, h]` table picked by `ids`. On an id out of `[0, vocab)` returns its
/// position in `ids` and its value.
pub fn gather(out: &mut [f64], table: &[f64], ids: &[f64], vocab: usize, h: usize) -> Result<(), (usize, f64)> {
    for (p, (&id, row)) in ids.iter().zip(out.chunks_exact_mut(h)).enumerate() {
        if !(id >= 0.0 && id < vocab as f64 && id.fract() == 0.0) {
            return Err((p, id));
        }
        let r = id as usize;
        row.copy_from_slice(&table[r * h..(r + 1) * h]);
    }
    Ok(())
}

/// Concatenation: `out` is `[outer, row]`; part `k` is `[outer, chunk_k]` and lands at its
/// running offset inside each row.
pub fn concat(out: &mut [f64], parts: &[(&[f64], usize)], outer: usize) {
    let row: usize = parts.iter().map(|p| p.1).sum();
    let mut at = 0;
    for &(x, chunk) in parts {
        for o in 0..outer {
            out[o * row + at..o * row + at + chunk].copy_from_slice(&x[o * chunk..(o + 1) * chunk]);
        }
        at += chunk;
    }
}

/// Transposes each of the `src.len() / (rows * cols)` row-major `[rows, cols]` matrices of `src`
/// into `dst` as `[cols, rows]`.
pub fn transpose_matrices(src: &[f64], rows: usize, cols: usize, dst: &mut [f64]) {
    let size = rows * cols;
    for (s, d) in src.chunks_exact(size).zip(dst.chunks_exact_mut(size)) {
        for r in 0..rows {
            for (c, &v) in s[r * cols..(r + 1) * cols].iter().enumerate() {
                d[c * rows + r] = v;
            }
        }
    }
}

/// `c = a @ b` for row-major `a: [m, k]`, `b: [k, n]`, `c: [m, n]`: an i-k-j loop, so the
/// inner loop runs over contiguous rows of `b` and `c`.
pub fn gemm(c: &mut [f64], a: &[f64], b: &[f64], m: usize, k: usize, n: usize) {
    for i in 0..m {
        let crow = &mut c[i * n..(i + 1) * n];
        crow.fill(0.0);
        for (p, &av) in a[i * k..(i + 1) * k].iter().enumerate() {
            for (cv, &bv) in crow.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *cv += av * bv;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_and_broadcast() {
        assert_eq!(strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(strides(&[]), Vec::<usize>::new());
        assert_eq!(broadcast_strides(&[3, 1], &[2, 3, 4]), vec![0, 1, 0]);
        assert_eq!(broadcast_strides(&[], &[2, 2]), vec![0, 0]);
    }

    #[test]
    fn walk_rows() {
        let w = Walk::new(&[2, 3], [strides(&[2, 3]), vec![1, 2]]).with_base([0, 10]);
        let mut rows = vec![];
        w.for_each_row(|o| rows.push(o));
        assert_eq!(rows, vec![[0, 10], [3, 11]]);
        assert_eq!((w.row_len(), w.step(1)), (3, 2));
    }
}
