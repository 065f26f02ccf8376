//! GPU plans: the serializable form the CUDA backend produces (PTX text, an optional cubin,
//! the launch list, the arena size and the I/O bindings), and — behind the `cuda` cargo
//! feature — the executor that loads such a plan with the CUDA driver API and runs it.
//!
//! The runtime never compiles CUDA C: the compiler (`kiln-compiler`, NVRTC) emits the PTX, and
//! this module only loads it (`cuModuleLoadData`) and launches kernels (`cuLaunchKernel`), so
//! the thin runtime needs the driver library (`libcuda.so`) and nothing else. The driver is
//! loaded dynamically: a build with the `cuda` feature still runs on machines without CUDA,
//! where [`CudaDevice::open`] returns a typed error naming the missing library.
//!
//! Artifacts: `PrecompiledCuda` (feature `cuda`) is the backend that runs the GPU plans of a
//! CUDA artifact. What it checks before touching a device — the plan of a bucket
//! ([`plan_from_artifact`](crate::cuda::plan_from_artifact); the container validated it as it decoded),
//! the cubin/PTX choice for a device ([`select_code`](crate::cuda::select_code)), the weight
//! table ([`check_plan_weights`](crate::cuda::check_plan_weights)) — needs no driver and is
//! built without the feature.
//!
//! Memory model of a plan: one device arena of [`CudaPlanSpec::arena_bytes`] holds every
//! intermediate value, the graph inputs and the outputs at offsets the memory planner chose;
//! weights live in their own device buffers (uploaded once, shared by every plan); constants
//! that are too large to inline in the kernel source live in buffers the plan owns. A run is:
//! copy the padded inputs into the arena, launch the recorded kernels in order (replayed as one
//! CUDA graph once captured), copy the outputs back.

use crate::artifact::{Artifact, PlanPayload, Target};
use crate::error::{Error, Result};
use crate::graph::Bucket;

pub use kiln_format::plan::cuda::{
    parse_arch, ptx_entries, CudaPlanSpec, IoSlot, KernelArg, LaunchSpec, WeightEntry, CUDA_PLAN_VERSION,
};

/// The raw little-endian bytes of a tensor's elements.
pub fn tensor_bytes(d: &crate::dtype::TensorData) -> &[u8] {
    use crate::dtype::TensorData as T;
    // SAFETY: every element type is plain old data (f16/bf16 are `repr(transparent)` u16), so
    // viewing the vector's initialized elements as bytes is sound.
    unsafe {
        match d {
            T::F32(v) => std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v.as_slice())),
            T::F16(v) => std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v.as_slice())),
            T::BF16(v) => std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v.as_slice())),
            T::I64(v) => std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v.as_slice())),
            T::I32(v) => std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v.as_slice())),
        }
    }
}

/// The raw bytes of a tensor's elements, writable (to receive device results).
pub fn tensor_bytes_mut(d: &mut crate::dtype::TensorData) -> &mut [u8] {
    use crate::dtype::TensorData as T;
    // SAFETY: as in `tensor_bytes`; every bit pattern is a valid value of these types.
    unsafe {
        match d {
            T::F32(v) => std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v.as_slice())),
            T::F16(v) => std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v.as_slice())),
            T::BF16(v) => std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v.as_slice())),
            T::I64(v) => std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v.as_slice())),
            T::I32(v) => std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v.as_slice())),
        }
    }
}

/// The one-line error for a machine without the CUDA driver library.
pub fn missing_driver_error() -> Error {
    Error::Environment(
        "CUDA driver library not found (libcuda.so / libcuda.so.1 could not be loaded): this machine has no \
         NVIDIA driver; use --backend cpu"
            .into(),
    )
}

/// Which of a GPU plan's codes a device loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeChoice {
    /// The cubin, assembled by ptxas for exactly the device's architecture: no JIT at load.
    Cubin,
    /// The PTX (virtual architecture `compute_XY`), JIT-compiled by the driver at load.
    Ptx,
}

/// `sm_XY` of a compute capability.
pub fn sm_name((major, minor): (u32, u32)) -> String {
    format!("sm_{major}{minor}")
}

