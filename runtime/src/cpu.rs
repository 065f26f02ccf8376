//! The CPU plan executor: the one path for JIT and precompiled CPU plans.
//!
//! A [`CpuPlanImage`] is plain data — position-independent machine code (constants inside the
//! code, helpers reached only through the function table passed at entry, so no relocations),
//! the ordered kernel steps, the arena layout (size, I/O bindings, constant bytes written at
//! load) and the weight slots the code reads (which checkpoint tensor, in which layout). The
//! compiler produces it; an artifact stores it; [`CpuExecutable::load`] verifies it and maps the
//! code (written into an anonymous map, then made read+execute: never writable and executable
//! at once).
//!
//! Kernel ABI (System V): `extern "sysv64" fn(arena: *mut u8, weights: *const *const u8,
//! table: *const KernelTable, task: usize, n_tasks: usize) -> i32`, returning a status
//! ([`status`]). A step with `tasks > 1` is split across the thread pool; each call handles its
//! share `task` of `n_tasks`.
//!
//! The shared execution pieces — weight preparation per slot layout ([`weights`]), the kernel
//! table and thread pool ([`CpuContext`]), a loaded plan and its `run` ([`CpuPlan`]) — live here
//! so that the compiler's JIT backend and the compiler-free [`PrecompiledCpu`] run plans through
//! the very same code.

mod backend;
pub mod weights;

use crate::dtype::{DType, HostTensor, TensorData};
use crate::error::{Error, Result};
use crate::graph::Bucket;

pub use backend::{cpu_caps, cpu_device, CpuContext, CpuPlan, PrecompiledCpu, Threads, MAX_THREADS};
pub use kiln_format::features::{self, has_cpu_feature, X86Feature, X86_FEATURES};
pub use kiln_format::plan::cpu::{status, Binding, CpuPlanImage, CpuStep, WeightPrep, WeightSlot};
pub use weights::CpuWeights;

/// [`CpuPlanImage::verify`] against this runtime's kernel-table ABI: what every CPU plan passes
/// before its code is mapped.
pub fn verify_image(image: &CpuPlanImage) -> Result<()> {
    image.verify(kiln_kernels::table::KERNEL_ABI_VERSION)
}

/// A plan's arena: zeroed anonymous memory (page-aligned, so 64-byte-aligned), mapped fallibly
/// — a bucket too large for the machine is an [`Error`], not an abort — and backed lazily, page
/// by page, as written. Named apart from `kiln_kernels::aligned::AlignedBuf`, the kernels'
/// scratch. See [`huge_pages`].
pub struct Arena {
    map: memmap2::MmapMut,
    len: usize,
}

impl Arena {
    pub fn new(len: usize) -> Result<Self> {
        Self::zeroed(len, "an arena")
    }
    /// `len` zeroed bytes; `what` names them in the error where they cannot be had. (Also the
    /// prepared weights' memory, `cpu/weights.rs`.)
    pub fn zeroed(len: usize, what: &str) -> Result<Self> {
        let map = memmap2::MmapMut::map_anon(len.max(1))
            .map_err(|e| Error::environment(format!("cannot allocate {what} of {len} bytes: {e}")))?;
        huge_pages(&map);
        Ok(Arena { map, len })
    }
    pub fn as_ptr(&self) -> *const u8 {
        self.map.as_ptr()
    }
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.map.as_mut_ptr()
    }
    pub fn as_slice(&self) -> &[u8] {
        &self.map[..self.len]
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.map[..self.len]
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Asks Linux for transparent huge pages (2 MiB) under `map` when it spans at least one, as
/// PyTorch's CPU allocator does for large blocks: a hint (THP may be off, or no huge page
/// free), so its refusal is not an error. With 4 KiB pages a plan's arena and prepared weights
/// (ResNet-18: ~50 MB) overflow the TLB's reach. Measured (ResNet-18 1×224, 2 threads, Zen 4
/// VM with THP in `madvise` mode, ten processes each): 21.5–21.6 ms against 21.6–21.9 without;
/// MiniLM 8×128 and 1×128 unchanged.
fn huge_pages(map: &memmap2::MmapMut) {
    #[cfg(target_os = "linux")]
    if map.len() >= 2 << 20 {
        let _ = map.advise(memmap2::Advice::HugePage);
    }
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena").field("len", &self.len).finish()
    }
}

/// The kernel entry ABI.
pub type KernelFn = unsafe extern "sysv64" fn(*mut u8, *const *const u8, *const u8, usize, usize) -> i32;

/// Splits `n` tasks over threads and calls `f(task)` for each; given by the backend.
pub trait Parallel {
    fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync));
    /// Nanoseconds threads have waited at the ends of jobs so far, where the runner counts them
    /// (the pool's `watch_idle`); 0 for one that does not.
    fn idle_ns(&self) -> u64 {
        0
    }
}

