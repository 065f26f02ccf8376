//! The `kiln` binary end to end: compile → artifact → inspect → embed through the thin runtime,
//! the compile report, and the errors a user sees.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::model_dir;

use serde_json::Value;

fn kiln(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("kiln runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn embeddings(json: &str) -> Vec<Vec<f64>> {
    let v: Value = serde_json::from_str(json).expect("json output");
    v["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect())
        .collect()
}

fn golden_sentence0() -> (String, Vec<f64>) {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/minilm/golden.json");
    let g: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let s = &g["sentences"][0];
    (s["text"].as_str().unwrap().to_string(), s["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect())
}

fn max_abs(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

#[test]
fn compile_inspect_and_embed_through_a_plan() {
    let Some(dir) = model_dir() else { return };
    let d = dir.to_str().unwrap();
    let tmp = std::env::temp_dir().join(format!("kiln-cli-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let plan = tmp.join("minilm.kiln");
    let p = plan.to_str().unwrap();

    let (ok, out, err) = kiln(&["compile", "--model", d, "--bucket", "1x16,2x32", "--target", "cpu", "--report", "-o", p]);
    assert!(ok, "{err}");
    assert!(err.contains("[1/2] compiling bucket 1x16") && err.contains("[2/2] compiling bucket 2x32"), "{err}");
    for line in ["ops before: ", "kernels after: ", "arena bytes: ", "naive bytes: ", "lower bound bytes: "] {
        assert!(out.contains(line), "missing `{line}` in:\n{out}");
    }

    let (ok, out, err) = kiln(&["inspect", p]);
    assert!(ok, "{err}");
    assert!(out.contains("bucket 1x16: 54 kernels") && out.contains("bucket 2x32"), "{out}");

    let (text, want) = golden_sentence0();
    let (ok, out, err) = kiln(&["embed", "--plan", p, "--model", d, "--json", &text]);
    assert!(ok, "{err}");
    let got = embeddings(&out);
    assert!(max_abs(&got[0], &want) <= 1e-4, "plan vs golden: {}", max_abs(&got[0], &want));

    // The JIT CPU backend gives the same numbers.
    let (ok, out, err) = kiln(&["embed", "--backend", "cpu", "--model", d, "--json", &text]);
    assert!(ok, "{err}");
    assert!(max_abs(&embeddings(&out)[0], &got[0]) <= 1e-6);

    // A text longer than every bucket: an error naming the largest bucket.
    let long = "word ".repeat(60);
    let (ok, _, err) = kiln(&["embed", "--plan", p, "--model", d, &long]);
    assert!(!ok && err.contains("fit no bucket") && err.contains("largest: 2 rows, 32 tokens"), "{err}");

    // A damaged artifact is rejected with the file named, and nothing runs.
    let mut bytes = std::fs::read(&plan).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    let bad = tmp.join("bad.kiln");
    std::fs::write(&bad, &bytes).unwrap();
    let (ok, _, err) = kiln(&["embed", "--plan", bad.to_str().unwrap(), "--model", d, "x"]);
    assert!(!ok && err.contains("bad.kiln") && err.contains("checksum"), "{err}");
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn user_errors_are_one_line() {
    let (ok, _, err) = kiln(&["embed", "--model", "/nonexistent-model-dir", "x"]);
    assert!(!ok && err.starts_with("error: /nonexistent-model-dir: not a model directory"), "{err}");
    let (ok, _, err) = kiln(&["compile", "--model", "/nonexistent-model-dir", "--bucket", "8by128"]);
    assert!(!ok && err.contains("error:"), "{err}");
    let (ok, _, err) = kiln(&["inspect", "/nonexistent.kiln"]);
    assert!(!ok && err.trim().lines().count() == 1, "{err}");
}

#[test]
fn cuda_without_a_driver_is_a_one_line_error() {
    let Some(dir) = model_dir() else { return };
    let (ok, _, err) = kiln(&["embed", "--backend", "cuda", "--model", dir.to_str().unwrap(), "x"]);
    if ok {
        eprintln!("SKIPPED: this machine has a CUDA driver");
        return;
    }
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("driver"), "{err}");
}

/// Checks the one-line, no-panic error of `kiln embed --plan` for a GPU artifact on a machine
/// without the CUDA driver. `false` (nothing checked) where a driver is present.
fn embed_gpu_plan_without_driver(plan: &str, model: &str) -> bool {
    if kiln_runtime::cuda::driver_present().is_ok() {
        eprintln!("SKIPPED (embed --plan on a GPU artifact): this machine has a CUDA driver");
        return false;
    }
    let (ok, out, err) = kiln(&["embed", "--plan", plan, "--model", model, "x"]);
    assert!(!ok && out.is_empty(), "{out}{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.starts_with("error: ") && err.contains("CUDA driver") && err.contains("GPU plans (cuda sm_90)"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    true
}

#[test]
fn cuda_artifact_compiles_and_inspects() {
    let Some(dir) = model_dir() else { return };
    if !kiln_testkit::random::nvrtc_or_skip() {
        return;
    }
    let d = dir.to_str().unwrap();
    let tmp = std::env::temp_dir().join(format!("kiln-cli-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let plan = tmp.join("minilm-sm90.kiln");
    let p = plan.to_str().unwrap();

    let t = std::time::Instant::now();
    let (ok, _, err) = kiln(&["compile", "--model", d, "--bucket", "1x16", "--target", "cuda:sm_90", "-o", p]);
    assert!(ok, "{err}");
    eprintln!("compile --target cuda:sm_90 (1 bucket): {:.1} s", t.elapsed().as_secs_f64());

    let (ok, out, err) = kiln(&["inspect", p]);
    assert!(ok, "{err}");
    assert!(out.contains("target: cuda sm_90") && out.contains("GPU plans decoded and validated"), "{out}");
    let line = out.lines().find(|l| l.starts_with("bucket 1x16: ")).unwrap_or_else(|| panic!("no bucket line in:\n{out}"));
    let rest = line.strip_prefix("bucket 1x16: gpu plan sm_90, ").unwrap_or_else(|| panic!("{line}"));
    let launches: usize = rest.split(' ').next().unwrap().parse().unwrap_or_else(|_| panic!("{line}"));
    assert!(launches >= 60, "{line}");
    for part in [" launches, PTX ", " bytes, cubin ", ", arena ", " bytes, constants ", " bytes"] {
        assert!(rest.contains(part), "missing `{part}` in {line}");
    }

    // Run it: on a machine without the CUDA driver, a one-line error naming the driver.
    embed_gpu_plan_without_driver(p, d);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// The same error without NVRTC: a GPU artifact written by hand (the driver check comes first,
/// so no plan inside is needed).
#[test]
fn embed_with_a_gpu_plan_without_a_driver_is_a_one_line_error() {
    use kiln_runtime::artifact::{Artifact, Target};
    let Some(dir) = model_dir() else { return };
    let m = kiln::model::SentenceModel::open(&dir, kiln_compiler::models::bert::BertOutputs::default()).unwrap();
    let tmp = std::env::temp_dir().join(format!("kiln-cli-gpu-plan-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let plan = tmp.join("empty-sm90.kiln");
    std::fs::write(&plan, Artifact::new(&m.graph, Target::Cuda { major: 9, minor: 0 }, vec![]).to_bytes()).unwrap();
    embed_gpu_plan_without_driver(plan.to_str().unwrap(), dir.to_str().unwrap());
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn thread_counts_are_validated() {
    let Some(dir) = model_dir() else { return };
    for n in ["0", "100000", "18446744073709551615"] {
        let (ok, _, err) = kiln(&["bench", "--model", dir.to_str().unwrap(), "--bucket", "1x8", "--runs", "1", "--threads", n]);
        assert!(!ok && err.trim().lines().count() == 1 && err.contains(&format!("{n} threads: the thread count must be between 1 and 4096")), "{n}: {err}");
    }
}

/// `kiln bench --profile` prints the share of GEMM, attention, norms and the rest, which add up
/// to the kernels' time.
#[test]
fn bench_profile_shares_add_up() {
    let Some(dir) = model_dir() else { return };
    let (ok, out, err) = kiln(&["bench", "--model", dir.to_str().unwrap(), "--bucket", "1x16", "--runs", "2", "--threads", "1", "--profile"]);
    assert!(ok, "{err}");
    let line = out.lines().find(|l| l.contains("time by kind:")).unwrap_or_else(|| panic!("no share line in:\n{out}"));
    let mut sum = 0.0;
    for kind in ["attention", "gemm", "norms", "the rest"] {
        let at = line.find(&format!("{kind} ")).unwrap_or_else(|| panic!("{kind} missing: {line}"));
        let pct: f64 = line[at + kind.len() + 1..].split('%').next().unwrap().parse().unwrap();
        sum += pct;
    }
    assert!((sum - 100.0).abs() < 0.5, "{line}");
}

/// A reader that stops early: `kiln inspect` into a closed pipe ends by SIGPIPE like other Unix
/// filters, with nothing on stderr (it panicked in `println!` before).
#[test]
#[cfg(unix)]
fn a_closed_stdout_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let Some(model) = model_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let plan = tmp.path().join("p.kiln");
    let (ok, _, err) = kiln(&["compile", "--model", model.to_str().unwrap(), "--bucket", "1x16", "-o", plan.to_str().unwrap()]);
    assert!(ok, "{err}");
    // The reader is gone before kiln starts.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["inspect", plan.to_str().unwrap()])
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "status {:?}, stderr: {err}", out.status);
    assert!(err.is_empty(), "stderr: {err}");
}
