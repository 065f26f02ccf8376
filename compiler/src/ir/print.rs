//! The graph's text form: one line per input, node and output. `ir::parse` reads it back.

use kiln_runtime::graph::{fmt_shape, Graph, Op};

pub(crate) fn print(g: &Graph) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for (i, inp) in g.inputs.iter().enumerate() {
        let _ = writeln!(s, "input {i} {}: {} {} ({:?})", inp.name, inp.dtype, fmt_shape(&inp.shape), inp.role);
    }
    for (i, n) in g.nodes.iter().enumerate() {
        let args: Vec<String> = n.inputs.iter().map(|v| v.to_string()).collect();
        let extra = match &n.op {
            Op::Weight { index } => format!(" \"{}\"", g.weights[*index].name),
            _ => String::new(),
        };
        let _ = writeln!(
            s,
            "%{i} = {}({}){extra} : {} {}",
            n.op.name(),
            args.join(", "),
            n.dtype,
            fmt_shape(&n.shape)
        );
    }
    for (o, name) in g.outputs.iter().zip(&g.output_names) {
        let _ = writeln!(s, "output {name} = {o}");
    }
    s
}
