//! Shape and dtype inference over the graph data: what each op's inputs must be and what it
//! produces, checked when a node is pushed and when a graph is validated (for a bucket, with its
//! concrete sizes). The compiler's machinery over `kiln_format::graph`, which holds data only.

use kiln_runtime::graph::{fmt_shape, Bucket, Dim, Graph, Node, Op, ValueId};
use kiln_runtime::{DType, Error, Result};

/// Building and checking graphs (methods on the data type, which lives in `kiln-format`).
pub trait GraphExt {
    /// Appends a node after inferring and checking its dtype and shape.
    fn push(&mut self, name: impl Into<String>, op: Op, inputs: Vec<ValueId>) -> Result<ValueId>;
    /// Like [`GraphExt::push`], with the output shape given for ops whose shape is an attribute
    /// (Reshape, Constant); it is checked against the input.
    fn push_shaped(&mut self, name: impl Into<String>, op: Op, inputs: Vec<ValueId>, shape: Option<Vec<Dim>>)
        -> Result<ValueId>;
    /// Checks every node of the graph structurally and, when `bucket` is given, with that
    /// bucket's concrete sizes (symbolic dims resolved). Errors name the node at fault.
    fn validate(&self, bucket: Option<Bucket>) -> Result<()>;
    /// A deterministic, human-readable listing of the graph, one node per line; `ir::parse`
    /// reads it back.
    fn print(&self) -> String;
}

impl GraphExt for Graph {
    fn push(&mut self, name: impl Into<String>, op: Op, inputs: Vec<ValueId>) -> Result<ValueId> {
        self.push_shaped(name, op, inputs, None)
    }

    fn push_shaped(
        &mut self,
        name: impl Into<String>,
        op: Op,
        inputs: Vec<ValueId>,
        shape: Option<Vec<Dim>>,
    ) -> Result<ValueId> {
        let name = name.into();
        for i in &inputs {
            if i.index() >= self.nodes.len() {
                return Err(Error::graph(&name, format!("input {i} is not defined before this node")));
            }
        }
        let (dtype, shape) = infer(self, &name, &op, &inputs, shape.as_deref())?;
        self.nodes.push(Node { name, op, inputs, dtype, shape });
        Ok(ValueId((self.nodes.len() - 1) as u32))
    }

    fn validate(&self, bucket: Option<Bucket>) -> Result<()> {
        self.check_structure()?;
        for (i, n) in self.nodes.iter().enumerate() {
            for inp in &n.inputs {
                if inp.index() >= i {
                    return Err(Error::graph(&n.name, format!("input {inp} is not defined before this node")));
                }
            }
            let (dt, shape) = infer(self, &n.name, &n.op, &n.inputs, Some(&n.shape))?;
            if dt != n.dtype || shape != n.shape {
                return Err(Error::graph(
                    &n.name,
                    format!(
                        "recorded type {} {} differs from inferred {} {}",
                        n.dtype,
                        fmt_shape(&n.shape),
                        dt,
                        fmt_shape(&shape)
                    ),
                ));
            }
            if let Some(b) = bucket {
                check_concrete(self, n, b)?;
            }
        }
        for o in &self.outputs {
            if o.index() >= self.nodes.len() {
                return Err(Error::graph("<graph>", format!("output {o} is not a node")));
            }
        }
        Ok(())
    }

    fn print(&self) -> String {
        crate::ir::print::print(self)
    }
}

