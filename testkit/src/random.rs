//! Test support shared by the middle-end and backend tests: a seeded random-graph generator
//! over the whole op set (with weights and inputs that keep values finite), random weights and
//! inputs for any graph (e.g. BERT), and a tolerance comparison.
//!
//! The generator builds valid graphs with symbolic `batch`/`seq` dims, exercising what the
//! middle-end rewrites: attention blocks in several spellings (scale on the scores or on Q,
//! `div` by √d, mask through `add` or the softmax's own input, K transposed by a flag or by a
//! transpose node, softmax guarded by `Where(IsNaN(p), 0, p)`), linear layers with bias/activation/residual, norms with residual adds,
//! softmax on any axis, reductions, views (reshape, transpose, slice), concat, gather, where,
//! casts, and fodder for the passes (`x*1`, `x+0`, identity and double transposes, repeated
//! subexpressions, constant subgraphs, dead nodes). Intermediates are sometimes also graph
//! outputs or reused, so fusion must sometimes refuse.

use kiln_compiler::ir::broadcast_shapes;
use kiln_runtime::graph::{BinaryOp, Bucket, Dim, Graph, InputRole, Op, ReduceOp, UnaryOp, ValueId};
use kiln_runtime::{DType, HostTensor, Result, TensorData};

use kiln_compiler::ops::unary::Domain;
use kiln_compiler::ir::GraphBuilder;

/// SplitMix64: small, seedable, good enough for test data.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

/// A generated graph with everything needed to run it.
#[derive(Debug, Clone)]
pub struct RandomCase {
    pub seed: u64,
    pub graph: Graph,
    pub bucket: Bucket,
    pub weights: Vec<HostTensor>,
    pub inputs: Vec<HostTensor>,
}

/// The graph, weights, inputs and bucket for `seed` (deterministic).
pub fn random_case(seed: u64) -> RandomCase {
    let mut rng = Rng::new(seed);
    let graph = random_graph(&mut rng).unwrap_or_else(|e| panic!("generator bug for seed {seed}: {e}"));
    let bucket = Bucket::new(1 + rng.below(3), 1 + rng.below(6));
    let weights = random_weights(&graph, &mut rng);
    let inputs = random_inputs(&graph, bucket, &mut rng);
    RandomCase { seed, graph, bucket, weights, inputs }
}

/// Weights for any graph: uniform values scaled by 1/√(fan-in) for matrices.
pub fn random_weights(graph: &Graph, rng: &mut Rng) -> Vec<HostTensor> {
    graph
        .weights
        .iter()
        .map(|w| {
            let n: usize = w.shape.iter().product();
            let scale = if w.shape.len() >= 2 { 1.0 / (w.shape[w.shape.len() - 1] as f32).sqrt() } else { 1.0 };
            let v: Vec<f64> = (0..n).map(|_| (rng.uniform(-1.0, 1.0) * scale) as f64).collect();
            HostTensor { shape: w.shape.clone(), data: TensorData::from_f64(w.dtype, &v) }
        })
        .collect()
}

/// The graph input a value comes from through view ops and casts, if any.
fn source_input(g: &Graph, mut v: ValueId) -> Option<usize> {
    loop {
        match &g.node(v).op {
            Op::Input { index } => return Some(*index),
            Op::Reshape | Op::Transpose { .. } | Op::Slice { .. } | Op::Cast { .. } => v = g.node(v).inputs[0],
            _ => return None,
        }
    }
}

