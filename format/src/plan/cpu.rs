//! CPU plans as data: what `kiln-compiler`'s CPU target produces for one bucket and an artifact
//! stores — position-independent x86-64 code, the kernel steps, the arena layout and the weight
//! slots — with the checks that need no code to run. Mapping and running it is
//! `kiln_runtime::cpu`'s business.

use serde::{Deserialize, Serialize};

use crate::bucket::Bucket;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::features::has_cpu_feature;
use crate::graph::WeightConcat;

/// Where a graph input or output lives in the arena.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub offset: usize,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl Binding {
    pub fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }
}

/// One kernel call of the schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuStep {
    /// Kernel name, for reports and profiles.
    pub name: String,
    /// Byte offset of the kernel's entry in the code.
    pub entry: u32,
    /// How many parallel tasks the kernel is split into (1 = run once on the calling thread).
    pub tasks: u32,
}

/// Status codes kernels return. 1..=5 are `kiln_kernels::KernelError` codes passed through
/// from a kernel-table entry (GEMM, attention).
pub mod status {
    pub const OK: i32 = 0;
    /// A gather id outside the table.
    pub const GATHER_OUT_OF_RANGE: i32 = 16;

    /// Words for a status code.
    pub fn describe(code: i32) -> &'static str {
        match code {
            0 => "ok",
            1 => "a kernel-table call got a buffer too small for its shape",
            2 => "a kernel-table call got a stride smaller than its row",
            3 => "a kernel-table call got too little scratch",
            4 => "a kernel-table call got an unknown activation",
            5 => "a kernel-table call got an invalid argument",
            GATHER_OUT_OF_RANGE => "a gather id is outside the embedding table (ids must be in 0..rows)",
            _ => "unknown status",
        }
    }
}

/// A compiled CPU plan for one bucket, as plain data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuPlanImage {
    pub bucket: Bucket,
    pub code: Vec<u8>,
    pub steps: Vec<CpuStep>,
    pub arena_bytes: usize,
    pub inputs: Vec<Binding>,
    pub outputs: Vec<Binding>,
    /// x86 features the code uses (`avx`, `avx2`, `fma`, ...).
    pub required_features: Vec<String>,
    /// Constant bytes written into the arena at load: `(offset, bytes)`. Kernels never write
    /// these ranges.
    pub arena_init: Vec<(usize, Vec<u8>)>,
    /// Entry `i` of the weights pointer array the code receives: which checkpoint tensor, in
    /// which layout.
    pub weights: Vec<WeightSlot>,
    /// The kernel-table ABI version the code calls (`kiln_kernels::table::KERNEL_ABI_VERSION`).
    pub kernel_abi: u32,
    /// Threads the kernel-table scratch (GEMM, attention) was sized for; more threads in the
    /// pool than this are not used by those kernels.
    pub scratch_threads: u32,
}

fn range_ok(offset: usize, len: usize, total: usize) -> bool {
    offset.checked_add(len).is_some_and(|end| end <= total)
}

impl CpuPlanImage {
    /// Checks everything that can be checked without running code: this is an x86-64 machine
    /// with the features the code needs, the code calls `kernel_abi` (the kernel-table ABI of the
    /// runtime that will run it: `kiln_kernels::table::KERNEL_ABI_VERSION`, passed in so that
    /// this crate needs no kernels), every entry lies inside the code, every binding and constant
    /// inside the arena (and disjoint from each other), every weight slot is self-consistent.
    pub fn verify(&self, kernel_abi: u32) -> Result<()> {
        let bad = |m: String| Err(Error::Artifact { message: format!("bucket {}: {m}", self.bucket) });
        if !cfg!(target_arch = "x86_64") {
            return bad("the plan holds x86-64 code and this machine is not x86-64".into());
        }
        let missing: Vec<&str> =
            self.required_features.iter().map(|s| s.as_str()).filter(|f| !has_cpu_feature(f)).collect();
        if !missing.is_empty() {
            return bad(format!("this CPU lacks features the plan was compiled for: {}", missing.join(", ")));
        }
        if self.kernel_abi != kernel_abi {
            return bad(format!(
                "the code calls kernel-table ABI {}, this runtime has ABI {kernel_abi}: recompile the plan",
                self.kernel_abi
            ));
        }
        if self.code.is_empty() {
            return bad("no code".into());
        }
        if self.arena_bytes > isize::MAX as usize / 2 {
            return bad(format!("arena of {} bytes is absurd", self.arena_bytes));
        }
        for s in &self.steps {
            if s.entry as usize >= self.code.len() || s.tasks == 0 || s.tasks > 4096 {
                return bad(format!("step `{}` has entry {} / {} tasks outside the code", s.name, s.entry, s.tasks));
            }
        }
        let mut ranges: Vec<(usize, usize, String)> = Vec::new();
        for (what, list) in [("input", &self.inputs), ("output", &self.outputs)] {
            for (i, b) in list.iter().enumerate() {
                let bytes = b.shape.iter().try_fold(b.dtype.size(), |acc, &d| acc.checked_mul(d));
                match bytes {
                    Some(n) if range_ok(b.offset, n, self.arena_bytes) && b.offset % 8 == 0 => {
                        ranges.push((b.offset, n, format!("{what} {i}")))
                    }
                    _ => return bad(format!("{what} {i} at {} of shape {:?} lies outside the arena", b.offset, b.shape)),
                }
            }
        }
        for (i, (off, bytes)) in self.arena_init.iter().enumerate() {
            if !range_ok(*off, bytes.len(), self.arena_bytes) {
                return bad(format!("constant {i} at {off} of {} bytes lies outside the arena", bytes.len()));
            }
            ranges.push((*off, bytes.len(), format!("constant {i}")));
        }
        ranges.retain(|r| r.1 > 0);
        ranges.sort();
        for w in ranges.windows(2) {
            if w[0].0 + w[0].1 > w[1].0 {
                return bad(format!("{} and {} overlap in the arena", w[0].2, w[1].2));
            }
        }
        for (i, s) in self.weights.iter().enumerate() {
            s.verify().map_err(|m| Error::Artifact { message: format!("bucket {}: weight slot {i}: {m}", self.bucket) })?;
        }
        Ok(())
    }
}

