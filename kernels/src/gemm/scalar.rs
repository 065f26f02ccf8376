//! The portable tile kernel, A packing and epilogue (no SIMD).

use super::*;

/// # Safety
/// `a` holds kc·MR floats (`a_ld` = [`PACKED`]) or mr rows of kc floats at stride `a_ld`, `b`
/// kc·NR floats; `c` writable for mr rows of nr floats at stride ldc.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn kernel(
    kc: usize,
    a: *const f32,
    a_ld: usize,
    b: *const f32,
    _b_next: *const f32,
    c: *mut f32,
    ldc: usize,
    alpha: f32,
    beta: bool,
    mr: usize,
    nr: usize,
    _pf: (usize, usize),
    post: Option<TilePost>,
) {
    let mut acc = [[0.0f32; NR]; MR];
    for p in 0..kc {
        // SAFETY: p < kc, inside the panel.
        let bp = unsafe { std::slice::from_raw_parts(b.add(p * NR), NR) };
        for (i, row) in acc.iter_mut().enumerate() {
            let ai = match a_ld {
                // SAFETY: inside the packed strip (zero rows past mr).
                PACKED => unsafe { *a.add(p * MR + i) },
                // SAFETY: row i < mr, column p < kc of the source rows.
                ld if i < mr => unsafe { *a.add(i * ld + p) },
                _ => 0.0,
            };
            for j in 0..NR {
                row[j] += ai * bp[j];
            }
        }
    }
    // SAFETY: forwarded.
    unsafe { store(&acc, c, ldc, alpha, beta, mr, nr, post) }
}

/// C = post(alpha·acc (+ C if beta)) for the valid mr × nr part of a tile.
///
/// # Safety
/// `c` writable for mr rows of nr floats at stride ldc; `post`'s operands cover them.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn store(
    acc: &[[f32; NR]; MR],
    c: *mut f32,
    ldc: usize,
    alpha: f32,
    beta: bool,
    mr: usize,
    nr: usize,
    post: Option<TilePost>,
) {
    for (i, row) in acc.iter().enumerate().take(mr) {
        for (j, &v) in row.iter().enumerate().take(nr) {
            // SAFETY: i < mr, j < nr: inside the caller's C tile.
            unsafe {
                let cp = c.add(i * ldc + j);
                *cp = if beta { alpha * v + *cp } else { alpha * v };
            }
        }
    }
    if let Some(t) = post {
        // SAFETY: the tile and its epilogue operands (caller contract).
        unsafe { epilogue(c, ldc, mr, nr, t.row0, t.col0, t.epi, t.act) };
    }
}

/// # Safety
/// `a` readable for mc rows of kc floats at stride lda; `dst` writable for ceil(mc/MR)·MR·kc floats.
pub(super) unsafe fn pack_a(a: *const f32, lda: usize, mc: usize, kc: usize, _cols: usize, dst: *mut f32) {
    let mut d = dst;
    for s in (0..mc).step_by(MR) {
        let mr = MR.min(mc - s);
        for p in 0..kc {
            for i in 0..MR {
                // SAFETY: row s + i < mc, column p < kc; d stays within the strips.
                unsafe {
                    *d.add(i) = if i < mr {
                        *a.add((s + i) * lda + p)
                    } else {
                        0.0
                    };
                }
            }
            d = d.wrapping_add(MR);
        }
    }
}

/// # Safety
/// `c` is the tile (rows×cols at stride ldc); bias/residual (if set) cover columns col0+cols and rows row0+rows.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn epilogue(
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    row0: usize,
    col0: usize,
    e: &Epilogue,
    act: Activation,
) {
    for i in 0..rows {
        for j in 0..cols {
            // SAFETY: inside the tile and the epilogue operands' extents (caller contract).
            unsafe {
                let cp = c.add(i * ldc + j);
                let mut v = *cp;
                if !e.bias.is_null() {
                    v += *e.bias.add(col0 + j);
                }
                let r = (!e.residual.is_null()).then(|| *e.residual.add((row0 + i) * e.residual_stride + col0 + j));
                match r {
                    Some(r) if e.gated() => v *= act.apply(r),
                    Some(r) => v = act.apply(v) + r,
                    None => v = act.apply(v),
                }
                *cp = v;
            }
        }
    }
}
