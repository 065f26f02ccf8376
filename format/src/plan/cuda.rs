//! GPU plans as data: what `kiln-compiler`'s CUDA target produces for one bucket (PTX text, an
//! optional cubin, the launch list, the arena size, the I/O bindings and the weight table) and
//! its structural checks. Loading and launching it is `kiln_runtime::cuda`'s business.

use serde::{Deserialize, Serialize};

use crate::bucket::Bucket;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Version of the [`CudaPlanSpec`] layout; bumped whenever a field changes meaning.
pub const CUDA_PLAN_VERSION: u32 = 1;

/// One kernel argument of a recorded launch. Pointers are symbolic (arena offset, weight index,
/// constant index) and resolved to device addresses when the plan is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum KernelArg {
    /// `arena + offset` (a `T*` parameter).
    Arena { offset: u64 },
    /// The device buffer of graph weight `index` (a `const T*` parameter).
    Weight { index: u32 },
    /// The device buffer of plan constant `index` (a `const T*` parameter).
    Const { index: u32 },
    I32(i32),
    U32(u32),
    F32(f32),
    I64(i64),
}

/// One kernel launch of a plan, in execution order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaunchSpec {
    /// The `extern "C"` name of the kernel in the plan's PTX.
    pub kernel: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub shared_bytes: u32,
    pub args: Vec<KernelArg>,
}

/// A graph input or output living in the arena.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IoSlot {
    /// Byte offset in the arena; `None` for a graph input that no kernel reads (its type is
    /// still checked, nothing is copied).
    pub offset: Option<u64>,
    pub dtype: DType,
    /// Concrete shape for the plan's bucket.
    pub shape: Vec<usize>,
}

impl IoSlot {
    pub fn bytes(&self) -> u64 {
        (self.shape.iter().product::<usize>() * self.dtype.size()) as u64
    }
}

/// What the plan expects of one graph weight's device buffer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightEntry {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl WeightEntry {
    pub fn bytes(&self) -> u64 {
        (self.shape.iter().product::<usize>() * self.dtype.size()) as u64
    }
}

/// A compiled GPU plan for one bucket, as plain data: what an artifact file carries and what
/// `kiln_runtime::cuda::CudaDevice::load_plan` turns into a runnable plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CudaPlanSpec {
    pub version: u32,
    pub bucket: Bucket,
    /// The real architecture the code was built for, e.g. `sm_90`. The PTX targets the matching
    /// virtual architecture (`compute_90`), so any device of at least this capability can JIT it.
    pub arch: String,
    /// One PTX module holding every kernel of the plan (NUL-free text).
    pub ptx: String,
    /// The same module assembled by `ptxas` for exactly `arch`, when ptxas was available.
    pub cubin: Option<Vec<u8>>,
    pub arena_bytes: u64,
    pub launches: Vec<LaunchSpec>,
    /// Graph inputs, in `Graph::inputs` order.
    pub inputs: Vec<IoSlot>,
    /// Graph outputs, in `Graph::outputs` order.
    pub outputs: Vec<IoSlot>,
    /// The weight table the plan was compiled against, indexed like `Graph::weights`.
    pub weights: Vec<WeightEntry>,
    /// Constant tensors (little-endian bytes) the kernels read through [`KernelArg::Const`].
    pub constants: Vec<Vec<u8>>,
}

/// Parses `sm_90` / `sm_80` into (major, minor).
pub fn parse_arch(arch: &str) -> Option<(u32, u32)> {
    let n: u32 = arch.strip_prefix("sm_")?.trim_end_matches('a').parse().ok()?;
    if n < 10 {
        return None;
    }
    Some((n / 10, n % 10))
}

impl CudaPlanSpec {
    /// Checks the plan's internal consistency: version, architecture name, every launch's
    /// dimensions and every argument's bounds. A plan read from a file must pass this before it
    /// is loaded; a failure is an [`Error::Artifact`].
    pub fn validate(&self) -> Result<()> {
        self.check(true)
    }

    /// [`CudaPlanSpec::validate`] without looking at the code (for a plan whose PTX is not
    /// built yet, e.g. one run by a host emulator from its CUDA C).
    pub fn validate_layout(&self) -> Result<()> {
        self.check(false)
    }