/// Inputs for any graph at `bucket`: ids below every table they index, attention masks of
/// ones with random right padding (at least one real token per row), floats in [-1, 1).
pub fn random_inputs(graph: &Graph, bucket: Bucket, rng: &mut Rng) -> Vec<HostTensor> {
    let mut limit = vec![usize::MAX; graph.inputs.len()];
    for n in &graph.nodes {
        if let Op::Gather = n.op {
            if let Some(i) = source_input(graph, n.inputs[1]) {
                let rows = graph.node(n.inputs[0]).shape[0].resolve(bucket);
                limit[i] = limit[i].min(rows);
            }
        }
    }
    graph
        .inputs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let shape: Vec<usize> = spec.shape.iter().map(|d| d.resolve(bucket)).collect();
            let n: usize = shape.iter().product();
            let v: Vec<f64> = match spec.role {
                InputRole::AttentionMask if shape.len() == 2 => {
                    let (rows, cols) = (shape[0], shape[1]);
                    let mut v = vec![0.0; n];
                    for r in 0..rows {
                        let len = 1 + rng.below(cols);
                        for c in 0..len {
                            v[r * cols + c] = 1.0;
                        }
                    }
                    v
                }
                _ if spec.dtype.is_int() => {
                    let lim = if limit[i] == usize::MAX { 4 } else { limit[i] };
                    (0..n).map(|_| rng.below(lim) as f64).collect()
                }
                _ => (0..n).map(|_| rng.uniform(-1.0, 1.0) as f64).collect(),
            };
            HostTensor { shape, data: TensorData::from_f64(spec.dtype, &v) }
        })
        .collect()
}

/// Checks `got` against `want` elementwise: `|g - w| <= atol + rtol·|w|` (NaN only matches NaN).
pub fn compare(got: &[HostTensor], want: &[HostTensor], atol: f64, rtol: f64) -> std::result::Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} outputs, expected {}", got.len(), want.len()));
    }
    for (o, (g, w)) in got.iter().zip(want).enumerate() {
        if g.shape != w.shape || g.dtype() != w.dtype() {
            return Err(format!("output {o}: {} {:?}, expected {} {:?}", g.dtype(), g.shape, w.dtype(), w.shape));
        }
        let (gv, wv) = (g.data.to_f64_vec(), w.data.to_f64_vec());
        for (i, (a, b)) in gv.iter().zip(&wv).enumerate() {
            let ok = if b.is_nan() { a.is_nan() } else { (a - b).abs() <= atol + rtol * b.abs() };
            if !ok {
                return Err(format!("output {o} element {i}: got {a}, expected {b}"));
            }
        }
    }
    Ok(())
}

/// Random graph construction state.
struct Gen<'r> {
    b: GraphBuilder,
    rng: &'r mut Rng,
    /// Float values available as operands.
    pool: Vec<ValueId>,
    /// Additive attention mask [batch, 1, 1, seq], if the graph has a mask input.
    mask: Option<ValueId>,
    weights: usize,
}

fn fixed(n: usize) -> Dim {
    Dim::Fixed(n)
}

