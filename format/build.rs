//! Derives the artifact format's version from its schema: the text of every type this crate
//! serializes (each item carrying `#[derive(... Serialize ...)]`, comments and blank lines
//! dropped), hashed with SHA-256 into `$OUT_DIR/schema.rs`. bincode's layout of Rust types
//! changes silently when a field or variant does; deriving the version from those definitions
//! means an artifact from a build whose types differ is refused by version instead of
//! mis-decoded, and nobody has to remember to bump a number. (IREE versions its FlatBuffers
//! schemas by hand and wasmtime compares compiler and engine settings; a hash of the
//! definitions is the cheap equivalent for serde + bincode.)

use sha2::{Digest, Sha256};

const FILES: &[&str] = &[
    "src/artifact.rs",
    "src/bucket.rs",
    "src/dtype.rs",
    "src/graph.rs",
    "src/plan/cpu.rs",
    "src/plan/cuda.rs",
    "src/signature.rs",
];

/// The serialized items of `text`, normalized.
fn serialized_items(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().map(|l| l.split("//").next().unwrap_or("").trim()).collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].starts_with("#[derive(") && lines[i].contains("Serialize") {
            let mut item = String::new();
            let (mut depth, mut opened) = (0i32, false);
            while i < lines.len() {
                let l = lines[i];
                i += 1;
                if l.is_empty() {
                    continue;
                }
                item.push_str(l);
                item.push('\n');
                depth += l.matches('{').count() as i32 - l.matches('}').count() as i32;
                opened |= l.contains('{');
                if (opened && depth == 0) || (!opened && l.ends_with(';')) {
                    break;
                }
            }
            out.push(item);
        } else {
            i += 1;
        }
    }
    out
}

fn main() {
    let mut h = Sha256::new();
    for f in FILES {
        println!("cargo:rerun-if-changed={f}");
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("reading {f}: {e}"));
        for item in serialized_items(&text) {
            h.update(item.as_bytes());
        }
    }
    let hash: [u8; 32] = h.finalize().into();
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("schema.rs");
    std::fs::write(out, format!("/// SHA-256 of the serialized types' definitions (see build.rs).\npub const SCHEMA_HASH: [u8; 32] = {hash:?};\n"))
        .expect("writing schema.rs");
}