    fn check(&self, with_code: bool) -> Result<()> {
        let bad = |m: String| Err(Error::Artifact { message: format!("GPU plan for bucket {}: {m}", self.bucket) });
        if self.version != CUDA_PLAN_VERSION {
            return bad(format!("layout version {} (this runtime reads {CUDA_PLAN_VERSION})", self.version));
        }
        if parse_arch(&self.arch).is_none() {
            return bad(format!("architecture `{}` is not of the form sm_XY", self.arch));
        }
        if self.ptx.contains('\0') {
            return bad("PTX text contains a NUL byte".into());
        }
        let entries = ptx_entries(&self.ptx);
        let check_slot = |what: &str, i: usize, s: &IoSlot| -> Result<()> {
            let Some(offset) = s.offset else {
                if what == "output" {
                    return Err(Error::Artifact {
                        message: format!("GPU plan for bucket {}: output {i} has no arena slot", self.bucket),
                    });
                }
                return Ok(());
            };
            if offset.checked_add(s.bytes()).is_none_or(|end| end > self.arena_bytes) {
                return Err(Error::Artifact {
                    message: format!(
                        "GPU plan for bucket {}: {what} {i} ({} bytes at {}) lies outside the {}-byte arena",
                        self.bucket,
                        s.bytes(),
                        offset,
                        self.arena_bytes
                    ),
                });
            }
            Ok(())
        };
        for (i, s) in self.inputs.iter().enumerate() {
            check_slot("input", i, s)?;
        }
        for (i, s) in self.outputs.iter().enumerate() {
            check_slot("output", i, s)?;
        }
        for (li, l) in self.launches.iter().enumerate() {
            if with_code && !entries.contains(&l.kernel) {
                return bad(format!("launch {li} names kernel `{}`, which the PTX does not define", l.kernel));
            }
            let threads: u64 = l.block.iter().map(|&b| b as u64).product();
            if l.grid.contains(&0) || l.block.contains(&0) || threads > 1024 {
                return bad(format!("launch {li} (`{}`) has grid {:?} block {:?}", l.kernel, l.grid, l.block));
            }
            for (ai, a) in l.args.iter().enumerate() {
                match *a {
                    KernelArg::Arena { offset } if offset > self.arena_bytes => {
                        return bad(format!("launch {li} argument {ai}: arena offset {offset} past {}", self.arena_bytes))
                    }
                    KernelArg::Weight { index } if index as usize >= self.weights.len() => {
                        return bad(format!("launch {li} argument {ai}: weight {index} of {}", self.weights.len()))
                    }
                    KernelArg::Const { index } if index as usize >= self.constants.len() => {
                        return bad(format!("launch {li} argument {ai}: constant {index} of {}", self.constants.len()))
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Total bytes of the plan's code (PTX and cubin).
    pub fn code_bytes(&self) -> usize {
        self.ptx.len() + self.cubin.as_ref().map_or(0, |c| c.len())
    }
}

/// The names of the `.entry` points of a PTX module.
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in ptx.lines() {
        let t = line.trim_start();
        let rest = if let Some(r) = t.strip_prefix(".visible .entry ") {
            r
        } else if let Some(r) = t.strip_prefix(".entry ") {
            r
        } else {
            continue;
        };
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$').collect();
        if !name.is_empty() {
            out.push(name);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    fn spec() -> CudaPlanSpec {
        CudaPlanSpec {
            version: CUDA_PLAN_VERSION,
            bucket: Bucket::new(1, 8),
            arch: "sm_90".into(),
            ptx: ".version 8.8\n.target sm_90\n.visible .entry k0(\n.param .u64 p0\n)\n{ ret; }\n".into(),
            cubin: None,
            arena_bytes: 1024,
            launches: vec![LaunchSpec {
                kernel: "k0".into(),
                grid: [1, 1, 1],
                block: [32, 1, 1],
                shared_bytes: 0,
                args: vec![KernelArg::Arena { offset: 0 }],
            }],
            inputs: vec![IoSlot { offset: Some(0), dtype: DType::I64, shape: vec![1, 8] }],
            outputs: vec![IoSlot { offset: Some(64), dtype: DType::F32, shape: vec![1, 8] }],
            weights: vec![],
            constants: vec![],
        }
    }

    #[test]
    fn valid_spec_passes_and_round_trips_through_bincode() {
        let s = spec();
        s.validate().unwrap();
        let bytes = bincode::serde::encode_to_vec(&s, bincode::config::standard()).unwrap();
        let (back, _): (CudaPlanSpec, usize) =
            bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn validate_rejects_bad_plans() {
        let mut s = spec();
        s.launches[0].kernel = "nope".into();
        assert!(matches!(s.validate(), Err(Error::Artifact { .. })));
        let mut s = spec();
        s.outputs[0].offset = Some(1000);
        assert!(s.validate().unwrap_err().to_string().contains("outside the 1024-byte arena"));
        let mut s = spec();
        s.launches[0].block = [2048, 1, 1];
        assert!(s.validate().is_err());
        let mut s = spec();
        s.launches[0].args.push(KernelArg::Weight { index: 0 });
        assert!(s.validate().is_err());
        let mut s = spec();
        s.arch = "compute_90".into();
        assert!(s.validate().is_err());
        let mut s = spec();
        s.version = 99;
        assert!(s.validate().is_err());
    }

    #[test]
    fn entries_and_arch_parse() {
        assert_eq!(ptx_entries(&spec().ptx), vec!["k0".to_string()]);
        assert_eq!(parse_arch("sm_90"), Some((9, 0)));
        assert_eq!(parse_arch("sm_80"), Some((8, 0)));
        assert_eq!(parse_arch("sm_90a"), Some((9, 0)));
        assert_eq!(parse_arch("gfx90"), None);
    }
}