/// Runs every task on the calling thread.
pub struct Inline;

impl Parallel for Inline {
    fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        (0..n).for_each(f)
    }
}

impl Parallel for kiln_kernels::threadpool::ThreadPool {
    fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        kiln_kernels::threadpool::ThreadPool::run(self, n, f)
    }
    fn idle_ns(&self) -> u64 {
        kiln_kernels::threadpool::ThreadPool::idle_ns(self)
    }
}

/// What [`CpuExecutable::run_timed`] adds up per step, in seconds: its wall time, and the time
/// threads waited at the ends of its jobs (the runner's [`Parallel::idle_ns`]; a GEMM's or
/// attention's own jobs included, as they share the pool).
#[derive(Clone, Copy, Debug, Default)]
pub struct StepTime {
    pub wall: f64,
    pub idle: f64,
}

/// A verified, mapped CPU plan with its arena. All memory is allocated by `load`.
pub struct CpuExecutable {
    image: CpuPlanImage,
    code: memmap2::Mmap,
    arena: Arena,
}

// SAFETY: the code map is read-only after load, and the arena is owned; `run` takes `&mut self`.
unsafe impl Send for CpuExecutable {}

struct SendPtr<T>(T);
// SAFETY: used only to hand the arena/weights/table pointers to pool threads for the duration of
// one step; the kernels partition their writes by task.
unsafe impl<T> Sync for SendPtr<T> {}

impl CpuExecutable {
    /// Verifies the image, then copies its code into fresh memory made read+execute and writes
    /// the constants into a fresh arena.
    pub fn load(image: CpuPlanImage) -> Result<Self> {
        verify_image(&image)?;
        let mut map = memmap2::MmapMut::map_anon(image.code.len())
            .map_err(|e| Error::Backend(format!("cannot map code: {e}")))?;
        map.copy_from_slice(&image.code);
        let code = map.make_exec().map_err(|e| Error::Backend(format!("cannot make code executable: {e}")))?;
        let mut arena = Arena::new(image.arena_bytes).map_err(|e| e.context(format!("bucket {}", image.bucket)))?;
        for (off, bytes) in &image.arena_init {
            arena.as_mut_slice()[*off..*off + bytes.len()].copy_from_slice(bytes);
        }
        Ok(CpuExecutable { image, code, arena })
    }

    pub fn image(&self) -> &CpuPlanImage {
        &self.image
    }
    pub fn bucket(&self) -> Bucket {
        self.image.bucket
    }
    pub fn arena(&self) -> &[u8] {
        self.arena.as_slice()
    }
    /// Bytes held: code + arena.
    pub fn bytes(&self) -> usize {
        self.code.len() + self.arena.len()
    }

