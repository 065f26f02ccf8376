//! The order nodes are imported in. ONNX asks for graph nodes in topological order, but tools
//! that rewrite graphs (onnxruntime's float16 converter appends its Casts at the end, for one)
//! do not always keep it, and onnxruntime sorts before it runs; so does kiln. Kahn's algorithm,
//! stable: of the nodes whose inputs are all there, the earliest in the file comes first, so a
//! sorted graph keeps its order exactly.

use std::collections::{BTreeSet, HashMap, HashSet};

use super::proto::NodeProto;

/// Node indices in an order where every input is produced before it is read (`available`:
/// graph inputs and initializers). Nodes whose inputs never all appear (an undefined name, a
/// cycle) follow in file order, so the importer reports the first missing input by name.
pub fn topological(nodes: &[NodeProto], available: &HashSet<String>) -> Vec<usize> {
    let mut missing = vec![0usize; nodes.len()];
    let mut readers: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        let mut seen = HashSet::new();
        for inp in n.input.iter().filter(|x| !x.is_empty() && !available.contains(*x)) {
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