/// How the code reads one checkpoint tensor (entry `i` of the weights pointer array).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WeightSlot {
    /// Index in the graph's weight table.
    pub index: usize,
    /// Further weight-table entries joined to `index` before the prep (the weights of sibling
    /// linear layers merged into one GEMM); `None` for one tensor.
    pub concat: Option<WeightConcat>,
    /// Shape of the checkpoint tensor (of the concatenation, when `concat` is set).
    pub shape: Vec<usize>,
    /// Element type the code reads (the checkpoint tensor is converted to it).
    pub dtype: DType,
    pub prep: WeightPrep,
}

/// The transformation applied once to a checkpoint tensor.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WeightPrep {
    /// Row-major in the checkpoint's shape.
    AsIs,
    /// A rank-2 tensor `[r, c]` stored transposed, row-major `[c, r]`.
    Transposed,
    /// The B operand of a GEMM packed for `kiln_kernels` (`gemm_f32`, f32 only): B(p, j), for
    /// `p < k` and `j < n`, is element `offset + p·row_stride + j·col_stride` of the storage —
    /// the checkpoint tensor, or its transpose when `transposed`.
    PackedB { transposed: bool, offset: usize, k: usize, n: usize, row_stride: usize, col_stride: usize },
    /// The same view of B packed as i16 pairs for `kiln_kernels`' exact integer GEMM
    /// (`gemm_i16`): every element must be an integer of magnitude at most `max_abs`, the bound
    /// the code was compiled for (its sums stay exact in i32 under it); preparing a tensor that
    /// breaks it is an error, never a wrong product.
    PackedBI16 { transposed: bool, offset: usize, k: usize, n: usize, row_stride: usize, col_stride: usize, max_abs: u32 },
}

impl WeightSlot {
    /// Elements of the checkpoint tensor.
    pub fn numel(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
    }

    /// Internal consistency (no tensor needed): ranks, dtypes, the packed view inside the storage.
    pub fn verify(&self) -> std::result::Result<(), String> {
        let numel = self.numel().ok_or("shape overflows")?;
        if let Some(c) = &self.concat {
            if c.axis >= self.shape.len() || self.dtype != DType::F32 {
                return Err(format!("a concatenation along axis {} must be f32 of a higher rank, not {} {:?}", c.axis, self.dtype, self.shape));
            }
        }
        match &self.prep {
            WeightPrep::AsIs => Ok(()),
            WeightPrep::Transposed if self.shape.len() == 2 => Ok(()),
            WeightPrep::Transposed => Err(format!("a transposed weight must be rank 2, not {:?}", self.shape)),
            WeightPrep::PackedB { transposed, offset, k, n, row_stride, col_stride }
            | WeightPrep::PackedBI16 { transposed, offset, k, n, row_stride, col_stride, .. } => {
                if matches!(self.prep, WeightPrep::PackedBI16 { max_abs, .. } if max_abs > i16::MAX as u32) {
                    return Err("an i16-packed weight's bound must be at most 32767".into());
                }
                if *transposed && self.shape.len() != 2 {
                    return Err(format!("a transposed weight must be rank 2, not {:?}", self.shape));
                }
                if self.dtype != DType::F32 {
                    return Err(format!("packed GEMM weights are f32, not {}", self.dtype));
                }
                if *k == 0 || *n == 0 {
                    return Ok(());
                }
                let last = (k - 1)
                    .checked_mul(*row_stride)
                    .and_then(|a| (n - 1).checked_mul(*col_stride).and_then(|b| a.checked_add(b)))
                    .and_then(|a| a.checked_add(*offset));
                match last {
                    Some(l) if l < numel => Ok(()),
                    _ => Err(format!("packed view (offset {offset}, {k}x{n}, strides {row_stride},{col_stride}) outside {numel} elements")),
                }
            }
        }
    }
}
