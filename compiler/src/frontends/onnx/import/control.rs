//! Control flow: an `If` whose condition is known at import (a bucket fixes every shape, so a
//! guard like `If(Equal(Shape(x)[1], 1))` folds) is replaced by the nodes of the branch it
//! takes, imported in place; its outputs are that branch's outputs. A condition computed at run
//! time is `Unsupported` (kiln plans one straight-line program per bucket, as TensorRT builds
//! one engine per profile). `Loop` and `Scan` are not imported.

use super::super::order;
use super::super::proto::NodeProto;
use super::{unsup, Attrs, Fail, Importer, Val, R};

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
        for (o, bo) in n.output.iter().zip(&g.output) {
            let v = self.vals.get(bo.name()).cloned().ok_or_else(|| Fail::Invalid(format!("{which} never computes its output `{}`", bo.name())))?;
            if !o.is_empty() {
                self.vals.insert(o.clone(), v);
            }
        }
        Ok(())
    }
}
