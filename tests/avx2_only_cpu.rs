//! kiln on an AVX2-only CPU, made from this one: `scripts/cpuid_no_avx512.c` (LD_PRELOAD) hides
//! AVX-512 from CPUID in the `kiln` it runs under, through Linux's CPUID faulting. What ships to
//! many machines is checked where it lands:
//! - an artifact compiled for this machine's AVX-512 (`--target cpu-native`) is refused there
//!   with one line naming the file and the missing features, before any of its code runs;
//! - the JIT there takes the AVX2 path and gives the same bits as the AVX-512 one here, and so
//!   do a portable artifact (`--target cpu`) run there and an artifact compiled there run here.
//!
//! Needs x86-64 Linux with `cpuid_fault` (and, for the refusal, AVX-512) and a C compiler;
//! elsewhere each test says SKIPPED and why.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::model_dir;

/// The shim built into `dir`, or why it cannot be used here.
fn shim(dir: &Path) -> Result<PathBuf, String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").map_err(|e| format!("/proc/cpuinfo: {e}"))?;
    let flags = cpuinfo.lines().find(|l| l.starts_with("flags")).unwrap_or("");
    if !flags.split_whitespace().any(|f| f == "cpuid_fault") {
        return Err("this CPU/kernel has no CPUID faulting (cpuid_fault)".into());
    }
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/cpuid_no_avx512.c");
    let so = dir.join("cpuid_no_avx512.so");
    let out = Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .output()
        .map_err(|e| format!("cc: {e}"))?;
    if !out.status.success() {
        return Err(format!("cc failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(so)
}

fn has_avx512f() -> bool {
    kiln_runtime::cpu::has_cpu_feature("avx512f")
}

/// `kiln args`, under the shim when `so` is given: (success, stdout, stderr).
fn kiln(so: Option<&Path>, args: &[&str]) -> (bool, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
    c.args(args);
    if let Some(so) = so {
        c.env("LD_PRELOAD", so);
    }
    c.env_remove("KILN_NO_AVX512");
    let out = c.output().expect("kiln runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The shim and the model, or None after saying why the test is skipped.
fn setup(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let model = model_dir()?;
    match shim(dir) {
        Ok(so) => Some((so, model)),
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            None
        }
    }
}

#[test]
fn an_avx512_artifact_is_refused_on_an_avx2_only_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((so, model)) = setup(tmp.path()) else { return };
    if !has_avx512f() {
        eprintln!("SKIPPED: this CPU has no AVX-512 to compile an artifact for");
        return;
    }
    let plan = tmp.path().join("native.kiln");
    let (ok, _, err) = kiln(None, &["compile", "--model", s(&model), "--bucket", "1x16", "--target", "cpu-native", "-o", s(&plan)]);
    assert!(ok, "{err}");
    let (ok, out, _) = kiln(None, &["inspect", s(&plan)]);
    assert!(ok && out.contains("+avx512f"), "a cpu-native artifact here should need AVX-512: {out}");
    for args in [vec!["inspect", s(&plan)], vec!["embed", "--model", s(&model), "--plan", s(&plan), "x"]] {
        let (ok, out, err) = kiln(Some(&so), &args);
        assert!(!ok && out.is_empty(), "{args:?} ran on the AVX2-only CPU: {out}");
        assert!(
            err.trim().lines().count() == 1
                && err.contains(s(&plan))
                && err.contains("this CPU lacks features the plan needs: avx512f"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn the_avx2_only_cpu_gives_the_same_bits() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((so, model)) = setup(tmp.path()) else { return };
    let text = "Same bits on every machine.";
    let embed = |under: Option<&Path>, plan: Option<&Path>| {
        let mut a = vec!["embed", "--json", "--model", s(&model)];
        if let Some(p) = plan {
            a.extend(["--plan", s(p)]);
        }
        a.push(text);
        let (ok, out, err) = kiln(under, &a);
        assert!(ok, "embed (shim {}, plan {plan:?}): {err}", under.is_some());
        out
    };
    let here = embed(None, None);
    assert!(here.contains("embeddings"), "{here}");
    assert_eq!(embed(Some(&so), None), here, "the JIT's AVX2 path differs from this machine's");

    // Compiled on the AVX2-only CPU: it records no AVX-512 and runs on both.
    let there = tmp.path().join("avx2.kiln");
    let (ok, _, err) = kiln(Some(&so), &["compile", "--model", s(&model), "--bucket", "1x16", "--target", "cpu-native", "-o", s(&there)]);
    assert!(ok, "{err}");
    let (ok, out, err) = kiln(None, &["inspect", s(&there)]);
    assert!(ok && out.contains("+avx2") && !out.contains("avx512"), "{out}{err}");
    assert_eq!(embed(None, Some(&there)), here, "the AVX2-only CPU's artifact differs here");
    assert_eq!(embed(Some(&so), Some(&there)), here, "the AVX2-only CPU's artifact differs there");

    // The portable artifact compiled here runs there.
    let portable = tmp.path().join("portable.kiln");
    let (ok, _, err) = kiln(None, &["compile", "--model", s(&model), "--bucket", "1x16", "--target", "cpu", "-o", s(&portable)]);
    assert!(ok, "{err}");
    assert_eq!(embed(Some(&so), Some(&portable)), here, "the portable artifact differs on the AVX2-only CPU");
}
