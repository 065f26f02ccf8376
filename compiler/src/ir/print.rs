//! The graph's text form, one line per item, and what [`super::parse`] reads back:
//!
//! ```text
//! input 0 "input_ids": i64 [batch,seq] (TokenIds)
//! weight 0 "embeddings.word_embeddings.weight": f32 [30522,384]
//! %0 = input#0() : i64 [batch,seq]
//! %1 = weight#0() "embeddings.word_embeddings.weight" : f32 [30522,384]
//! %2 = gather(%1, %0) : f32 [batch,seq,384]
//! %3 = const([0.5, 2])() : f32 [2]
//! output "last_hidden_state" = %2
//! ```
//!
//! Every attribute and constant value is printed (f32 values in Rust's shortest round-trip
//! form), so `parse(print(g))` is `g` up to node names, which are labels (the fingerprint ignores
//! them too).

use std::fmt::Write;

use kiln_runtime::graph::{fmt_shape, Graph, Op};

/// The op as the text form spells it: [`Op::name`], with a constant's every value.
pub fn op_text(op: &Op) -> String {
    match op {
        Op::Constant { values } if values.len() != 1 => {
            format!("const([{}])", values.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", "))
        }
        _ => op.name(),
    }
}

pub(crate) fn print(g: &Graph) -> String {
    let mut s = String::new();
    for (i, inp) in g.inputs.iter().enumerate() {
        let _ = writeln!(s, "input {i} {:?}: {} {} ({:?})", inp.name, inp.dtype, fmt_shape(&inp.shape), inp.role);
    }
    for (i, w) in g.weights.iter().enumerate() {
        let ints = w.int_bound.map(|b| format!(" ints ≤ {b}")).unwrap_or_default();
        let _ = writeln!(s, "weight {i} {:?}: {} [{}]{ints}", w.name, w.dtype, w.shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(","));
    }
    for (i, n) in g.nodes.iter().enumerate() {
        let args: Vec<String> = n.inputs.iter().map(|v| v.to_string()).collect();
        let extra = match &n.op {
            Op::Weight { index } => format!(" {:?}", g.weights[*index].name),
            _ => String::new(),
        };
        let _ = writeln!(s, "%{i} = {}({}){extra} : {} {}", op_text(&n.op), args.join(", "), n.dtype, fmt_shape(&n.shape));
    }
    for (o, name) in g.outputs.iter().zip(&g.output_names) {
        let _ = writeln!(s, "output {name:?} = {o}");
    }
    s
}
