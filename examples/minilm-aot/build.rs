//! Compiles MiniLM plans for a few buckets into `$OUT_DIR/minilm.kiln`; `main.rs` embeds them.
use kiln_compiler::build::{precompile, Precompile};

fn main() {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("minilm.kiln");
    let spec = Precompile::minilm(&["1x16", "1x32", "1x64", "1x128", "8x128"]);
    if let Err(e) = precompile(&spec, &out) {
        panic!("kiln: precompiling MiniLM failed: {e}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