    /// Copies the inputs into the arena, runs every step, copies the outputs out. Allocates
    /// nothing when the tensors have the bindings' dtypes (the engine guarantees it).
    ///
    /// # Safety
    /// `weights` must hold the pointers the code was compiled against (one per
    /// [`CpuPlanImage::weights`] slot, prepared in that slot's layout), each valid for the reads
    /// the code makes, and `table` must point to a live `kiln_kernels::table::KernelTable`
    /// whose pool outlives the call. [`CpuPlan`] guarantees both; the runtime checks the rest.
    pub unsafe fn run(
        &mut self,
        weights: &[*const u8],
        table: *const u8,
        inputs: &[HostTensor],
        outputs: &mut [HostTensor],
        pool: &dyn Parallel,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.run_timed(weights, table, inputs, outputs, pool, None) }
    }

    /// [`CpuExecutable::run`] that also adds each step's times to `times` (one entry per step)
    /// when given.
    ///
    /// # Safety
    /// As for [`CpuExecutable::run`].
    pub unsafe fn run_timed(
        &mut self,
        weights: &[*const u8],
        table: *const u8,
        inputs: &[HostTensor],
        outputs: &mut [HostTensor],
        pool: &dyn Parallel,
        mut times: Option<&mut [StepTime]>,
    ) -> Result<()> {
        if times.as_ref().is_some_and(|t| t.len() != self.image.steps.len()) {
            return Err(Error::Backend("one time slot per step is needed".into()));
        }
        if inputs.len() != self.image.inputs.len() || outputs.len() != self.image.outputs.len() {
            return Err(Error::bad_batch(format!(
                "plan for bucket {} takes {} inputs and {} outputs, got {} and {}",
                self.image.bucket,
                self.image.inputs.len(),
                self.image.outputs.len(),
                inputs.len(),
                outputs.len()
            )));
        }
        if weights.len() != self.image.weights.len() {
            return Err(Error::Backend(format!(
                "plan for bucket {} reads {} weight slots, {} pointers given",
                self.image.bucket,
                self.image.weights.len(),
                weights.len()
            )));
        }
        // Exactly the plan's types, as on the GPU: a backend converts nothing (the engine's
        // `Batch::check` names the graph input at fault before a plan ever sees it).
        check_tensors(inputs, &self.image.inputs, self.image.bucket, "input", "needs")?;
        check_tensors(outputs, &self.image.outputs, self.image.bucket, "output buffer", "writes")?;
        for (t, b) in inputs.iter().zip(&self.image.inputs) {
            write_binding(self.arena.as_mut_slice(), b, &t.data);
        }
        let arena = SendPtr(self.arena.as_mut_ptr());
        let w = SendPtr(weights.as_ptr());
        let tab = SendPtr(table);
        for (si, step) in self.image.steps.iter().enumerate() {
            let t0 = times.as_ref().map(|_| (std::time::Instant::now(), pool.idle_ns()));
            // SAFETY: `verify` checked the entry lies in the mapped code; the code follows the
            // kernel ABI by construction (it is what the compiler emitted for this image).
            let f: KernelFn = unsafe { std::mem::transmute(self.code.as_ptr().add(step.entry as usize)) };
            let n = step.tasks as usize;
            let st = if n == 1 {
                unsafe { f(arena.0, w.0, tab.0, 0, 1) }
            } else {
                let first = std::sync::atomic::AtomicI32::new(0);
                let (a, w, t) = (&arena, &w, &tab);
                pool.run(n, &|task| {
                    let s = unsafe { f(a.0, w.0, t.0, task, n) };
                    if s != 0 {
                        let _ = first.compare_exchange(0, s, std::sync::atomic::Ordering::Relaxed, std::sync::atomic::Ordering::Relaxed);
                    }
                });
                first.into_inner()
            };
            if let (Some(t), Some((t0, idle0))) = (times.as_deref_mut(), t0) {
                t[si].wall += t0.elapsed().as_secs_f64();
                t[si].idle += pool.idle_ns().saturating_sub(idle0) as f64 * 1e-9;
            }
            if st != status::OK {
                return Err(Error::Backend(format!(
                    "kernel `{}` (bucket {}) failed with status {st}: {}",
                    step.name,
                    self.image.bucket,
                    status::describe(st)
                )));
            }
        }
        for (t, b) in outputs.iter_mut().zip(&self.image.outputs) {
            read_binding(self.arena.as_slice(), b, &mut t.data);
        }
        Ok(())
    }
}

/// Copies a tensor into its arena slot (of the same dtype: `run` checked).
/// Each tensor has exactly its binding's dtype and shape (`what` 0, 1, ... names them).
fn check_tensors(tensors: &[HostTensor], bindings: &[Binding], bucket: Bucket, what: &str, verb: &str) -> Result<()> {
    for (i, (t, b)) in tensors.iter().zip(bindings).enumerate() {
        if t.dtype() != b.dtype || t.shape != b.shape || t.numel() != b.shape.iter().product::<usize>() {
            return Err(Error::bad_batch(format!(
                "{what} {i} is {} {:?}; the plan for bucket {bucket} {verb} {} {:?}",
                t.dtype(),
                t.shape,
                b.dtype,
                b.shape
            )));
        }
    }
    Ok(())
}

fn write_binding(arena: &mut [u8], b: &Binding, d: &TensorData) {
    let dst = &mut arena[b.offset..b.offset + b.bytes()];
    macro_rules! put {
        ($v:expr, $n:literal) => {
            $v.iter().zip(dst.chunks_exact_mut($n)).for_each(|(x, c)| c.copy_from_slice(&x.to_le_bytes()))
        };
    }
    match d {
        TensorData::F32(v) => put!(v, 4),
        TensorData::I64(v) => put!(v, 8),
        TensorData::I32(v) => put!(v, 4),
        TensorData::F16(v) => put!(v, 2),
        TensorData::BF16(v) => put!(v, 2),
    }
}

/// Copies an arena slot into an output tensor in place (of the same dtype: `run` checked).
fn read_binding(arena: &[u8], b: &Binding, out: &mut TensorData) {
    let src = &arena[b.offset..b.offset + b.bytes()];
    macro_rules! get {
        ($v:expr, $t:ty, $n:literal) => {
            $v.iter_mut().zip(src.chunks_exact($n)).for_each(|(x, c)| *x = <$t>::from_le_bytes(c.try_into().unwrap()))
        };
    }
    match (out, b.dtype) {
        (TensorData::F32(v), DType::F32) => get!(v, f32, 4),
        (TensorData::I64(v), DType::I64) => get!(v, i64, 8),
        (TensorData::I32(v), DType::I32) => get!(v, i32, 4),
        (TensorData::F16(v), DType::F16) => get!(v, half::f16, 2),
        (TensorData::BF16(v), DType::BF16) => get!(v, half::bf16, 2),
        (out, _) => *out = TensorData::from_le_bytes(b.dtype, src),
    }
}
