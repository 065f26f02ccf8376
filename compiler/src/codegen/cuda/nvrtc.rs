//! NVRTC (CUDA C → PTX) and, where it is installed, `ptxas` (PTX → cubin).
//!
//! Both are optional at run time: NVRTC is loaded dynamically by cudarc, which panics when the
//! library is missing, so every entry point checks [`nvrtc_present`] first and returns a typed
//! error instead. `ptxas` is looked up on `PATH`; without it plans carry PTX only and the driver
//! JIT-compiles it when the plan is loaded.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::nvrtc::{self, CompileError, CompileOptions};
use kiln_runtime::{Error, Result};

/// Whether the NVRTC library (`libnvrtc.so`) can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { nvrtc::sys::is_culib_present() }
}

/// The one-line error for a machine without NVRTC.
pub fn missing_nvrtc_error() -> Error {
    Error::Environment(
        "NVRTC library not found (libnvrtc.so could not be loaded): install the CUDA toolkit or the PyPI wheel \
         nvidia-cuda-nvrtc-cu12 and put its lib directory on LD_LIBRARY_PATH"
            .into(),
    )
}

/// `Ok` when NVRTC is available, else the typed error.
pub fn require_nvrtc() -> Result<()> {
    if nvrtc_present() {
        Ok(())
    } else {
        Err(missing_nvrtc_error())
    }
}

/// NVRTC's version, e.g. (12, 9).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    require_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; nvrtcVersion writes two ints.
    let r = unsafe { nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r != nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::environment(format!("nvrtcVersion failed: {r:?}")));
    }
    Ok((major, minor))
}

fn virtual_arch(arch: &str) -> Result<&'static str> {
    Ok(match arch {
        "sm_70" => "compute_70",
        "sm_72" => "compute_72",
        "sm_75" => "compute_75",
        "sm_80" => "compute_80",
        "sm_86" => "compute_86",
        "sm_87" => "compute_87",
        "sm_89" => "compute_89",
        "sm_90" => "compute_90",
        "sm_100" => "compute_100",
        "sm_120" => "compute_120",
        other => {
            let (maj, min) = kiln_runtime::cuda::parse_arch(other)
                .ok_or_else(|| Error::Unsupported(format!("`{other}` is not a CUDA architecture (sm_XY)")))?;
            // Rare architectures: a small, bounded leak of one string per distinct name.
            Box::leak(format!("compute_{maj}{min}").into_boxed_str())
        }
    })
}

/// Compiles CUDA C to PTX for `arch` (`sm_90` → `compute_90` PTX). A compile error is an
/// `Error::Backend` carrying NVRTC's log.
pub fn compile_ptx(source: &str, arch: &str, name: &str) -> Result<String> {
    require_nvrtc()?;
    if source.contains('\0') {
        return Err(Error::internal("nvrtc", format!("CUDA source of `{name}` contains a NUL byte")));
    }
    let opts = CompileOptions {
        arch: Some(virtual_arch(arch)?),
        name: Some(format!("{name}.cu")),
        // IEEE division and square root, FMA contraction on: the numerics the reference expects
        // up to rounding.
        prec_div: Some(true),
        prec_sqrt: Some(true),
        fmad: Some(true),
        ..Default::default()
    };
    match nvrtc::compile_ptx_with_opts(source, opts) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(CompileError::CompileError { log, options, .. }) => Err(Error::internal("nvrtc", format!(
            "NVRTC could not compile `{name}` for {arch} (options {options:?}): {}",
            log.to_string_lossy().lines().map(str::trim).filter(|l| !l.is_empty()).take(8).collect::<Vec<_>>().join(" | ")
        ))),
        Err(e) => Err(Error::internal("nvrtc", format!("NVRTC failed on `{name}` for {arch}: {e:?}"))),
    }
}

/// The executable `ptxas` on `PATH`, if any. (A `ptxas` without its execute bit, as the
/// nvidia-cuda-nvcc wheel unpacks it, does not count: `chmod +x` it.)
pub fn find_ptxas() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("ptxas")).find(|p| is_executable(p))
}

fn is_executable(p: &std::path::Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }
    #[cfg(not(unix))]
    {
        p.is_file()
    }
}

static SCRATCH: AtomicUsize = AtomicUsize::new(0);

/// Assembles PTX into a cubin for exactly `arch` with `ptxas`. `None` when ptxas is not
/// installed; `Some(Err)` when it fails.
pub fn ptxas_cubin(ptx: &str, arch: &str) -> Option<Result<Vec<u8>>> {
    let ptxas = find_ptxas()?;
    Some(run_ptxas(&ptxas, ptx, arch))
}

fn run_ptxas(ptxas: &std::path::Path, ptx: &str, arch: &str) -> Result<Vec<u8>> {
    let dir = std::env::temp_dir().join(format!(
        "kiln-ptxas-{}-{}",
        std::process::id(),
        SCRATCH.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, &e))?;
    let (src, out) = (dir.join("plan.ptx"), dir.join("plan.cubin"));
    let result = (|| {
        std::fs::write(&src, ptx).map_err(|e| Error::io(&src, &e))?;
        let o = Command::new(ptxas)
            .arg(format!("-arch={arch}"))
            .arg("-O3")
            .arg("-o")
            .arg(&out)
            .arg(&src)
            .output()
            .map_err(|e| Error::environment(format!("running {}: {e}", ptxas.display())))?;
        if !o.status.success() {
            return Err(Error::internal("nvrtc", format!(
                "ptxas failed for {arch}: {}",
                String::from_utf8_lossy(&o.stderr).trim_end()
            )));
        }
        std::fs::read(&out).map_err(|e| Error::io(&out, &e))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