/// Chooses the code a device of compute capability `device` loads from a plan built for `arch`
/// (`sm_XY`), with or without a cubin.
///
/// PTX for `compute_XY` runs on every device of capability ≥ X.Y (the driver JIT-compiles it),
/// so a device older than the plan's architecture cannot run it: [`Error::Unsupported`] naming
/// both. A cubin runs natively only on the architecture it was assembled for (kiln does not
/// rely on the same-major binary compatibility), so it is chosen when the architectures match
/// exactly and the PTX otherwise. Architecture-specific code (`sm_90a`) runs only on exactly that
/// capability.
pub fn select_code(arch: &str, has_cubin: bool, device: (u32, u32)) -> Result<CodeChoice> {
    let Some(built) = parse_arch(arch) else {
        return Err(Error::Artifact { message: format!("architecture `{arch}` is not of the form sm_XY") });
    };
    let dev = sm_name(device);
    if built > device {
        return Err(Error::Unsupported(format!(
            "the GPU plan was built for {arch} (compute capability {}.{}) but the device is {dev} (compute \
             capability {}.{}): code for a newer architecture cannot run on an older GPU; recompile with \
             --target cuda:{dev}",
            built.0, built.1, device.0, device.1
        )));
    }
    if arch.ends_with('a') && built != device {
        return Err(Error::Unsupported(format!(
            "the GPU plan was built for {arch}, architecture-specific code that runs only on exactly \
             compute capability {}.{}, but the device is {dev}; recompile with --target cuda:{dev}",
            built.0, built.1
        )));
    }
    Ok(if has_cubin && built == device { CodeChoice::Cubin } else { CodeChoice::Ptx })
}

/// The architecture a CUDA artifact was compiled for, or [`Error::Artifact`] for an artifact
/// of another target (a CPU artifact given to the GPU runtime).
pub fn cuda_target(artifact: &Artifact) -> Result<(u32, u32)> {
    match &artifact.header.target {
        Target::Cuda { major, minor } => Ok((*major, *minor)),
        other => Err(Error::Artifact {
            message: format!(
                "the artifact targets {other}, not a CUDA GPU: run it with the CPU runtime \
                 (kiln_runtime::cpu::PrecompiledCpu) or recompile with --target cuda:sm_XY"
            ),
        }),
    }
}

/// Checks that a device of compute capability `device` can run a CUDA artifact's code: the
/// artifact's target is CUDA and its architecture is not newer than the device's.
pub fn check_device_for_artifact(artifact: &Artifact, device: (u32, u32)) -> Result<()> {
    let arch = cuda_target(artifact)?;
    select_code(&sm_name(arch), false, device).map(|_| ())
}

/// The validated GPU plan of `bucket` in a CUDA artifact: [`Error::BucketNotCompiled`]
/// (listing the artifact's buckets) when it has none, [`Error::Artifact`] for a CPU artifact,
/// a CPU plan in a CUDA artifact, a plan for another bucket, one that does not validate, or one
/// built for another architecture than the artifact's header says.
pub fn plan_from_artifact(artifact: &Artifact, bucket: Bucket) -> Result<CudaPlanSpec> {
    let arch = cuda_target(artifact)?;
    match artifact.plan(bucket)? {
        PlanPayload::Cuda(spec) => {
            if spec.bucket != bucket {
                return Err(Error::Artifact {
                    message: format!("GPU plan for bucket {bucket}: the plan inside is for bucket {}", spec.bucket),
                });
            }
            spec.validate()?;
            let spec = spec.clone();
            if parse_arch(&spec.arch) != Some(arch) {
                return Err(Error::Artifact {
                    message: format!(
                        "GPU plan for bucket {bucket} is built for {}, but the artifact's target is {}",
                        spec.arch, artifact.header.target
                    ),
                });
            }
            Ok(spec)
        }
        PlanPayload::Cpu(_) => Err(Error::Artifact {
            message: format!("bucket {bucket} of a CUDA artifact holds a CPU plan, not a GPU plan"),
        }),
    }
}

