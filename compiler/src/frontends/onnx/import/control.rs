//! Control flow, resolved at import (kiln plans one straight-line program per bucket, as
//! TensorRT builds one engine per profile):
//!
//! - `If` whose condition is known (a bucket fixes every shape, so a guard like
//!   `If(Equal(Shape(x)[1], 1))` folds) is replaced by the nodes of the branch it takes.
//! - `Scan` is unrolled over its scan axis, whose length the bucket fixes: each step imports the
//!   body with the state and that step's slices bound to its inputs; the scan outputs are the
//!   steps' slices stacked.
//! - `Loop` is unrolled when its trip count is known and its condition stays known (a counted
//!   loop; one whose condition is computed at run time is `Unsupported`).
//!
//! Each step imports the body's nodes again under the same names (the values of the step before
//! are replaced), so a body costs its nodes once per step, as TVM's and TensorRT's unrolling does.

use kiln_runtime::graph::{Dim, Op, ValueId};

use super::super::order;
use super::super::proto::{GraphProto, NodeProto};
use super::super::tensor::Lit;
use super::{unsup, Attrs, Fail, Importer, Val, R};

/// Steps a Scan or Loop unrolls at most (the graph grows with each).
const MAX_STEPS: usize = 4096;

impl Importer<'_> {
    /// Imports `n`, an `If` of the default domain: binds its outputs.
    pub(super) fn inline_if(&mut self, n: &NodeProto, ins: &[Option<Val>], at: &Attrs) -> R<()> {
        let cond = match ins.first().cloned().flatten() {
            Some(Val::Lit(l)) => l,
            Some(Val::Node(_)) => return unsup("If on a condition computed at run time"),
            None => return Err(Fail::Invalid("If without a condition".into())),
        };
        let truth = match cond.floats()[..] {
            [c] => c != 0.0,
            _ => return Err(Fail::Invalid(format!("If condition of shape {:?} (one value)", cond.shape))),
        };
        let which = if truth { "then_branch" } else { "else_branch" };
        let g = at.graph(which).ok_or_else(|| Fail::Invalid(format!("If without its {which}")))?;
        if g.output.len() != n.output.len() {
            return Err(Fail::Invalid(format!("{which} has {} outputs, the If {}", g.output.len(), n.output.len())));
        }
        let outs = self.run_subgraph(which, g, Vec::new())?;
        self.bind_vals(n, outs);
        Ok(())
    }

    /// Imports the nodes of subgraph `g` (labelled `which` in errors) with its inputs bound to
    /// `bindings`, in order; returns its outputs.
    fn run_subgraph(&mut self, which: &str, g: &GraphProto, bindings: Vec<Val>) -> R<Vec<Val>> {
        if bindings.len() > g.input.len() {
            return Err(Fail::Invalid(format!("{which} takes {} inputs, {} given", g.input.len(), bindings.len())));
        }
        for (i, v) in g.input.iter().zip(bindings) {
            self.vals.insert(i.name().to_string(), v);
        }
        for t in &g.initializer {
            self.initializer(t.name(), t).map_err(|f| match f {
                Fail::Invalid(e) => Fail::Invalid(format!("{which} initializer `{}`: {e}", t.name())),
                f => f,
            })?;
        }
        let available = self.vals.keys().cloned().collect();
        for i in order::topological(&g.node, &available) {
            let m = &g.node[i];
            let label = if m.name().is_empty() { m.output.first().map(String::as_str).unwrap_or("") } else { m.name() };
            self.node_proto(m).map_err(|f| match f {
                Fail::Unsupported(e) => Fail::Unsupported(format!("{which}: node `{label}` ({}): {e}", m.op_type())),
                Fail::Invalid(e) => Fail::Invalid(format!("{which}: node `{label}` ({}): {e}", m.op_type())),
            })?;
        }
        g.output
            .iter()
            .map(|o| self.vals.get(o.name()).cloned().ok_or_else(|| Fail::Invalid(format!("{which} never computes its output `{}`", o.name()))))
            .collect()
    }

    /// Names `n`'s outputs by `vals` (a subgraph's).
    fn bind_vals(&mut self, n: &NodeProto, vals: Vec<Val>) {
        for (o, v) in n.output.iter().zip(vals) {
            if !o.is_empty() {
                self.vals.insert(o.clone(), v);
            }
        }
    }

    /// Imports `n`, a `Scan` (opset 9 on; opset 8's leading batch axis and sequence_lens
    /// refused) unrolled over its scan axis.
    pub(super) fn unroll_scan(&mut self, n: &NodeProto, ins: &[Option<Val>], at: &Attrs, opset: i64) -> R<()> {
        if opset < 9 {
            return unsup("Scan before opset 9 (its batch axis and sequence_lens)");
        }
        let body = at.graph("body").ok_or_else(|| Fail::Invalid("Scan without a body".into()))?;
        let m = usize::try_from(at.int("num_scan_inputs", 0)).ok().filter(|&m| m >= 1 && m <= ins.len()).ok_or_else(|| Fail::Invalid("num_scan_inputs".into()))?;
        let states = ins.len() - m;
        let outs_scan = body.output.len().checked_sub(states).ok_or_else(|| Fail::Invalid("Scan body with fewer outputs than states".into()))?;
        let axes_of = |name: &str, count: usize| -> Vec<i64> { at.ints(name).unwrap_or_else(|| vec![0; count]) };
        let (in_axes, in_dirs) = (axes_of("scan_input_axes", m), axes_of("scan_input_directions", m));
        let (out_axes, out_dirs) = (axes_of("scan_output_axes", outs_scan), axes_of("scan_output_directions", outs_scan));
        if in_axes.len() != m || in_dirs.len() != m || out_axes.len() != outs_scan || out_dirs.len() != outs_scan {
            return Err(Fail::Invalid("Scan axes or directions of the wrong length".into()));
        }
        let mut scans = Vec::new();
        let mut len = None;
        for (k, v) in ins[states..].iter().enumerate() {
            let v = v.clone().ok_or_else(|| Fail::Invalid(format!("scan input {k} is missing")))?;
            let id = self.node(&self.fresh("scan"), &v)?;
            let s = self.shape(&Val::Node(id));
            let ax = super::super::shape::axis(in_axes[k], s.len())?;
            if len.is_some_and(|l| l != s[ax]) {
                return Err(Fail::Invalid(format!("scan inputs of lengths {} and {}", len.unwrap_or(0), s[ax])));
            }
            len = Some(s[ax]);
            scans.push((id, ax, s, in_dirs[k] != 0));
        }
        let len = len.unwrap_or(0);
        if len == 0 || len > MAX_STEPS {
            return unsup(format!("a Scan of {len} steps (kiln unrolls 1 to {MAX_STEPS})"));
        }
        let mut state: Vec<Val> = ins[..states].iter().enumerate().map(|(k, v)| v.clone().ok_or_else(|| Fail::Invalid(format!("state {k} is missing")))).collect::<R<_>>()?;
        let mut collected: Vec<Vec<ValueId>> = vec![Vec::new(); outs_scan];
        let name = n.name().to_string();
        for step in 0..len {
            let mut bind = state.clone();
            for (id, ax, s, reverse) in &scans {
                let t = if *reverse { len - 1 - step } else { step };
                let sl = self.tmp(&name, Op::Slice { axis: *ax, start: t, end: Dim::Fixed(t + 1) }, vec![*id])?;
                let shape: Vec<usize> = s.iter().enumerate().filter(|&(d, _)| d != *ax).map(|(_, &v)| v).collect();
                bind.push(Val::Node(self.reshape(&self.fresh(&name), sl, &shape)?));
            }
            let outs = self.run_subgraph(&format!("Scan body, step {step}"), body, bind)?;
            state = outs[..states].to_vec();
            for (k, v) in outs[states..].iter().enumerate() {
                let id = self.node(&self.fresh(&name), v)?;
                collected[k].push(id);
            }
        }
        let mut results = state;
        for (k, mut steps) in collected.into_iter().enumerate() {
            if out_dirs[k] != 0 {
                steps.reverse();
            }
            results.push(Val::Node(self.stack(&name, steps, out_axes[k])?));
        }
        self.bind_vals(n, results);
        Ok(())
    }

    /// Imports `n`, a `Loop` with a known trip count and condition, unrolled.
    pub(super) fn unroll_loop(&mut self, n: &NodeProto, ins: &[Option<Val>], at: &Attrs) -> R<()> {
        let body = at.graph("body").ok_or_else(|| Fail::Invalid("Loop without a body".into()))?;
        let known = |v: &Option<Val>, what: &str| -> R<Option<i64>> {
            match v {
                None => Ok(None),
                Some(Val::Lit(l)) => Ok(l.ints().first().copied()),
                Some(Val::Node(_)) => unsup(format!("a Loop whose {what} is computed at run time")),
            }
        };
        let trips = known(ins.first().unwrap_or(&None), "trip count")?;
        let mut cond = known(ins.get(1).unwrap_or(&None), "condition")?.is_none_or(|c| c != 0);
        let Some(trips) = trips.filter(|&t| (0..=MAX_STEPS as i64).contains(&t)) else {
            return unsup(format!("a Loop without a trip count of 0 to {MAX_STEPS}"));
        };
        let carried = ins.len().saturating_sub(2);
        let mut state: Vec<Val> = ins.iter().skip(2).enumerate().map(|(k, v)| v.clone().ok_or_else(|| Fail::Invalid(format!("loop-carried value {k} is missing")))).collect::<R<_>>()?;
        let scan_outs = body.output.len().checked_sub(1 + carried).ok_or_else(|| Fail::Invalid("Loop body with too few outputs".into()))?;
        let mut collected: Vec<Vec<ValueId>> = vec![Vec::new(); scan_outs];
        let name = n.name().to_string();
        let mut step = 0;
        while cond && step < trips {
            let mut bind = vec![Val::Lit(Lit::int(vec![], vec![step])), Val::Lit(Lit::int(vec![], vec![1]))];
            bind.extend(state.iter().cloned());
            let outs = self.run_subgraph(&format!("Loop body, iteration {step}"), body, bind)?;
            cond = match &outs[0] {
                Val::Lit(l) => l.floats().first().is_some_and(|&c| c != 0.0),
                Val::Node(_) => return unsup("a Loop whose condition the body computes at run time"),
            };
            state = outs[1..1 + carried].to_vec();
            for (k, v) in outs[1 + carried..].iter().enumerate() {
                let id = self.node(&self.fresh(&name), v)?;
                collected[k].push(id);
            }
            step += 1;
        }
        let mut results = state;
        for steps in collected {
            if steps.is_empty() {
                return unsup("a Loop that runs no iteration but has scan outputs (kiln has no empty tensors)");
            }
            results.push(Val::Node(self.stack(&name, steps, 0)?));
        }
        self.bind_vals(n, results);
        Ok(())
    }

    /// `steps` (each of one shape) stacked along a new axis `axis` (negative: from the end).
    fn stack(&mut self, name: &str, steps: Vec<ValueId>, axis: i64) -> R<ValueId> {
        let s = self.shape(&Val::Node(steps[0]));
        let ax = super::super::shape::axis(axis, s.len() + 1)?;
        let mut one: Vec<usize> = s.clone();
        one.insert(ax, 1);
        let mut parts = Vec::new();
        for v in steps {
            if self.shape(&Val::Node(v)) != s {
                return Err(Fail::Invalid(format!("scan outputs of shapes {s:?} and {:?}", self.shape(&Val::Node(v)))));
            }
            parts.push(self.reshape(&self.fresh(name), v, &one)?);
        }
        if parts.len() == 1 {
            return Ok(parts[0]);
        }
        self.tmp(name, Op::Concat { axis: ax }, parts)
    }
}
