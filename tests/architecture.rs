//! The layout rules of the workspace, checked on the source: no import cycle between the
//! top-level modules of any crate (`use crate::a` in module `b` and back, directly or through
//! others), and a thin runtime and a data-only format crate (no shape inference, no op meaning,
//! no code generation in either).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Top-level module → the crate's other top-level modules it names (`crate::x`), outside tests.
fn module_edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap();
        let top = rel.components().next().unwrap().as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        if top == "lib" || top == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for (i, _) in code.match_indices("crate::") {
            let name: String = code[i + 7..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if !name.is_empty() && name != top {
                edges.entry(top.clone()).or_default().insert(name);
            }
        }
    }
    edges
}

fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<(String, String)> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(x) = stack.pop() {
            for y in edges.get(&x).into_iter().flatten() {
                if seen.insert(y.clone()) {
                    stack.push(y.clone());
                }
            }
        }
        seen
    };
    let mut out = Vec::new();
    for (a, bs) in edges {
        for b in bs {
            if a < b && reach(b).contains(a) {
                out.push((a.clone(), b.clone()));
            }
        }
    }
    out
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn no_module_cycles_in_any_crate() {
    for c in ["format", "runtime", "compiler", "kernels", "testkit", "."] {
        let src = root().join(c).join("src");
        let found = cycles(&module_edges(&src));
        assert!(found.is_empty(), "{c}: modules that import each other: {found:?}");
    }
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    let mut e: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    e.entry("a".into()).or_default().insert("b".into());
    e.entry("b".into()).or_default().insert("c".into());
    assert!(cycles(&e).is_empty());
    e.entry("c".into()).or_default().insert("a".into());
    assert_eq!(cycles(&e).len(), 2);
}

#[test]
fn runtime_and_format_hold_no_compiler_machinery() {
    for c in ["format", "runtime"] {
        let mut files = Vec::new();
        rust_files(&root().join(c).join("src"), &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for needle in ["fn infer(g: &Graph", "fn broadcast_shapes(", "fn push_shaped(", "ops::unary", "cranelift_codegen", "nvrtc::"] {
                assert!(!text.contains(needle), "{} contains `{needle}`: compiler machinery", f.display());
            }
        }
    }
}