/// Numpy broadcasting of symbolic shapes.
pub fn broadcast_shapes(node: &str, a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>> {
    let r = a.len().max(b.len());
    let mut out = Vec::with_capacity(r);
    for i in 0..r {
        let da = if i + a.len() >= r { a[i + a.len() - r] } else { Dim::Fixed(1) };
        let db = if i + b.len() >= r { b[i + b.len() - r] } else { Dim::Fixed(1) };
        let d = if da == db {
            da
        } else if da == Dim::Fixed(1) {
            db
        } else if db == Dim::Fixed(1) {
            da
        } else {
            return Err(Error::graph(
                node,
                format!("shapes {} and {} do not broadcast (dim {i}: {da} vs {db})", fmt_shape(a), fmt_shape(b)),
            ));
        };
        out.push(d);
    }
    Ok(out)
}

fn want_inputs(node: &str, op: &Op, inputs: &[ValueId], n: std::ops::RangeInclusive<usize>) -> Result<()> {
    if !n.contains(&inputs.len()) {
        return Err(Error::graph(
            node,
            format!("{} takes {}..={} inputs, got {}", op.name(), n.start(), n.end(), inputs.len()),
        ));
    }
    Ok(())
}

fn want_float(node: &str, g: &Graph, v: ValueId) -> Result<()> {
    let dt = g.node(v).dtype;
    if !dt.is_float() {
        return Err(Error::graph(node, format!("input {v} must be a float tensor, got {dt}")));
    }
    Ok(())
}

/// Symbolic product of dims: (fixed product, batch power, seq power).
fn dim_product(s: &[Dim]) -> (usize, u32, u32) {
    let mut p = (1usize, 0u32, 0u32);
    for d in s {
        match d {
            Dim::Fixed(n) => p.0 *= n,
            Dim::Batch => p.1 += 1,
            Dim::Seq => p.2 += 1,
        }
    }
    p
}

/// Infers dtype and shape of a node. `recorded` is the node's own shape, needed by ops whose
/// output shape is an attribute (Reshape, Constant, Input, Weight).
fn infer(g: &Graph, node: &str, op: &Op, inputs: &[ValueId], recorded: Option<&[Dim]>) -> Result<(DType, Vec<Dim>)> {
    let ishape = |k: usize| g.node(inputs[k]).shape.clone();
    let idtype = |k: usize| g.node(inputs[k]).dtype;
    match op {
        Op::Input { index } => {
            want_inputs(node, op, inputs, 0..=0)?;
            let spec = g
                .inputs
                .get(*index)
                .ok_or_else(|| Error::graph(node, format!("graph has no input #{index}")))?;
            Ok((spec.dtype, spec.shape.clone()))
        }
        Op::Weight { index } => {
            want_inputs(node, op, inputs, 0..=0)?;
            let spec = g
                .weights
                .get(*index)
                .ok_or_else(|| Error::graph(node, format!("graph has no weight #{index}")))?;
            Ok((spec.dtype, spec.shape.iter().map(|&d| Dim::Fixed(d)).collect()))
        }
        Op::Constant { values } => {
            want_inputs(node, op, inputs, 0..=0)?;
            let shape = recorded.map(|s| s.to_vec()).unwrap_or_else(|| {
                if values.len() == 1 { vec![] } else { vec![Dim::Fixed(values.len())] }
            });
            let (n, bp, sp) = dim_product(&shape);
            if bp + sp != 0 || n != values.len() {
                return Err(Error::graph(
                    node,
                    format!("constant of {} values cannot have shape {}", values.len(), fmt_shape(&shape)),
                ));
            }
            Ok((DType::F32, shape))
        }
        Op::MatMul { transpose_a, transpose_b } => {
            want_inputs(node, op, inputs, 2..=2)?;
            want_float(node, g, inputs[0])?;
            if idtype(0) != idtype(1) {
                return Err(Error::graph(node, format!("matmul of {} and {}", idtype(0), idtype(1))));
            }
            let (a, b) = (ishape(0), ishape(1));
            if a.len() < 2 || b.len() < 2 {
                return Err(Error::graph(
                    node,
                    format!("matmul needs rank >= 2, got {} and {}", fmt_shape(&a), fmt_shape(&b)),
                ));
            }
            let (m, ka) = if *transpose_a { (a[a.len() - 1], a[a.len() - 2]) } else { (a[a.len() - 2], a[a.len() - 1]) };
            let (kb, n) = if *transpose_b { (b[b.len() - 1], b[b.len() - 2]) } else { (b[b.len() - 2], b[b.len() - 1]) };
            if ka != kb {
                return Err(Error::graph(
                    node,
                    format!(
                        "matmul inner dims differ: {} · {} (k = {ka} vs {kb})",
                        fmt_shape(&a),
                        fmt_shape(&b)
                    ),
                ));
            }
            let mut out = broadcast_shapes(node, &a[..a.len() - 2], &b[..b.len() - 2])?;
            out.push(m);
            out.push(n);
            Ok((idtype(0), out))
        }
        Op::Binary(_) => {
            want_inputs(node, op, inputs, 2..=2)?;
            if idtype(0) != idtype(1) {
                return Err(Error::graph(node, format!("operands have dtypes {} and {}", idtype(0), idtype(1))));
            }
            Ok((idtype(0), broadcast_shapes(node, &ishape(0), &ishape(1))?))
        }
        Op::Unary(_) => {
            want_inputs(node, op, inputs, 1..=1)?;
            want_float(node, g, inputs[0])?;
            Ok((idtype(0), ishape(0)))
        }
        Op::Softmax { axis } => {
            want_inputs(node, op, inputs, 1..=2)?;
            want_float(node, g, inputs[0])?;
            let s = ishape(0);
            if *axis >= s.len() {
                return Err(Error::graph(node, format!("softmax axis {axis} out of range for {}", fmt_shape(&s))));
            }
            if inputs.len() == 2 {
                let b = broadcast_shapes(node, &s, &ishape(1))?;
                if b != s {
                    return Err(Error::graph(
                        node,
                        format!("mask {} does not broadcast to scores {}", fmt_shape(&ishape(1)), fmt_shape(&s)),
                    ));
                }
                if idtype(1) != idtype(0) {
                    return Err(Error::graph(node, format!("mask dtype {} differs from scores {}", idtype(1), idtype(0))));
                }
            }
            Ok((idtype(0), s))
        }
        Op::LayerNorm { .. } | Op::RmsNorm { .. } => {
            let n_in = if matches!(op, Op::LayerNorm { .. }) { 3 } else { 2 };
            want_inputs(node, op, inputs, n_in..=n_in)?;
            want_float(node, g, inputs[0])?;
            let s = ishape(0);
            let last = *s.last().ok_or_else(|| Error::graph(node, "normalization of a scalar"))?;
            for k in 1..n_in {
                if ishape(k) != vec![last] {
                    return Err(Error::graph(
                        node,
                        format!("scale/shift must have shape [{last}], got {}", fmt_shape(&ishape(k))),
                    ));
                }
            }
            Ok((idtype(0), s))
        }
        Op::Reshape => {
            want_inputs(node, op, inputs, 1..=1)?;
            let to = recorded.ok_or_else(|| Error::graph(node, "reshape needs a target shape"))?;
            let from = ishape(0);
            if dim_product(&from) != dim_product(to) {
                return Err(Error::graph(
                    node,
                    format!("cannot reshape {} into {}", fmt_shape(&from), fmt_shape(to)),
                ));
            }
            Ok((idtype(0), to.to_vec()))
        }
        Op::Transpose { perm } => {
            want_inputs(node, op, inputs, 1..=1)?;
            let s = ishape(0);
            let mut seen = vec![false; s.len()];
            if perm.len() != s.len() || perm.iter().any(|&p| p >= s.len() || std::mem::replace(&mut seen[p], true)) {
                return Err(Error::graph(node, format!("{perm:?} is not a permutation of rank {}", s.len())));
            }
            Ok((idtype(0), perm.iter().map(|&p| s[p]).collect()))
        }
        Op::Gather => {
            want_inputs(node, op, inputs, 2..=2)?;
            let t = ishape(0);
            if t.len() != 2 {
                return Err(Error::graph(node, format!("gather table must be rank 2, got {}", fmt_shape(&t))));
            }
            if !idtype(1).is_int() {
                return Err(Error::graph(node, format!("gather ids must be integers, got {}", idtype(1))));
            }
            let mut s = ishape(1);
            s.push(t[1]);
            Ok((idtype(0), s))
        }
        Op::Concat { axis } => {
            want_inputs(node, op, inputs, 1..=64)?;
            let s0 = ishape(0);
            if *axis >= s0.len() {
                return Err(Error::graph(node, format!("concat axis {axis} out of range for {}", fmt_shape(&s0))));
            }
            let mut total = 0usize;
            for k in 0..inputs.len() {
                let s = ishape(k);
                if idtype(k) != idtype(0) || s.len() != s0.len() {
                    return Err(Error::graph(node, format!("concat input {k} has type {} {}", idtype(k), fmt_shape(&s))));
                }
                for (d, (x, y)) in s.iter().zip(&s0).enumerate() {
                    if d != *axis && x != y {
                        return Err(Error::graph(
                            node,
                            format!("concat inputs differ off-axis: {} vs {}", fmt_shape(&s), fmt_shape(&s0)),
                        ));
                    }
                }
                total += s[*axis]
                    .fixed()
                    .ok_or_else(|| Error::graph(node, "concat along a symbolic dim is not supported"))?;
            }
            let mut out = s0;
            out[*axis] = Dim::Fixed(total);
            Ok((idtype(0), out))
        }
        Op::Slice { axis, start, end } => {
            want_inputs(node, op, inputs, 1..=1)?;
            let mut s = ishape(0);
            let bad = match end {
                Dim::Fixed(e) => start >= e,
                _ => *start != 0,
            };
            if *axis >= s.len() || bad {
                return Err(Error::graph(node, format!("bad slice axis {axis} {start}..{end} of {}", fmt_shape(&s))));
            }
            if let (Dim::Fixed(n), Dim::Fixed(e)) = (s[*axis], end) {
                if *e > n {
                    return Err(Error::graph(node, format!("slice {start}..{e} past dim of size {n}")));
                }
            }
            s[*axis] = match end {
                Dim::Fixed(e) => Dim::Fixed(e - start),
                d => *d,
            };
            Ok((idtype(0), s))
        }
        Op::Reduce { axes, keep_dims, .. } => {
            want_inputs(node, op, inputs, 1..=1)?;
            let s = ishape(0);
            if axes.is_empty() || axes.iter().any(|&a| a >= s.len()) || axes.windows(2).any(|w| w[0] >= w[1]) {
                return Err(Error::graph(node, format!("bad reduce axes {axes:?} for {}", fmt_shape(&s))));
            }
            let out = s
                .iter()
                .enumerate()
                .filter_map(|(i, &d)| {
                    if axes.contains(&i) {
                        keep_dims.then_some(Dim::Fixed(1))
                    } else {
                        Some(d)
                    }
                })
                .collect();
            Ok((idtype(0), out))
        }
        Op::Where => {
            want_inputs(node, op, inputs, 3..=3)?;
            if idtype(1) != idtype(2) {
                return Err(Error::graph(node, format!("where branches have dtypes {} and {}", idtype(1), idtype(2))));
            }
            let s = broadcast_shapes(node, &ishape(0), &ishape(1))?;
            Ok((idtype(1), broadcast_shapes(node, &s, &ishape(2))?))
        }
        Op::Cast { to } => {
            want_inputs(node, op, inputs, 1..=1)?;
            Ok((*to, ishape(0)))
        }
        Op::Precompiled { .. } => Err(Error::graph(
            node,
            "is an output of a precompiled plan: an artifact's graph carries its signature only, no ops to compile",
        )),
    }
}

/// Checks concrete sizes a symbolic check cannot (e.g. a slice past a symbolic dim, gather
/// tables of a resolved size, positive dims).
fn check_concrete(g: &Graph, n: &Node, b: Bucket) -> Result<()> {
    if n.shape.iter().any(|d| d.resolve(b) == 0) {
        return Err(Error::graph(&n.name, format!("has an empty dim in bucket {b}")));
    }
    if let Op::Slice { axis, end, .. } = &n.op {
        let size = g.node(n.inputs[0]).shape[*axis].resolve(b);
        let end = end.resolve(b);
        if end > size {
            return Err(Error::graph(&n.name, format!("slice end {end} past dim of size {size} in bucket {b}")));
        }
    }
    Ok(())
}
