//! Grouping: which nodes join which kernel (reverse topological order; see the module docs).

use kiln_runtime::graph::Op;

use super::*;

impl<'a> Fuser<'a> {
    /// Whether elementwise node `v` ends a chain of single-use, same-size elementwise nodes
    /// that starts at a single-use, ungrouped MatMul (a GEMM epilogue candidate).
    pub(super) fn gemm_fed(&self, v: usize) -> bool {
        let numel = self.numel(v);
        self.g.nodes[v].inputs.iter().any(|a| {
            let a = a.index();
            if !self.single_use(a) || self.group_of[a].is_some() || self.numel(a) != numel {
                return false;
            }
            match class(&self.g.nodes[a].op) {
                Class::MatMul => true,
                Class::Elem => self.gemm_fed(a),
                _ => false,
            }
        })
    }

    pub(super) fn add_group(&mut self, root: usize, kind: GroupKind, iter_numel: usize, members: Vec<usize>) {
        let gid = self.groups.len();
        for &m in &members {
            self.group_of[m] = Some(gid);
        }
        self.groups.push(Group { root, kind, iter_numel, members });
    }

    pub(super) fn join(&mut self, gid: usize, v: usize) {
        self.group_of[v] = Some(gid);
        self.groups[gid].members.push(v);
    }

    pub(super) fn group_nodes(&mut self) {
        let n = self.g.nodes.len();
        // Attention first (its intermediates would otherwise be claimed by other groups).
        for i in (0..n).rev() {
            if self.group_of[i].is_none() && matches!(self.g.nodes[i].op, Op::MatMul { .. }) {
                if let Some(m) = self.match_attention(i) {
                    let members = m.members.clone();
                    let numel = self.numel(i);
                    self.add_group(i, GroupKind::Attention(Box::new(m)), numel, members);
                }
            }
        }
        for i in (0..n).rev() {
            if self.group_of[i].is_some() {
                continue;
            }
            let c = class(&self.g.nodes[i].op);
            if matches!(c, Class::Leaf | Class::View) {
                continue;
            }
            // The one group holding every user, if any.
            let users_group = if self.is_output[i] || self.users[i].is_empty() {
                None
            } else {
                let gs: HashSet<Option<usize>> = self.users[i].iter().map(|&u| self.group_of[u]).collect();
                if gs.len() == 1 {
                    *gs.iter().next().unwrap()
                } else {
                    None
                }
            };
            let numel = self.numel(i);
            if let Some(gid) = users_group {
                let gr = &self.groups[gid];
                let fits = gr.iter_numel == numel;
                let joins = match (&gr.kind, c) {
                    (GroupKind::Elementwise, Class::Elem) => fits,
                    (GroupKind::Gemm { core }, Class::Elem) => {
                        fits && !self.g.nodes[*core].inputs.iter().any(|v| v.index() == i)
                    }
                    // A prologue takes elementwise producers, except a chain that a GEMM's
                    // epilogue can take (bias + residual go into the GEMM's output write).
                    (GroupKind::Norm { core }, Class::Elem) => {
                        fits && !self.g.nodes[*core].inputs[1..].iter().any(|v| v.index() == i) && !self.gemm_fed(i)
                    }
                    (GroupKind::Softmax { .. } | GroupKind::Reduce { .. }, Class::Elem) => fits && !self.gemm_fed(i),
                    (GroupKind::Elementwise, Class::MatMul) => fits,
                    _ => false,
                };
                if joins {
                    if c == Class::MatMul {
                        self.groups[gid].kind = GroupKind::Gemm { core: i };
                    }
                    self.join(gid, i);
                    continue;
                }
            }
            let (kind, iter_numel) = match c {
                Class::Elem => (GroupKind::Elementwise, numel),
                Class::MatMul => (GroupKind::Gemm { core: i }, numel),
                Class::Norm => (GroupKind::Norm { core: i }, numel),
                Class::Softmax => (GroupKind::Softmax { core: i }, numel),
                Class::Reduce => (GroupKind::Reduce { core: i }, self.numel(self.g.nodes[i].inputs[0].index())),
                Class::Gather => (GroupKind::Gather { core: i }, numel),
                Class::Concat => (GroupKind::Concat { core: i }, numel),
                Class::Leaf | Class::View => unreachable!(),
            };
            self.add_group(i, kind, iter_numel, vec![i]);
        }
    }

    // ---------------------------------------------------------------- buffers and views

}
