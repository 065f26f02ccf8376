//! The order nodes are imported in. ONNX asks for graph nodes in topological order, but tools
//! that rewrite graphs (onnxruntime's float16 converter appends its Casts at the end, for one)
//! do not always keep it, and onnxruntime sorts before it runs; so does kiln. Kahn's algorithm,
//! stable: of the nodes whose inputs are all there, the earliest in the file comes first, so a
//! sorted graph keeps its order exactly.

use std::collections::{BTreeSet, HashMap, HashSet};

use super::proto::{GraphProto, NodeProto};

/// The outer-scope values the subgraphs of `n` (an `If`'s branches, a `Loop`'s body) read: not
/// listed among its inputs, yet read before it runs.
pub fn implicit_inputs(n: &NodeProto) -> Vec<String> {
    let mut out = Vec::new();
    for a in &n.attribute {
        for g in a.g.iter().chain(&a.graphs) {
            subgraph_reads(g, &mut out);
        }
    }
    out
}

/// The names `g` reads that it does not define itself (its inputs, initializers, node outputs).
fn subgraph_reads(g: &GraphProto, out: &mut Vec<String>) {
    let defined: HashSet<&str> = g
        .input
        .iter()
        .map(|i| i.name())
        .chain(g.initializer.iter().map(|t| t.name()))
        .chain(g.node.iter().flat_map(|n| n.output.iter().map(String::as_str)))
        .collect();
    for n in &g.node {
        for i in n.input.iter().cloned().chain(implicit_inputs(n)) {
            if !i.is_empty() && !defined.contains(i.as_str()) && !out.contains(&i) {
                out.push(i);
            }
        }
    }
    for o in &g.output {
        if !defined.contains(o.name()) && !out.iter().any(|x| x == o.name()) {
            out.push(o.name().to_string());
        }
    }
}

/// Every value name read anywhere inside the subgraphs of `n` (for liveness: a value read only
/// there is still used).
pub fn subgraph_names(n: &NodeProto) -> Vec<String> {
    let mut out = Vec::new();
    for a in &n.attribute {
        for g in a.g.iter().chain(&a.graphs) {
            for m in &g.node {
                out.extend(m.input.iter().chain(&m.output).filter(|x| !x.is_empty()).cloned());
                out.extend(subgraph_names(m));
            }
            out.extend(g.output.iter().map(|o| o.name().to_string()));
        }
    }
    out
}

/// Node indices in an order where every input (and every outer value a subgraph reads) is
/// produced before it is read (`available`: graph inputs and initializers). Nodes whose inputs never all appear (an undefined name, a
/// cycle) follow in file order, so the importer reports the first missing input by name.
pub fn topological(nodes: &[NodeProto], available: &HashSet<String>) -> Vec<usize> {
    let mut missing = vec![0usize; nodes.len()];
    let mut readers: HashMap<&str, Vec<usize>> = HashMap::new();
    let implicit: Vec<Vec<String>> = nodes.iter().map(implicit_inputs).collect();
    for (i, n) in nodes.iter().enumerate() {
        let mut seen = HashSet::new();
        for inp in n.input.iter().chain(&implicit[i]).filter(|x| !x.is_empty() && !available.contains(*x)) {
            if seen.insert(inp.as_str()) {
                missing[i] += 1;
                readers.entry(inp.as_str()).or_default().push(i);
            }
        }
    }
    let mut ready: BTreeSet<usize> = (0..nodes.len()).filter(|&i| missing[i] == 0).collect();
    let mut order = Vec::with_capacity(nodes.len());
    let mut done = vec![false; nodes.len()];
    let mut produced: HashSet<&str> = HashSet::new();
    while let Some(i) = ready.pop_first() {
        order.push(i);
        done[i] = true;
        for out in nodes[i].output.iter().filter(|o| !o.is_empty()) {
            if !produced.insert(out.as_str()) {
                continue;
            }
            for &r in readers.get(out.as_str()).map(Vec::as_slice).unwrap_or(&[]) {
                missing[r] -= 1;
                if missing[r] == 0 {
                    ready.insert(r);
                }
            }
        }
    }
    order.extend((0..nodes.len()).filter(|&i| !done[i]));
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ins: &[&str], outs: &[&str]) -> NodeProto {
        NodeProto { input: ins.iter().map(|s| s.to_string()).collect(), output: outs.iter().map(|s| s.to_string()).collect(), ..Default::default() }
    }

    #[test]
    fn sorted_graphs_keep_their_order_and_others_are_sorted() {
        let avail: HashSet<String> = ["x".to_string()].into();
        // Already sorted: unchanged.
        let a = [node(&["x"], &["a"]), node(&["a", "x"], &["b"]), node(&["b", ""], &["c"])];
        assert_eq!(topological(&a, &avail), vec![0, 1, 2]);
        // A producer after its reader (a converter's appended Cast).
        let b = [node(&["x"], &["a"]), node(&["h"], &["y"]), node(&["a"], &["h"])];
        assert_eq!(topological(&b, &avail), vec![0, 2, 1]);
        // An undefined input and a cycle: kept, at the end, in file order.
        let c = [node(&["p"], &["q"]), node(&["q"], &["p"]), node(&["x"], &["z"]), node(&["nope"], &["w"])];
        assert_eq!(topological(&c, &avail), vec![2, 0, 1, 3]);
    }
}
