//! Build-time precompilation, for a crate's `build.rs`:
//!
//! ```no_run
//! // build.rs
//! use kiln_compiler::build::{precompile, Precompile};
//! let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("minilm.kiln");
//! precompile(&Precompile::minilm(&["1x16", "1x128"]), &out).unwrap();
//! ```
//! and in the crate: `static PLAN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/minilm.kiln"));`,
//! run with `kiln_runtime::cpu::PrecompiledCpu` (the crate then depends at run time only on
//! `kiln-runtime`). With `target: "cuda:sm_90".into()` the artifact holds GPU plans instead, for
//! `kiln_runtime::cuda::PrecompiledCuda`.
//!
//! The graph comes from a model config, not from weights: plans are compiled without the
//! checkpoint, and the artifact's fingerprint ties them to any checkpoint with the same
//! architecture and weight table.

use std::path::{Path, PathBuf};

use kiln_runtime::{Bucket, Error, Graph, Result};

use crate::models::bert::{build_bert, BertConfig, BertOutputs};

/// What to precompile.
#[derive(Debug, Clone)]
pub struct Precompile {
    pub graph: Graph,
    pub buckets: Vec<Bucket>,
    /// The machines the plans are for, as `kiln compile --target` names them. Default `cpu`:
    /// x86-64-v3 (AVX2 + FMA), the portable target kiln's kernels are tuned for; `cpu-native`
    /// only when the build machine is the machine that runs the plans; `cuda:sm_XY` for GPU
    /// plans (NVRTC on the build machine, no GPU needed).
    pub target: String,
}

impl Precompile {
    /// all-MiniLM-L6-v2 (sentence-transformers weight names) for `buckets` like `"8x128"`.
    /// Panics on a malformed bucket string: it is a literal in a build script.
    pub fn minilm(buckets: &[&str]) -> Self {
        let graph = build_bert(&BertConfig::minilm_l6(), "", BertOutputs::default())
            .expect("the built-in MiniLM config builds");
        Precompile {
            graph,
            buckets: buckets.iter().map(|b| Bucket::parse(b).expect("bucket literal like 8x128")).collect(),
            target: "cpu".into(),
        }
    }

    /// A BERT model from its `config.json`; `prefix` is the weight-name prefix (`""` or `"bert."`).
    pub fn bert_config(config_json: &Path, prefix: &str, buckets: &[Bucket]) -> Result<Self> {
        let cfg = BertConfig::from_file(config_json)?;
        Ok(Precompile {
            graph: build_bert(&cfg, prefix, BertOutputs::default())?,
            buckets: buckets.to_vec(),
            target: "cpu".into(),
        })
    }
}

/// Compiles every bucket and writes one artifact to `out`. Prints one line per bucket to stderr
/// (cargo shows build-script output with `-vv`).
pub fn precompile(p: &Precompile, out: &Path) -> Result<PathBuf> {
    let target = crate::target::parse_target(&p.target)?;
    let t = std::time::Instant::now();
    let artifact = crate::target::build_artifact(&p.graph, &p.buckets, &*target, &mut |_| Ok(()))?;
    let bytes = artifact.to_bytes();
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, &e))?;
    }
    std::fs::write(out, &bytes).map_err(|e| Error::io(out, &e))?;
    eprintln!(
        "kiln: precompiled {} bucket(s) [{}] into {} ({} bytes, {:.0} ms)",
        p.buckets.len(),
        p.buckets.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(", "),
        out.display(),
        bytes.len(),
        t.elapsed().as_secs_f64() * 1e3
    );
    Ok(out.to_path_buf())
}