/// Checks a plan's weight table against the weights uploaded for it (same count, and each
/// weight's dtype and shape); [`Error::Artifact`] naming the first difference.
pub fn check_plan_weights(spec: &CudaPlanSpec, uploaded: &[WeightEntry]) -> Result<()> {
    let bad = |m: String| {
        Err(Error::Artifact {
            message: format!("GPU plan for bucket {} was compiled for a different weight table: {m}", spec.bucket),
        })
    };
    if spec.weights.len() != uploaded.len() {
        return bad(format!("it reads {} weights, the uploaded set has {}", spec.weights.len(), uploaded.len()));
    }
    for (i, (want, got)) in spec.weights.iter().zip(uploaded).enumerate() {
        if want != got {
            return bad(format!(
                "weight {i} is {} {:?} in the plan, {} {:?} uploaded",
                want.dtype, want.shape, got.dtype, got.shape
            ));
        }
    }
    Ok(())
}

#[cfg(feature = "cuda")]
pub use exec::*;

#[cfg(feature = "cuda")]
mod exec {
    use std::ffi::{c_void, CString};
    use std::sync::Arc;

    use cudarc::driver::{result, sys, CudaContext, CudaStream, DriverError};

    use super::*;
    use crate::backend::{check_weights, Backend, Batch, Caps, Outputs};
    use crate::dtype::{DType, HostTensor};

    fn drv(what: &str, e: DriverError) -> Error {
        let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
        let text = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        Error::Backend(format!("CUDA driver: {what}: {name} ({text})"))
    }

    /// Whether the CUDA driver library can be loaded; the typed error of a machine without it.
    pub fn driver_present() -> Result<()> {
        // SAFETY: only tries to dlopen the library by its usual names.
        if unsafe { sys::is_culib_present() } {
            Ok(())
        } else {
            Err(missing_driver_error())
        }
    }

    /// One GPU, its primary context and the stream every plan runs on.
    pub struct CudaDevice {
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        name: String,
        cc: (u32, u32),
        total_mem: u64,
        /// Held for a whole run: plans share the stream, and a stream being captured into a
        /// CUDA graph must see no other thread's work.
        run_lock: std::sync::Mutex<()>,
    }