impl Gen<'_> {
    fn shape(&self, v: ValueId) -> Vec<Dim> {
        self.b.shape(v).to_vec()
    }

    fn weight(&mut self, shape: &[usize]) -> Result<ValueId> {
        self.weights += 1;
        let name = format!("w{}", self.weights);
        self.b.weight(&name, DType::F32, shape)
    }

    fn pick_value(&mut self) -> ValueId {
        // Prefer recent values: chains get long.
        let n = self.pool.len();
        if self.rng.chance(0.6) {
            self.pool[n - 1 - self.rng.below(n.min(3))]
        } else {
            self.pool[self.rng.below(n)]
        }
    }

    /// A value of `shape`'s trailing dims fit for broadcasting against it.
    fn operand_for(&mut self, v: ValueId) -> Result<ValueId> {
        let s = self.shape(v);
        let cands: Vec<ValueId> = self
            .pool
            .iter()
            .copied()
            .filter(|&u| u != v && broadcast_shapes("", &s, &self.shape(u)).map(|r| r == s).unwrap_or(false))
            .collect();
        if !cands.is_empty() && self.rng.chance(0.6) {
            return Ok(self.rng.pick(&cands));
        }
        match self.rng.below(4) {
            0 => {
                let c = self.rng.uniform(-1.5, 1.5);
                self.b.scalar(c)
            }
            1 => match s.last() {
                Some(Dim::Fixed(n)) => self.weight(&[*n]),
                _ => self.b.scalar(0.5),
            },
            2 => {
                // A small constant of the trailing fixed dims (folded/broadcast).
                let dims: Vec<usize> = s.iter().rev().take_while(|d| matches!(d, Dim::Fixed(_))).filter_map(|d| d.fixed()).collect();
                let dims: Vec<usize> = dims.into_iter().rev().collect();
                let keep = dims.len().min(1 + self.rng.below(2));
                let dims = &dims[dims.len() - keep..];
                let n: usize = dims.iter().product();
                let vals = (0..n).map(|_| self.rng.uniform(-1.0, 1.0)).collect();
                self.b.constant(vals, dims)
            }
            _ => Ok(v),
        }
    }

    /// `v` with finite, moderate values for exp/sqrt/recip.
    fn positive(&mut self, v: ValueId) -> Result<ValueId> {
        let sq = self.b.mul(v, v)?;
        let one = self.b.scalar(0.5 + self.rng.uniform(0.0, 1.0))?;
        self.b.add(sq, one)
    }

    fn unary(&mut self, v: ValueId) -> Result<ValueId> {
        let op = self.rng.pick(&kiln_compiler::ops::unary::ALL);
        match kiln_compiler::ops::unary::domain(op) {
            Domain::Bounded => {
                let t = self.b.tanh(v)?;
                self.b.unary(op, t)
            }
            Domain::Positive => {
                let p = self.positive(v)?;
                self.b.unary(op, p)
            }
            Domain::Any => self.b.unary(op, v),
        }
    }

    fn binary(&mut self, v: ValueId) -> Result<ValueId> {
        let u = self.operand_for(v)?;
        let (a, b) = if self.rng.chance(0.5) { (v, u) } else { (u, v) };
        match self.rng.below(6) {
            0 => self.b.add(a, b),
            1 => self.b.sub(a, b),
            2 => self.b.mul(a, b),
            3 => {
                let p = self.positive(u)?;
                self.b.div(v, p)
            }
            4 => self.b.max(a, b),
            _ => self.b.binary(BinaryOp::Min, a, b),
        }
    }

    /// `x @ W (+ bias) (activation)` over the last dim of `v`.
    fn linear(&mut self, v: ValueId) -> Result<Option<ValueId>> {
        let s = self.shape(v);
        let Some(Dim::Fixed(k)) = s.last().copied() else { return Ok(None) };
        if s.len() < 2 {
            return Ok(None);
        }
        let n = self.rng.pick(&[2usize, 3, 4, 6, 8]);
        let mut y = if self.rng.chance(0.6) {
            let w = self.weight(&[n, k])?;
            if self.rng.chance(0.3) {
                // Spelled as an explicit transpose (simplify turns it into the flag).
                let wt = self.b.transpose(w, &[1, 0])?;
                self.b.matmul(v, wt)?
            } else {
                self.b.matmul_t(v, w, false, true)?
            }
        } else {
            let w = self.weight(&[k, n])?;
            self.b.matmul(v, w)?
        };
        if self.rng.chance(0.3) {
            let c = self.b.scalar(self.rng.uniform(0.2, 1.5))?;
            y = self.b.mul(y, c)?;
        }
        if self.rng.chance(0.7) {
            let bias = self.weight(&[n])?;
            y = self.b.add(y, bias)?;
        }
        if self.rng.chance(0.5) {
            let op = self.rng.pick(&[UnaryOp::Gelu, UnaryOp::Tanh, UnaryOp::Relu, UnaryOp::Silu]);
            y = self.b.unary(op, y)?;
        }
        // A residual add when the shape allows it.
        if n == k && self.rng.chance(0.4) {
            y = self.b.add(y, v)?;
        }
        Ok(Some(y))
    }

    /// Self-attention over `x` = [.., seq, H] in one of several spellings.
    fn attention(&mut self, x: ValueId) -> Result<Option<ValueId>> {
        let s = self.shape(x);
        if s.len() != 3 || s[1] != Dim::Seq {
            return Ok(None);
        }
        let Dim::Fixed(h) = s[2] else { return Ok(None) };
        let heads = if h % 2 == 0 && self.rng.chance(0.7) { 2 } else { 1 };
        let d = h / heads;
        let proj = |g: &mut Self| -> Result<ValueId> {
            let w = g.weight(&[h, h])?;
            let y = g.b.matmul_t(x, w, false, true)?;
            let bias = g.weight(&[h])?;
            g.b.add(y, bias)
        };
        let (q, k, v) = (proj(self)?, proj(self)?, proj(self)?);
        let split = |g: &mut Self, t: ValueId, perm: &[usize]| -> Result<ValueId> {
            let r = g.b.reshape(t, vec![s[0], Dim::Seq, fixed(heads), fixed(d)])?;
            g.b.transpose(r, perm)
        };
        let mut q = split(self, q, &[0, 2, 1, 3])?;
        let v = split(self, v, &[0, 2, 1, 3])?;
        let scale = 1.0 / (d as f32).sqrt();
        let scale_on_q = self.rng.chance(0.2);
        if scale_on_q {
            let c = self.b.scalar(scale)?;
            q = self.b.mul(q, c)?;
        }
        let mut scores = match self.rng.below(3) {
            0 => {
                let k = split(self, k, &[0, 2, 1, 3])?;
                self.b.matmul_t(q, k, false, true)?
            }
            1 => {
                let k = split(self, k, &[0, 2, 3, 1])?;
                self.b.matmul(q, k)?
            }
            _ => {
                let k = split(self, k, &[0, 2, 1, 3])?;
                let kt = self.b.transpose(k, &[0, 1, 3, 2])?;
                self.b.matmul(q, kt)?
            }
        };
        if !scale_on_q {
            if self.rng.chance(0.5) {
                let c = self.b.scalar(scale)?;
                scores = self.b.mul(scores, c)?;
            } else {
                let c = self.b.scalar((d as f32).sqrt())?;
                scores = self.b.div(scores, c)?;
            }
        }
        let mut sm_mask = None;
        if let Some(m) = self.mask.filter(|_| s[0] == Dim::Batch) {
            if self.rng.chance(0.5) {
                sm_mask = Some(m);
            } else {
                scores = self.b.add(scores, m)?;
            }
        }
        // Sometimes the scores escape: fusion must not swallow them then.
        if self.rng.chance(0.1) {
            self.pool.push(scores);
        }
        let mut p = self.b.softmax(scores, 3, sm_mask)?;
        if self.rng.chance(0.3) {
            // PyTorch's SDPA export: `Where(IsNaN(p), 0, p)` (IsNaN as `p != p`, cast to a mask).
            let nan = self.b.binary(BinaryOp::Ne, p, p)?;
            let nan = self.b.cast(nan, DType::I64)?;
            let zero = self.b.scalar(0.0)?;
            p = self.b.where_(nan, zero, p)?;
        }
        let ctx = self.b.matmul(p, v)?;
        let ctx = self.b.transpose(ctx, &[0, 2, 1, 3])?;
        let out = self.b.reshape(ctx, vec![s[0], Dim::Seq, fixed(h)])?;
        Ok(Some(out))
    }

    fn norm(&mut self, v: ValueId) -> Result<Option<ValueId>> {
        let s = self.shape(v);
        let Some(Dim::Fixed(n)) = s.last().copied() else { return Ok(None) };
        let mut x = v;
        let same: Vec<ValueId> = self.pool.iter().copied().filter(|&u| u != v && self.shape(u) == s).collect();
        if !same.is_empty() && self.rng.chance(0.6) {
            let u = self.rng.pick(&same);
            x = self.b.add(x, u)?;
        }
        let gamma = self.weight(&[n])?;
        let eps = 1e-5;
        if self.rng.chance(0.7) {
            let beta = self.weight(&[n])?;
            Ok(Some(self.b.layer_norm(x, gamma, beta, eps)?))
        } else {
            Ok(Some(self.b.rms_norm(x, gamma, eps)?))
        }
    }

    fn softmax(&mut self, v: ValueId) -> Result<ValueId> {
        let r = self.shape(v).len().max(1);
        let axis = self.rng.below(r);
        let mut x = v;
        if self.rng.chance(0.4) {
            let c = self.b.scalar(self.rng.uniform(0.3, 2.0))?;
            x = self.b.mul(x, c)?;
        }
        let mask = if self.rng.chance(0.4) { Some(self.operand_for(v)?) } else { None };
        let mask = mask.filter(|&m| self.b.dtype(m) == DType::F32 && m != x);
        self.b.softmax(x, axis, mask)
    }

    fn reshape(&mut self, v: ValueId) -> Result<Option<ValueId>> {
        let s = self.shape(v);
        let k = s.iter().rev().take_while(|d| matches!(d, Dim::Fixed(_))).count();
        if k == 0 {
            // Add a unit dim in front.
            let mut t = vec![fixed(1)];
            t.extend(s);
            return Ok(Some(self.b.reshape(v, t)?));
        }
        let prod: usize = s[s.len() - k..].iter().filter_map(|d| d.fixed()).product();
        // A random factorization of the fixed suffix into 1..=3 dims.
        let mut dims = Vec::new();
        let mut rest = prod;
        for _ in 0..self.rng.below(3) {
            let divs: Vec<usize> = (2..=rest).filter(|d| rest.is_multiple_of(*d)).collect();
            if divs.is_empty() {
                break;
            }
            let d = self.rng.pick(&divs);
            dims.push(d);
            rest /= d;
        }
        dims.push(rest);
        if s.len() - k + dims.len() > 5 {
            return Ok(None);
        }
        let mut t: Vec<Dim> = s[..s.len() - k].to_vec();
        t.extend(dims.into_iter().map(fixed));
        Ok(Some(self.b.reshape(v, t)?))
    }

    fn transpose(&mut self, v: ValueId) -> Result<Option<ValueId>> {
        let r = self.shape(v).len();
        if r < 2 {
            return Ok(None);
        }
        let mut perm: Vec<usize> = (0..r).collect();
        for i in (1..r).rev() {
            let j = self.rng.below(i + 1);
            perm.swap(i, j);
        }
        Ok(Some(self.b.transpose(v, &perm)?))
    }

    fn slice(&mut self, v: ValueId) -> Result<Option<ValueId>> {
        let s = self.shape(v);
        let axes: Vec<usize> = (0..s.len()).filter(|&a| matches!(s[a], Dim::Fixed(n) if n >= 2)).collect();
        if axes.is_empty() {
            return Ok(None);
        }
        let a = self.rng.pick(&axes);
        let n = s[a].fixed().unwrap();
        let start = self.rng.below(n - 1);
        let end = start + 1 + self.rng.below(n - start);
        Ok(Some(self.b.slice(v, a, start, fixed(end))?))
    }

    fn concat(&mut self, v: ValueId) -> Result<Option<ValueId>> {
        let s = self.shape(v);
        let axes: Vec<usize> = (0..s.len()).filter(|&a| matches!(s[a], Dim::Fixed(_))).collect();
        if axes.is_empty() {
            return Ok(None);
        }
        let a = self.rng.pick(&axes);
        let others: Vec<ValueId> = self
            .pool
            .iter()
            .copied()
            .filter(|&u| {
                let t = self.shape(u);
                t.len() == s.len() && matches!(t[a], Dim::Fixed(_)) && (0..s.len()).all(|d| d == a || t[d] == s[d])
            })
            .collect();
        let u = self.rng.pick(&others);
        let xs = if self.rng.chance(0.5) { vec![v, u] } else { vec![u, v, u] };
        Ok(Some(self.b.concat(&xs, a)?))
    }

    fn reduce(&mut self, v: ValueId) -> Result<Option<ValueId>> {
        let r = self.shape(v).len();
        if r == 0 {
            return Ok(None);
        }
        let mut axes: Vec<usize> = (0..r).filter(|_| self.rng.chance(0.4)).collect();
        if axes.is_empty() {
            axes.push(self.rng.below(r));
        }
        let op = self.rng.pick(&[ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max]);
        let keep = self.rng.chance(0.5) || axes.len() == r;
        Ok(Some(self.b.reduce(op, v, &axes, keep)?))
    }

    fn where_(&mut self, v: ValueId) -> Result<ValueId> {
        // cond = relu(v - t): a threshold away from 0, where f32 and f64 results (underflow
        // to exactly 0 in one, a tiny positive in the other) would disagree.
        let t = self.b.scalar(self.rng.uniform(0.1, 0.4))?;
        let shifted = self.b.sub(v, t)?;
        let c = self.b.relu(shifted)?;
        let other = self.operand_for(v)?;
        if self.rng.chance(0.5) {
            self.b.where_(c, v, other)
        } else {
            self.b.where_(c, other, v)
        }
    }

    /// Work for the passes: identities, repeats, constant subgraphs, dead nodes.
    fn fodder(&mut self, v: ValueId) -> Result<ValueId> {
        match self.rng.below(6) {
            0 => {
                let one = self.b.scalar(1.0)?;
                self.b.mul(v, one)
            }
            1 => {
                let zero = self.b.scalar(0.0)?;
                let y = self.b.add(zero, v)?;
                let one = self.b.scalar(1.0)?;
                self.b.div(y, one)
            }
            2 => {
                let r = self.shape(v).len();
                let id: Vec<usize> = (0..r).collect();
                let t = self.b.transpose(v, &id)?;
                if r >= 2 {
                    let mut p: Vec<usize> = (0..r).collect();
                    p.swap(0, r - 1);
                    let t2 = self.b.transpose(t, &p)?;
                    self.b.transpose(t2, &p)
                } else {
                    Ok(t)
                }
            }
            3 => {
                // The same subexpression twice, combined (CSE merges them).
                let a = self.b.tanh(v)?;
                let b = self.b.tanh(v)?;
                self.b.add(a, b)
            }
            4 => {
                // A constant subgraph (folded) used by a live node.
                let c1 = self.b.scalar(self.rng.uniform(0.5, 1.5))?;
                let c2 = self.b.scalar(self.rng.uniform(0.5, 1.5))?;
                let c = self.b.mul(c1, c2)?;
                let c = self.b.sqrt(c)?;
                self.b.mul(v, c)
            }
            _ => {
                // A dead node, then a same-shape reshape.
                let _dead = self.b.exp(v)?;
                let s = self.shape(v);
                self.b.reshape(v, s)
            }
        }
    }
}

