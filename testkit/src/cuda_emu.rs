//! Host emulation of emitted CUDA C: the module is compiled as C++20 together with
//! `kernels/cuda/emu.h` by the host compiler (`g++`/`c++`) into a shared library, and a
//! [`CudaPlanSpec`]'s launches run on host memory laid out exactly like the device arena.
//!
//! This is a test instrument, not a backend: it is slow (real threads per CUDA thread), but it
//! executes the very source NVRTC compiles, so the generated indexing, tiling, shared-memory
//! staging, warp reductions, online softmax and fused epilogues are checked against the
//! reference interpreter on machines without a GPU. What it cannot check: PTX-level behaviour
//! (inline assembly is replaced by C++ equivalents), the hardware's `mma` fragment layout (the
//! emulator implements the PTX ISA's documented layout), timing and memory-model races.

use std::collections::hash_map::DefaultHasher;
use std::ffi::c_void;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_runtime::cuda::{tensor_bytes, tensor_bytes_mut, CudaPlanSpec, KernelArg};
use kiln_runtime::{Error, HostTensor, Result};

use kiln_compiler::codegen::cuda::emit::EmittedModule;
use kiln_compiler::codegen::cuda::template::EMU_H;

/// The host C++ compiler, if one that accepts `-std=c++20` is on `PATH` (`CXX` overrides).
pub fn host_compiler() -> Option<PathBuf> {
    let candidates: Vec<PathBuf> = match std::env::var_os("CXX") {
        Some(c) => vec![PathBuf::from(c)],
        None => vec!["g++".into(), "c++".into(), "clang++".into()],
    };
    let path = std::env::var_os("PATH")?;
    for c in candidates {
        let found = if c.components().count() > 1 {
            c.is_file().then_some(c)
        } else {
            std::env::split_paths(&path).map(|d| d.join(&c)).find(|p| p.is_file())
        };
        if let Some(p) = found {
            return Some(p);
        }
    }
    None
}

/// The C++ translation unit for a module: the emulation shim, the module, and one trampoline
/// `NAME__emu(void** args)` per kernel.
pub fn emu_source(module: &EmittedModule) -> String {
    let mut s = String::new();
    s.push_str(EMU_H);
    s.push_str("#include <math.h>\n");
    s.push_str(&module.source);
    s.push_str("\n// Trampolines: kernel parameters from a cuLaunchKernel-style array.\n");
    for k in &module.kernels {
        let args: Vec<String> = k.params.iter().enumerate().map(|(j, p)| format!("*({}*)a[{j}]", p.ty)).collect();
        s.push_str(&format!("extern \"C\" void {}__emu(void** a) {{ {}({}); }}\n", k.name, k.name, args.join(", ")));
    }
    s
}

type LaunchFn = unsafe extern "C" fn(KernelFn, *mut *mut c_void, u32, u32, u32, u32, u32, u32) -> i32;
type KernelFn = unsafe extern "C" fn(*mut *mut c_void);

/// A module compiled for host emulation.
pub struct EmuModule {
    lib: libloading::Library,
    names: Vec<String>,
    path: PathBuf,
}

impl std::fmt::Debug for EmuModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EmuModule({}, {} kernels)", self.path.display(), self.names.len())
    }
}

fn cache_dir() -> PathBuf {
    std::env::temp_dir().join("kiln-cuda-emu")
}

