//! Running CPU plans: the kernel table and thread pool ([`CpuContext`]), a loaded plan with its
//! weights ([`CpuPlan`]), and the compiler-free backend for precompiled artifacts
//! ([`PrecompiledCpu`]). The compiler's JIT backend builds the same [`CpuPlan`]s.

use std::sync::Arc;

use kiln_kernels::table::KernelTable;
use kiln_kernels::threadpool::ThreadPool;

use super::weights::{CpuWeights, SlotPointers};
use super::{CpuExecutable, CpuPlanImage, Inline, Parallel, StepTime};
use crate::artifact::{Artifact, PlanPayload, Target};
use crate::backend::{check_weights, Backend, Batch, Caps, Outputs};
use crate::dtype::{DType, HostTensor};
use crate::error::{Error, Result};
use crate::graph::{Bucket, Graph};

/// How many threads CPU plans use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// One thread: no pool, every kernel on the caller.
    Single,
    /// This many threads in total (the caller and `n - 1` workers).
    Count(usize),
    /// `std::thread::available_parallelism()`.
    Auto,
}

/// The most threads a pool may have: a larger count is a typo, not a machine (and would try to
/// spawn that many threads).
pub const MAX_THREADS: usize = 4096;

impl Threads {
    /// The thread count; `Count(n)` must be in `1..=MAX_THREADS`.
    pub fn resolve(self) -> Result<usize> {
        match self {
            Threads::Single => Ok(1),
            Threads::Count(n) if (1..=MAX_THREADS).contains(&n) => Ok(n),
            Threads::Count(n) => {
                Err(Error::Unsupported(format!("{n} threads: the thread count must be between 1 and {MAX_THREADS}")))
            }
            Threads::Auto => Ok(std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_THREADS)),
        }
    }
}

/// The persistent thread pool and the kernel table (which points at the pool) that plans run
/// with. Shared by every plan of a backend.
pub struct CpuContext {
    // Field order matters for drop: the table (holding a raw pointer to the pool) goes first.
    table: Box<KernelTable>,
    pool: Box<ThreadPool>,
    threads: usize,
}

impl std::fmt::Debug for CpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuContext").field("threads", &self.threads).finish()
    }
}

impl CpuContext {
    pub fn new(threads: Threads) -> Result<Arc<Self>> {
        let pool = Box::new(ThreadPool::new(threads.resolve()?));
        let threads = pool.threads();
        // The pool lives in a Box that the context keeps, so the table's pointer stays valid.
        let table = Box::new(KernelTable::new(if threads > 1 { Some(&*pool) } else { None }));
        Ok(Arc::new(CpuContext { table, pool, threads }))
    }
    /// Threads the pool actually runs (spawning can give fewer than asked).
    pub fn threads(&self) -> usize {
        self.threads
    }
    pub fn table(&self) -> &KernelTable {
        &self.table
    }
    fn parallel(&self) -> &dyn Parallel {
        if self.threads > 1 {
            &*self.pool
        } else {
            &Inline
        }
    }
}

/// A CPU plan ready to run: mapped code and arena, the weights it reads, the pool it runs on.
pub struct CpuPlan {
    exe: CpuExecutable,
    weights: SlotPointers,
    ctx: Arc<CpuContext>,
}

impl std::fmt::Debug for CpuPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuPlan")
            .field("bucket", &self.exe.bucket())
            .field("steps", &self.exe.image().steps.len())
            .field("code_bytes", &self.exe.image().code.len())
            .field("arena_bytes", &self.exe.image().arena_bytes)
            .finish()
    }
}

impl CpuPlan {
    /// Verifies and maps `image`, and prepares (or finds prepared) the weight slots it reads.
    pub fn load(image: CpuPlanImage, weights: &CpuWeights, ctx: Arc<CpuContext>) -> Result<Self> {
        let exe = CpuExecutable::load(image)?;
        let weights = weights.pointers(&exe.image().weights)?;
        Ok(CpuPlan { exe, weights, ctx })
    }

    pub fn image(&self) -> &CpuPlanImage {
        self.exe.image()
    }
    pub fn bucket(&self) -> Bucket {
        self.exe.bucket()
    }
    /// Code and arena bytes.
    pub fn bytes(&self) -> usize {
        self.exe.bytes()
    }
    /// The arena as of the last run (for debugging).
    pub fn arena(&self) -> &[u8] {
        self.exe.arena()
    }

    /// Runs the plan on inputs of exactly its bucket's shapes. No allocation, no per-kernel
    /// dispatch beyond calling each step's entry.
    pub fn run(&mut self, inputs: &[HostTensor], outputs: &mut [HostTensor]) -> Result<()> {
        let table = (&*self.ctx.table as *const KernelTable).cast::<u8>();
        let pool = self.ctx.parallel();
        // SAFETY: the weight pointers were prepared for exactly this image's slots and are kept
        // alive by `self.weights`; the table and its pool live in `self.ctx`.
        unsafe { self.exe.run(&self.weights.ptrs, table, inputs, outputs, pool) }
    }

