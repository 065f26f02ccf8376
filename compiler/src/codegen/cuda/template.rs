//! The CUDA C templates of `kernels/cuda/` and their specialization: `{{KEY}}` placeholders are
//! replaced by text (static shapes, strides, generated index and expression code).

use kiln_runtime::{Error, Result};

pub const PRELUDE: &str = include_str!("../../../../kernels/cuda/prelude.cuh");
pub const ELEMENTWISE: &str = include_str!("../../../../kernels/cuda/elementwise.cuh");
pub const GATHER: &str = include_str!("../../../../kernels/cuda/gather.cuh");
pub const CONCAT: &str = include_str!("../../../../kernels/cuda/concat.cuh");
pub const ROWNORM: &str = include_str!("../../../../kernels/cuda/rownorm.cuh");
pub const REDUCE: &str = include_str!("../../../../kernels/cuda/reduce.cuh");
pub const GEMM_SIMT: &str = include_str!("../../../../kernels/cuda/gemm_simt.cuh");
pub const GEMM_MMA: &str = include_str!("../../../../kernels/cuda/gemm_mma.cuh");
pub const ATTENTION: &str = include_str!("../../../../kernels/cuda/attention.cuh");
/// The host emulation shim (C++20) that lets emitted kernels run without a GPU.
pub const EMU_H: &str = include_str!("../../../../kernels/cuda/emu.h");

/// Replaces every `{{KEY}}` of `template` by its value. Every key given must occur, and no
/// placeholder may remain: either is a bug in the emitter, reported as `Error::Backend`.
pub fn specialize(name: &str, template: &str, vars: &[(&str, String)]) -> Result<String> {
    let mut out = template.to_string();
    for (k, v) in vars {
        let pat = format!("{{{{{k}}}}}");
        if !out.contains(&pat) {
            return Err(Error::internal("cuda template", format!("CUDA template `{name}` has no placeholder {pat}")));
        }
        out = out.replace(&pat, v);
    }
    if let Some(p) = out.find("{{") {
        let end = out[p..].find("}}").map_or(out.len(), |e| p + e + 2);
        return Err(Error::internal("cuda template", format!("CUDA template `{name}`: placeholder {} left unfilled", &out[p..end])));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specialize_fills_and_checks() {
        assert_eq!(specialize("t", "a {{X}} b {{X}} {{Y}}", &[("X", "1".into()), ("Y", "2".into())]).unwrap(), "a 1 b 1 2");
        assert!(specialize("t", "a {{X}}", &[]).unwrap_err().to_string().contains("{{X}} left unfilled"));
        assert!(specialize("t", "a", &[("X", "1".into())]).is_err());
    }
}