/// A random valid graph (see the module docs).
pub fn random_graph(rng: &mut Rng) -> Result<Graph> {
    let mut g = Gen { b: GraphBuilder::new(), rng, pool: Vec::new(), mask: None, weights: 0 };
    let h = g.rng.pick(&[4usize, 6, 8]);
    // The main activation [batch, seq, h]: an input, or embeddings of token ids.
    let x = if g.rng.chance(0.4) {
        let mut ids = g.b.input("input_ids", DType::I64, vec![Dim::Batch, Dim::Seq], InputRole::TokenIds)?;
        if g.rng.chance(0.3) {
            // Integer arithmetic and casts on the ids (exact): (ids + ids) - ids, via f32.
            let two = g.b.add(ids, ids)?;
            let back = g.b.sub(two, ids)?;
            let f = g.b.cast(back, DType::F32)?;
            ids = g.b.cast(f, DType::I64)?;
        }
        let table = g.weight(&[7, h])?;
        let mut e = g.b.gather(table, ids)?;
        if g.rng.chance(0.5) {
            let pos = g.weight(&[8, h])?;
            let p = g.b.slice(pos, 0, 0, Dim::Seq)?;
            e = g.b.add(e, p)?;
        }
        e
    } else {
        g.b.input("x", DType::F32, vec![Dim::Batch, Dim::Seq, fixed(h)], InputRole::Other)?
    };
    g.pool.push(x);
    if g.rng.chance(0.4) {
        let m = g.b.input("attention_mask", DType::I64, vec![Dim::Batch, Dim::Seq], InputRole::AttentionMask)?;
        let mf = g.b.cast(m, DType::F32)?;
        let one = g.b.scalar(1.0)?;
        let inv = g.b.sub(one, mf)?;
        let big = g.b.scalar(-10000.0)?;
        let add = g.b.mul(inv, big)?;
        g.mask = Some(g.b.reshape(add, vec![Dim::Batch, fixed(1), fixed(1), Dim::Seq])?);
    }
    if g.rng.chance(0.3) {
        let shape = vec![fixed(g.rng.pick(&[2usize, 3, 4])), fixed(h)];
        let y = g.b.input("y", DType::F32, shape, InputRole::Other)?;
        g.pool.push(y);
    }
    let max_steps = if g.rng.chance(0.2) { 24 } else { 12 };
    let steps = 2 + g.rng.below(max_steps);
    for _ in 0..steps {
        let v = g.pick_value();
        let r = match g.rng.below(17) {
            0 | 1 => g.linear(v)?,
            2 => g.attention(v)?,
            3 => Some(g.unary(v)?),
            4 | 5 => Some(g.binary(v)?),
            6 => g.norm(v)?,
            7 => Some(g.softmax(v)?),
            8 => g.reshape(v)?,
            9 => g.transpose(v)?,
            10 => g.slice(v)?,
            11 => g.concat(v)?,
            12 => g.reduce(v)?,
            13 => Some(g.where_(v)?),
            14 => Some(g.fodder(v)?),
            15 => {
                // A batched matmul of a value with its own transpose.
                let r = g.shape(v).len();
                if r >= 2 {
                    let mut p: Vec<usize> = (0..r).collect();
                    p.swap(r - 2, r - 1);
                    if g.rng.chance(0.5) {
                        Some(g.b.matmul_t(v, v, false, true)?)
                    } else {
                        let t = g.b.transpose(v, &p)?;
                        Some(g.b.matmul(t, v)?)
                    }
                } else {
                    None
                }
            }
            _ => {
                // Cast through an integer-free path: f32 -> f32 (removed) or a mask use.
                match g.mask {
                    Some(m) if g.shape(v).len() == 4 && broadcast_shapes("", &g.shape(v), &g.shape(m)).is_ok() => {
                        Some(g.b.add(v, m)?)
                    }
                    _ => Some(g.b.cast(v, DType::F32)?),
                }
            }
        };
        if let Some(r) = r {
            // Keep shapes small.
            let s = g.shape(r);
            let fixed_numel: usize = s.iter().filter_map(|d| d.fixed()).product();
            if s.len() <= 5 && fixed_numel <= 512 {
                g.pool.push(r);
            }
        }
    }
    let last = *g.pool.last().unwrap();
    g.b.output("out", last);
    let extra = g.rng.below(3);
    for i in 0..extra {
        let v = g.pool[g.rng.below(g.pool.len())];
        g.b.output(&format!("extra{i}"), v);
    }
    g.b.finish()
}

/// Whether NVRTC can be loaded, for tests that compile CUDA C: `false` (the test skips, with a
/// printed reason) when it cannot, except under `KILN_REQUIRE_NVRTC=1` (set by scripts/test.sh
/// after installing NVRTC, so in CI), where a missing NVRTC panics: those tests must run there.
pub fn nvrtc_or_skip() -> bool {
    use kiln_compiler::codegen::cuda::nvrtc::{missing_nvrtc_error, nvrtc_present};
    if nvrtc_present() {
        return true;
    }
    if std::env::var("KILN_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
        panic!("{} (KILN_REQUIRE_NVRTC=1: the NVRTC tests must run)", missing_nvrtc_error());
    }
    eprintln!("SKIPPED: {}", missing_nvrtc_error());
    false
}