impl EmuModule {
    /// Compiles `module` for the host (cached by source hash under the temp dir).
    pub fn build(module: &EmittedModule) -> Result<EmuModule> {
        let cxx = host_compiler()
            .ok_or_else(|| Error::environment("no host C++ compiler (g++/c++/clang++) on PATH for CUDA emulation"))?;
        let src = emu_source(module);
        let mut h = DefaultHasher::new();
        src.hash(&mut h);
        cxx.hash(&mut h);
        let key = format!("{:016x}", h.finish());
        let dir = cache_dir();
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, &e))?;
        let so = dir.join(format!("emu-{key}.so"));
        if !so.is_file() {
            compile(&cxx, &src, &dir, &key, &so)?;
        }
        // SAFETY: a library this process just built from kiln's own sources; its initializers
        // only set up statics.
        let lib = unsafe { libloading::Library::new(&so) }
            .map_err(|e| Error::Backend(format!("loading {}: {e}", so.display())))?;
        Ok(EmuModule { lib, names: module.kernels.iter().map(|k| k.name.clone()).collect(), path: so })
    }

    fn kernel(&self, name: &str) -> Result<KernelFn> {
        let sym = format!("{name}__emu\0");
        // SAFETY: the trampoline has exactly this signature (see `emu_source`).
        unsafe { self.lib.get::<KernelFn>(sym.as_bytes()) }
            .map(|f| *f)
            .map_err(|e| Error::Backend(format!("emulated kernel `{name}` missing: {e}")))
    }

    /// Runs a plan on the host: weights indexed like the plan's weight table (checkpoint
    /// layout), inputs like the graph's inputs (already padded to the bucket). Returns the
    /// outputs.
    pub fn run_plan(&self, spec: &CudaPlanSpec, weights: &[HostTensor], inputs: &[HostTensor]) -> Result<Vec<HostTensor>> {
        spec.validate_layout()?;
        if weights.len() != spec.weights.len() || inputs.len() != spec.inputs.len() {
            return Err(Error::Backend(format!(
                "emulation: {} weights / {} inputs given, the plan takes {} / {}",
                weights.len(),
                inputs.len(),
                spec.weights.len(),
                spec.inputs.len()
            )));
        }
        // 16-byte aligned host buffers standing in for device allocations.
        fn buffer(bytes: &[u8]) -> Vec<u128> {
            let mut v = vec![0u128; bytes.len().div_ceil(16).max(1)];
            // SAFETY: `v` holds at least `bytes.len()` bytes.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr() as *mut u8, bytes.len()) };
            v
        }
        // 0xFF bytes (f32 NaN, integer -1): reading an element no kernel wrote shows in the results.
        let mut arena = vec![u128::MAX; (spec.arena_bytes as usize).div_ceil(16).max(1)];
        let wbufs: Vec<Vec<u128>> = weights
            .iter()
            .zip(&spec.weights)
            .map(|(t, w)| {
                if t.dtype() != w.dtype || t.shape != w.shape {
                    return Err(Error::Backend(format!("emulation: weight {t:?} does not match {w:?}", t = (t.dtype(), &t.shape))));
                }
                Ok(buffer(tensor_bytes(&t.data)))
            })
            .collect::<Result<_>>()?;
        let cbufs: Vec<Vec<u128>> = spec.constants.iter().map(|c| buffer(c)).collect();
        let base = arena.as_mut_ptr() as *mut u8;
        for (i, (t, slot)) in inputs.iter().zip(&spec.inputs).enumerate() {
            let Some(off) = slot.offset else { continue };
            if t.dtype() != slot.dtype || t.shape != slot.shape {
                return Err(Error::bad_batch(format!("emulation: input {i} is {} {:?}, the plan needs {} {:?}", t.dtype(), t.shape, slot.dtype, slot.shape)));
            }
            let b = tensor_bytes(&t.data);
            // SAFETY: validated: the slot lies in the arena.
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), base.add(off as usize), b.len()) };
        }
        // SAFETY: the symbol is the shim's launcher.
        let launch: LaunchFn = unsafe { self.lib.get::<LaunchFn>(b"kiln_emu_launch\0") }
            .map(|f| *f)
            .map_err(|e| Error::Backend(format!("kiln_emu_launch missing: {e}")))?;
        for (li, l) in spec.launches.iter().enumerate() {
            let f = self.kernel(&l.kernel)?;
            let mut slots: Vec<u64> = l
                .args
                .iter()
                .map(|a| match *a {
                    KernelArg::Arena { offset } => base as u64 + offset,
                    KernelArg::Weight { index } => wbufs[index as usize].as_ptr() as u64,
                    KernelArg::Const { index } => cbufs[index as usize].as_ptr() as u64,
                    KernelArg::I32(v) => v as u32 as u64,
                    KernelArg::U32(v) => v as u64,
                    KernelArg::F32(v) => v.to_bits() as u64,
                    KernelArg::I64(v) => v as u64,
                })
                .collect();
            let mut ptrs: Vec<*mut c_void> = slots.iter_mut().map(|s| s as *mut u64 as *mut c_void).collect();
            // SAFETY: arguments resolved like the device executor does, into live host buffers.
            let rc = unsafe {
                launch(f, ptrs.as_mut_ptr(), l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2])
            };
            if rc != 0 {
                return Err(Error::Backend(format!("emulation refused launch {li} (`{}`, block {:?})", l.kernel, l.block)));
            }
        }
        let mut outs = Vec::with_capacity(spec.outputs.len());
        for slot in &spec.outputs {
            let mut t = HostTensor::zeros(slot.dtype, slot.shape.clone());
            let off = slot.offset.expect("validated") as usize;
            let dst = tensor_bytes_mut(&mut t.data);
            // SAFETY: validated: the slot lies in the arena.
            unsafe { std::ptr::copy_nonoverlapping(base.add(off), dst.as_mut_ptr(), dst.len()) };
            outs.push(t);
        }
        Ok(outs)
    }
}

fn compile(cxx: &Path, src: &str, dir: &Path, key: &str, so: &Path) -> Result<()> {
    let cpp = dir.join(format!("emu-{key}.cpp"));
    std::fs::write(&cpp, src).map_err(|e| Error::io(&cpp, &e))?;
    let tmp = dir.join(format!("emu-{key}.{}.so.tmp", std::process::id()));
    let o = Command::new(cxx)
        .args(["-std=c++20", "-O1", "-pthread", "-shared", "-fPIC", "-w", "-o"])
        .arg(&tmp)
        .arg(&cpp)
        .output()
        .map_err(|e| Error::Backend(format!("running {}: {e}", cxx.display())))?;
    if !o.status.success() {
        let log = String::from_utf8_lossy(&o.stderr);
        let head: String = log.lines().take(40).collect::<Vec<_>>().join("\n");
        return Err(Error::Backend(format!("host compile of emulated CUDA failed ({}):\n{head}", cpp.display())));
    }
    std::fs::rename(&tmp, so).map_err(|e| Error::io(so, &e))
}