    impl std::fmt::Debug for CudaDevice {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "CudaDevice({}, sm_{}{})", self.name, self.cc.0, self.cc.1)
        }
    }

    impl CudaDevice {
        /// Opens GPU `ordinal`. Errors (never panics) when the driver library is missing, the
        /// driver fails to initialize, or there is no such device.
        pub fn open(ordinal: usize) -> Result<Arc<Self>> {
            driver_present()?;
            result::init().map_err(|e| drv("cuInit (is an NVIDIA GPU present and its driver loaded?)", e))?;
            let count = result::device::get_count().map_err(|e| drv("cuDeviceGetCount", e))?;
            if count <= 0 {
                return Err(Error::environment("CUDA driver found, but it reports no GPU"));
            }
            if ordinal >= count as usize {
                return Err(Error::environment(format!("no CUDA device {ordinal}: the driver reports {count}")));
            }
            let ctx = CudaContext::new(ordinal).map_err(|e| drv("creating the context", e))?;
            // One stream, synchronized explicitly: cudarc's per-buffer event tracking is not needed.
            // SAFETY: no cudarc-managed buffers are shared between streams in this executor.
            unsafe { ctx.disable_event_tracking() };
            let stream = ctx.new_stream().map_err(|e| drv("creating a stream", e))?;
            let name = ctx.name().map_err(|e| drv("cuDeviceGetName", e))?;
            let (maj, min) = ctx.compute_capability().map_err(|e| drv("compute capability", e))?;
            let total_mem = ctx.total_mem().map_err(|e| drv("cuDeviceTotalMem", e))? as u64;
            Ok(Arc::new(CudaDevice {
                ctx,
                stream,
                name,
                cc: (maj as u32, min as u32),
                total_mem,
                run_lock: std::sync::Mutex::new(()),
            }))
        }

        pub fn name(&self) -> &str {
            &self.name
        }
        pub fn compute_capability(&self) -> (u32, u32) {
            self.cc
        }
        /// `sm_XY` of this device.
        pub fn arch(&self) -> String {
            sm_name(self.cc)
        }
        pub fn total_memory(&self) -> u64 {
            self.total_mem
        }

        /// Capabilities for a backend on this device (`can_lower` as the caller says).
        pub fn caps(&self, backend: &str, can_lower: bool) -> Caps {
            let mut dtypes = vec![DType::F32];
            if self.cc.0 >= 7 {
                dtypes.push(DType::F16);
            }
            if self.cc.0 >= 8 {
                dtypes.push(DType::BF16);
            }
            Caps {
                name: backend.into(),
                device: format!(
                    "{} (compute capability {}.{}, {:.1} GiB)",
                    self.name,
                    self.cc.0,
                    self.cc.1,
                    self.total_mem as f64 / (1u64 << 30) as f64
                ),
                dtypes,
                can_lower,
                memory_bytes: Some(self.total_mem),
            }
        }

        fn bind(&self) -> Result<()> {
            self.ctx.bind_to_thread().map_err(|e| drv("binding the context", e))
        }

        fn alloc(self: &Arc<Self>, bytes: u64) -> Result<DeviceBuffer> {
            self.bind()?;
            // Never a zero-byte allocation: a plan with an empty arena still gets a valid pointer.
            let n = bytes.max(256) as usize;
            // SAFETY: plain allocation with the context bound.
            let ptr = unsafe { result::malloc_sync(n) }
                .map_err(|e| drv(&format!("allocating {n} bytes of device memory"), e))?;
            Ok(DeviceBuffer { ptr, bytes: n as u64, dev: self.clone() })
        }

        fn upload_bytes(self: &Arc<Self>, bytes: &[u8]) -> Result<DeviceBuffer> {
            let buf = self.alloc(bytes.len() as u64)?;
            if !bytes.is_empty() {
                // SAFETY: `buf` holds at least `bytes.len()` bytes.
                unsafe { result::memcpy_htod_sync(buf.ptr, bytes) }.map_err(|e| drv("copying to the device", e))?;
            }
            Ok(buf)
        }

        /// Uploads weight tensors (indexed like `Graph::weights`) once, as they are.
        pub fn upload_weights(self: &Arc<Self>, tensors: &[HostTensor]) -> Result<CudaWeights> {
            let mut bufs = Vec::with_capacity(tensors.len());
            let mut slots = Vec::with_capacity(tensors.len());
            for t in tensors {
                bufs.push(self.upload_bytes(tensor_bytes(&t.data))?);
                slots.push(WeightEntry { dtype: t.dtype(), shape: t.shape.clone() });
            }
            let bytes = tensors.iter().map(|t| t.byte_len()).sum();
            Ok(CudaWeights { bufs: Arc::new(bufs), slots, bytes, dev: self.clone() })
        }

        /// Loads a plan: validates it, loads its code (the cubin when it was built for this
        /// exact architecture, else the PTX, which the driver JIT-compiles), allocates the arena
        /// and the constants, and resolves every launch's arguments.
        pub fn load_plan(self: &Arc<Self>, spec: CudaPlanSpec, weights: &CudaWeights) -> Result<CudaPlan> {
            spec.validate()?;
            if !Arc::ptr_eq(&weights.dev, self) {
                return Err(Error::Backend("the weights were uploaded to another CUDA device".into()));
            }
            check_plan_weights(&spec, &weights.slots)?;
            let choice = select_code(&spec.arch, spec.cubin.is_some(), self.cc).map_err(|e| match e {
                Error::Unsupported(m) => Error::Unsupported(format!("{} (bucket {}): {m}", self.name, spec.bucket)),
                other => other,
            })?;
            self.bind()?;
            let module = match (&spec.cubin, choice) {
                (Some(c), CodeChoice::Cubin) => {
                    // SAFETY: a cubin image; the driver validates it.
                    unsafe { result::module::load_data(c.as_ptr() as *const c_void) }
                        .map_err(|e| drv("loading the plan's cubin", e))?
                }
                _ => {
                    let src = CString::new(spec.ptx.as_bytes()).expect("validated: no NUL");
                    // SAFETY: a NUL-terminated PTX string.
                    unsafe { result::module::load_data(src.as_ptr() as *const c_void) }
                        .map_err(|e| drv("loading (JIT-compiling) the plan's PTX", e))?
                }
            };
            let module = Module { raw: module, dev: self.clone() };
            let mut funcs: Vec<(String, sys::CUfunction)> = Vec::new();
            let mut launches = Vec::with_capacity(spec.launches.len());
            let arena = self.alloc(spec.arena_bytes)?;
            let mut consts = Vec::with_capacity(spec.constants.len());
            for c in &spec.constants {
                consts.push(self.upload_bytes(c)?);
            }
            for l in &spec.launches {
                let f = match funcs.iter().find(|(n, _)| *n == l.kernel) {
                    Some((_, f)) => *f,
                    None => {
                        let name = CString::new(l.kernel.as_str()).expect("kernel names are identifiers");
                        // SAFETY: `module` is loaded and alive.
                        let f = unsafe { result::module::get_function(module.raw, name) }
                            .map_err(|e| drv(&format!("finding kernel `{}`", l.kernel), e))?;
                        funcs.push((l.kernel.clone(), f));
                        f
                    }
                };
                let params: Vec<u64> = l
                    .args
                    .iter()
                    .map(|a| match *a {
                        KernelArg::Arena { offset } => arena.ptr + offset,
                        KernelArg::Weight { index } => weights.bufs[index as usize].ptr,
                        KernelArg::Const { index } => consts[index as usize].ptr,
                        KernelArg::I32(v) => v as u32 as u64,
                        KernelArg::U32(v) => v as u64,
                        KernelArg::F32(v) => v.to_bits() as u64,
                        KernelArg::I64(v) => v as u64,
                    })
                    .collect();
                launches.push(Launch {
                    func: f,
                    grid: (l.grid[0], l.grid[1], l.grid[2]),
                    block: (l.block[0], l.block[1], l.block[2]),
                    shared: l.shared_bytes,
                    params,
                });
            }
            let use_graph = std::env::var("KILN_CUDA_GRAPH").map_or(true, |v| v != "0");
            Ok(CudaPlan {
                spec,
                dev: self.clone(),
                _weights: weights.bufs.clone(),
                _consts: consts,
                arena,
                launches,
                graph: None,
                use_graph,
                _module: module,
            })
        }
    }

    /// Runs precompiled GPU plans from a CUDA [`Artifact`] (`kiln compile --target cuda:sm_XY`)
    /// through the driver API; compiles nothing (no NVRTC, no compiler linked). The GPU
    /// counterpart of [`crate::cpu::PrecompiledCpu`].
    pub struct PrecompiledCuda {
        artifact: Artifact,
        dev: Arc<CudaDevice>,
    }

    impl std::fmt::Debug for PrecompiledCuda {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("PrecompiledCuda")
                .field("device", &self.dev)
                .field("target", &self.artifact.header.target)
                .field("buckets", &self.artifact.header.buckets)
                .finish()
        }
    }

    impl PrecompiledCuda {
        /// A backend over a verified CUDA `artifact`'s plans, on GPU 0.
        pub fn new(artifact: Artifact) -> Result<Self> {
            Self::with_device(artifact, 0)
        }

        /// A backend over `artifact`'s plans on GPU `ordinal`. Errors (one line, never a panic):
        /// [`Error::Artifact`] for an artifact that is not a CUDA one (checked before the driver
        /// is touched); the typed missing-driver error on a machine without `libcuda`;
        /// [`Error::Unsupported`] naming both architectures when the device is older than the
        /// artifact's architecture.
        pub fn with_device(artifact: Artifact, ordinal: usize) -> Result<Self> {
            cuda_target(&artifact)?;
            let dev = CudaDevice::open(ordinal)?;
            check_device_for_artifact(&artifact, dev.compute_capability()).map_err(|e| match e {
                Error::Unsupported(m) => Error::Unsupported(format!("{} (GPU {ordinal}): {m}", dev.name())),
                other => other,
            })?;
            Ok(PrecompiledCuda { artifact, dev })
        }

        pub fn artifact(&self) -> &Artifact {
            &self.artifact
        }
        pub fn device(&self) -> &Arc<CudaDevice> {
            &self.dev
        }
    }

    impl Backend for PrecompiledCuda {
        type Weights = CudaWeights;
        type Plan = CudaPlan;

        fn caps(&self) -> Caps {
            self.dev.caps("cuda-precompiled", false)
        }

        /// Checks the tensors against the graph and the artifact, then copies them to the
        /// device once, in their checkpoint layout.
        fn upload(&self, tensors: &[HostTensor], graph: &crate::graph::Graph) -> Result<CudaWeights> {
            check_weights(tensors, graph)?;
            self.artifact.check_signature(graph)?;
            self.dev.upload_weights(tensors)
        }

        /// Loads the artifact's plan for `bucket`: decoded, validated, checked against the
        /// bucket, the artifact's architecture and the uploaded weights, then loaded (cubin when
        /// it was built for exactly this device, else PTX).
        fn lower(&self, weights: &CudaWeights, graph: &crate::graph::Graph, bucket: Bucket) -> Result<CudaPlan> {
            self.artifact.check_signature(graph)?;
            // `load_plan` checks the plan's weight table against the uploaded weights.
            self.dev.load_plan(plan_from_artifact(&self.artifact, bucket)?, weights)
        }

        fn run(&self, plan: &mut CudaPlan, batch: &Batch, outputs: &mut Outputs) -> Result<()> {
            plan.run(batch, outputs)
        }

        fn weight_bytes(&self, weights: &CudaWeights) -> usize {
            weights.bytes()
        }

        fn plan_bytes(&self, plan: &CudaPlan) -> usize {
            plan.bytes()
        }
    }

    /// A device allocation, freed on drop.
    struct DeviceBuffer {
        ptr: sys::CUdeviceptr,
        bytes: u64,
        dev: Arc<CudaDevice>,
    }

    impl Drop for DeviceBuffer {
        fn drop(&mut self) {
            if self.dev.ctx.bind_to_thread().is_ok() {
                // SAFETY: allocated by `malloc_sync`, freed once.
                let _ = unsafe { result::free_sync(self.ptr) };
            }
        }
    }

    struct Module {
        raw: sys::CUmodule,
        dev: Arc<CudaDevice>,
    }

    // SAFETY: a CUmodule handle may be used from any thread with its context bound.
    unsafe impl Send for Module {}
    unsafe impl Sync for Module {}

    impl Drop for Module {
        fn drop(&mut self) {
            if self.dev.ctx.bind_to_thread().is_ok() {
                // SAFETY: loaded once, unloaded once, after every plan using it is gone.
                let _ = unsafe { result::module::unload(self.raw) };
            }
        }
    }

    /// Weights uploaded once to one device.
    pub struct CudaWeights {
        bufs: Arc<Vec<DeviceBuffer>>,
        slots: Vec<WeightEntry>,
        bytes: usize,
        dev: Arc<CudaDevice>,
    }

    impl CudaWeights {
        pub fn bytes(&self) -> usize {
            self.bytes
        }
        pub fn slots(&self) -> &[WeightEntry] {
            &self.slots
        }
    }

    struct Launch {
        func: sys::CUfunction,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared: u32,
        /// One 8-byte slot per parameter; 4-byte parameters use the low bytes (little-endian).
        params: Vec<u64>,
    }

    struct Graph(cudarc::driver::CudaGraph);
    // SAFETY: the graph is only touched through `&mut CudaPlan`, never concurrently.
    unsafe impl Send for Graph {}

    /// A loaded, runnable GPU plan for one bucket.
    pub struct CudaPlan {
        spec: CudaPlanSpec,
        dev: Arc<CudaDevice>,
        _weights: Arc<Vec<DeviceBuffer>>,
        _consts: Vec<DeviceBuffer>,
        arena: DeviceBuffer,
        launches: Vec<Launch>,
        graph: Option<Graph>,
        use_graph: bool,
        // Dropped last: functions belong to it.
        _module: Module,
    }

    // SAFETY: the raw function handles are immutable after load and valid on any thread with the
    // context bound (every entry point binds it); `&mut self` serializes runs.
    unsafe impl Send for CudaPlan {}

    impl CudaPlan {
        pub fn spec(&self) -> &CudaPlanSpec {
            &self.spec
        }
        pub fn bucket(&self) -> Bucket {
            self.spec.bucket
        }
        /// Device bytes this plan holds (arena, constants) plus its code size.
        pub fn bytes(&self) -> usize {
            (self.arena.bytes as usize)
                + self._consts.iter().map(|c| c.bytes as usize).sum::<usize>()
                + self.spec.code_bytes()
        }
        /// Whether runs replay a captured CUDA graph.
        pub fn uses_graph(&self) -> bool {
            self.graph.is_some()
        }

        fn launch_all(&mut self) -> Result<()> {
            let stream = self.dev.stream.cu_stream();
            for (i, l) in self.launches.iter_mut().enumerate() {
                let mut ptrs: Vec<*mut c_void> = l.params.iter_mut().map(|p| p as *mut u64 as *mut c_void).collect();
                // SAFETY: the function comes from the loaded module; every pointer argument lies in
                // a live buffer (checked by `validate` and resolved at load); scalar slots are
                // 8 bytes, at least the size of the kernel's parameter.
                unsafe { result::launch_kernel(l.func, l.grid, l.block, l.shared, stream, &mut ptrs) }
                    .map_err(|e| drv(&format!("launching kernel `{}` (launch {i})", self.spec.launches[i].kernel), e))?;
            }
            Ok(())
        }

        /// Records the launches as a CUDA graph (stream capture). Falls back to plain launches,
        /// permanently for this plan, when capture is not supported.
        fn capture(&mut self) -> Result<()> {
            let stream = self.dev.stream.clone();
            if stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).is_err() {
                self.use_graph = false;
                return Ok(());
            }
            let launched = self.launch_all();
            let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
            match (launched, ended) {
                (Ok(()), Ok(Some(g))) => {
                    self.graph = Some(Graph(g));
                }
                (Err(e), _) => return Err(e),
                _ => self.use_graph = false,
            }
            Ok(())
        }

        /// Runs the plan on a batch padded to exactly the plan's bucket.
        pub fn run(&mut self, batch: &Batch, outputs: &mut Outputs) -> Result<()> {
            let dev = self.dev.clone();
            let _guard = dev.run_lock.lock().unwrap_or_else(|e| e.into_inner());
            self.dev.bind()?;
            if batch.tensors.len() != self.spec.inputs.len() {
                return Err(Error::bad_batch(format!(
                    "the GPU plan takes {} inputs, the batch has {}",
                    self.spec.inputs.len(),
                    batch.tensors.len()
                )));
            }
            if outputs.tensors.len() != self.spec.outputs.len() {
                return Err(Error::bad_batch(format!(
                    "the GPU plan has {} outputs, {} buffers were given",
                    self.spec.outputs.len(),
                    outputs.tensors.len()
                )));
            }
            let stream = self.dev.stream.cu_stream();
            for (i, (t, slot)) in batch.tensors.iter().zip(&self.spec.inputs).enumerate() {
                if t.dtype() != slot.dtype || t.shape != slot.shape {
                    return Err(Error::bad_batch(format!(
                        "input {i} is {} {:?}; the plan for bucket {} needs {} {:?}",
                        t.dtype(),
                        t.shape,
                        self.spec.bucket,
                        slot.dtype,
                        slot.shape
                    )));
                }
                // An input no kernel reads: checked, not copied.
                let Some(offset) = slot.offset else { continue };
                let bytes = tensor_bytes(&t.data);
                // SAFETY: `validate` checked the slot lies inside the arena; the host memory stays
                // alive until the stream is synchronized below.
                unsafe { result::memcpy_htod_async(self.arena.ptr + offset, bytes, stream) }
                    .map_err(|e| drv(&format!("copying input {i} to the device"), e))?;
            }
            if self.use_graph && self.graph.is_none() {
                self.capture()?;
            }
            match &self.graph {
                Some(g) => g.0.launch().map_err(|e| drv("launching the plan's CUDA graph", e))?,
                None => self.launch_all()?,
            }
            for (i, (t, slot)) in outputs.tensors.iter_mut().zip(&self.spec.outputs).enumerate() {
                if t.dtype() != slot.dtype || t.shape != slot.shape {
                    return Err(Error::bad_batch(format!(
                        "output buffer {i} is {} {:?}; the plan for bucket {} writes {} {:?}",
                        t.dtype(),
                        t.shape,
                        self.spec.bucket,
                        slot.dtype,
                        slot.shape
                    )));
                }
                let offset = slot.offset.expect("validated: outputs have slots");
                let bytes = tensor_bytes_mut(&mut t.data);
                // SAFETY: as above; synchronized before `bytes` is read or dropped.
                unsafe { result::memcpy_dtoh_async(bytes, self.arena.ptr + offset, stream) }
                    .map_err(|e| drv(&format!("copying output {i} to the host"), e))?;
            }
            self.dev.stream.synchronize().map_err(|e| drv("running the plan", e))?;
            Ok(())
        }

        /// GPU time of each launch on its own, in ms: the mean of `iters` back-to-back launches
        /// of that kernel between CUDA events. A profiling aid (`profile_buckets` in
        /// compiler/tests/cuda_device.rs): kernels that update a buffer in place run repeatedly,
        /// so the arena holds garbage afterwards, until the next [`CudaPlan::run`] rewrites it
        /// from its batch.
        pub fn time_each_launch(&mut self, iters: usize) -> Result<Vec<f32>> {
            let dev = self.dev.clone();
            let _guard = dev.run_lock.lock().unwrap_or_else(|e| e.into_inner());
            self.dev.bind()?;
            let stream = self.dev.stream.clone();
            let ev = || self.dev.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| drv("creating an event", e));
            let (start, end) = (ev()?, ev()?);
            let mut times = Vec::with_capacity(self.launches.len());
            for (i, l) in self.launches.iter_mut().enumerate() {
                let mut ptrs: Vec<*mut c_void> = l.params.iter_mut().map(|p| p as *mut u64 as *mut c_void).collect();
                start.record(&stream).map_err(|e| drv("recording an event", e))?;
                for _ in 0..iters.max(1) {
                    // SAFETY: as in `launch_all`: a loaded function, pointers into live buffers.
                    unsafe { result::launch_kernel(l.func, l.grid, l.block, l.shared, stream.cu_stream(), &mut ptrs) }
                        .map_err(|e| drv(&format!("launching kernel `{}` (launch {i})", self.spec.launches[i].kernel), e))?;
                }
                end.record(&stream).map_err(|e| drv("recording an event", e))?;
                end.synchronize().map_err(|e| drv("running the plan", e))?;
                times.push(start.elapsed_ms(&end).map_err(|e| drv("reading event times", e))? / iters.max(1) as f32);
            }
            Ok(times)
        }

        /// Runs the recorded launches only (inputs as they are in the arena), synchronized, and
        /// returns the wall time in milliseconds measured with CUDA events.
        pub fn time_launches(&mut self, iters: usize) -> Result<f32> {
            let dev = self.dev.clone();
            let _guard = dev.run_lock.lock().unwrap_or_else(|e| e.into_inner());
            self.dev.bind()?;
            if self.use_graph && self.graph.is_none() {
                self.capture()?;
            }
            let stream = self.dev.stream.clone();
            let start = self.dev.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| drv("creating an event", e))?;
            let end = self.dev.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| drv("creating an event", e))?;
            start.record(&stream).map_err(|e| drv("recording an event", e))?;
            for _ in 0..iters.max(1) {
                match &self.graph {
                    Some(g) => g.0.launch().map_err(|e| drv("launching the plan's CUDA graph", e))?,
                    None => self.launch_all()?,
                }
            }
            end.record(&stream).map_err(|e| drv("recording an event", e))?;
            end.synchronize().map_err(|e| drv("running the plan", e))?;
            let ms = start.elapsed_ms(&end).map_err(|e| drv("reading event times", e))?;
            Ok(ms / iters.max(1) as f32)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "cuda")]
    #[test]
    fn open_without_driver_is_a_typed_error() {
        // SAFETY: only probes for the library.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            eprintln!("skipped: a CUDA driver library is present on this machine");
            return;
        }
        let e = CudaDevice::open(0).unwrap_err();
        assert_eq!(e, missing_driver_error());
        assert!(!e.to_string().contains('\n'));
    }
}