    /// Runs the plan `runs` times and returns each step's name and mean times in milliseconds
    /// (wall, and threads waiting at the joins: see [`StepTime`]).
    pub fn profile(&mut self, inputs: &[HostTensor], outputs: &mut [HostTensor], runs: usize) -> Result<Vec<(String, StepTime)>> {
        let mut t = vec![StepTime::default(); self.exe.image().steps.len()];
        let table = (&*self.ctx.table as *const KernelTable).cast::<u8>();
        // (The pool is the context's, shared by its plans: jobs another thread runs on it
        // meanwhile are counted too.)
        self.ctx.pool.watch_idle(true);
        let mut result = Ok(());
        for _ in 0..runs.max(1) {
            let pool = self.ctx.parallel();
            // SAFETY: as in `run`.
            result = unsafe { self.exe.run_timed(&self.weights.ptrs, table, inputs, outputs, pool, Some(&mut t)) };
            if result.is_err() {
                break;
            }
        }
        self.ctx.pool.watch_idle(false);
        result?;
        let per_run = 1e3 / runs.max(1) as f64;
        Ok(self.exe.image().steps.iter().zip(t).map(|(s, x)| (s.name.clone(), StepTime { wall: x.wall * per_run, idle: x.idle * per_run })).collect())
    }
}

/// The device in words: architecture and the SIMD features kiln uses.
pub fn cpu_device(threads: usize) -> String {
    let feats: Vec<&str> = ["avx", "avx2", "fma", "avx512f"].into_iter().filter(|f| super::has_cpu_feature(f)).collect();
    format!("{} ({}), {threads} thread(s)", std::env::consts::ARCH, feats.join("+"))
}

/// The capabilities of a CPU backend (JIT or precompiled) running on `threads` threads.
pub fn cpu_caps(name: &str, threads: usize, can_lower: bool) -> Caps {
    Caps {
        name: name.into(),
        device: cpu_device(threads),
        dtypes: vec![DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32],
        can_lower,
        memory_bytes: None,
    }
}

/// Runs precompiled CPU plans from an [`Artifact`]; compiles nothing (no compiler linked).
pub struct PrecompiledCpu {
    artifact: Artifact,
    ctx: Arc<CpuContext>,
}

impl std::fmt::Debug for PrecompiledCpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrecompiledCpu").field("buckets", &self.artifact.header.buckets).finish()
    }
}

impl PrecompiledCpu {
    /// A backend over `artifact`'s plans, on all available threads.
    pub fn new(artifact: Artifact) -> Self {
        let ctx = CpuContext::new(Threads::Auto).expect("Threads::Auto is within MAX_THREADS");
        PrecompiledCpu { artifact, ctx }
    }
    /// On `threads` threads; a count outside `1..=MAX_THREADS` is an error.
    pub fn with_threads(artifact: Artifact, threads: Threads) -> Result<Self> {
        Ok(PrecompiledCpu { artifact, ctx: CpuContext::new(threads)? })
    }
    pub fn artifact(&self) -> &Artifact {
        &self.artifact
    }
    /// [`Error::Artifact`] unless the artifact is a CPU one (a GPU artifact goes to
    /// `kiln_runtime::cuda::PrecompiledCuda`).
    fn check_cpu_target(&self) -> Result<()> {
        match &self.artifact.header.target {
            Target::CpuX86_64 { .. } => Ok(()),
            other => Err(Error::Artifact {
                message: format!(
                    "the artifact targets {other}, not this CPU: GPU artifacts load through \
                     kiln_runtime::cuda::PrecompiledCuda (feature `cuda`)"
                ),
            }),
        }
    }
    fn images(&self) -> impl Iterator<Item = &CpuPlanImage> {
        self.artifact.body.plans.iter().filter_map(|p| if let PlanPayload::Cpu(i) = p { Some(i) } else { None })
    }
}

impl Backend for PrecompiledCpu {
    type Weights = CpuWeights;
    type Plan = CpuPlan;

    fn caps(&self) -> Caps {
        cpu_caps("cpu-precompiled", self.ctx.threads(), false)
    }

    /// Checks the tensors against the graph and the artifact, then prepares every weight slot
    /// any of the artifact's plans reads (transposes, packs), once.
    fn upload(&self, tensors: &[HostTensor], graph: &Graph) -> Result<CpuWeights> {
        self.check_cpu_target()?;
        check_weights(tensors, graph)?;
        self.artifact.check_signature(graph)?;
        let w = CpuWeights::new(tensors.to_vec());
        for img in self.images() {
            for s in &img.weights {
                w.prepare_slot(s)?;
            }
        }
        Ok(w)
    }

    fn lower(&self, weights: &CpuWeights, graph: &Graph, bucket: Bucket) -> Result<CpuPlan> {
        self.check_cpu_target()?;
        self.artifact.check_signature(graph)?;
        match self.artifact.plan(bucket)? {
            PlanPayload::Cpu(img) => {
                if img.bucket != bucket {
                    return Err(Error::Artifact {
                        message: format!("the plan filed under bucket {bucket} is for bucket {}", img.bucket),
                    });
                }
                CpuPlan::load(img.clone(), weights, self.ctx.clone())
            }
            PlanPayload::Cuda(_) => {
                Err(Error::Artifact { message: format!("bucket {bucket} holds a CUDA plan, not a CPU plan") })
            }
        }
    }

    fn run(&self, plan: &mut CpuPlan, batch: &Batch, outputs: &mut Outputs) -> Result<()> {
        plan.run(&batch.tensors, &mut outputs.tensors)
    }

    fn weight_bytes(&self, weights: &CpuWeights) -> usize {
        weights.bytes()
    }

    fn plan_bytes(&self, plan: &CpuPlan) -> usize {
        plan.bytes()
    }
}
