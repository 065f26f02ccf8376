//! A model folder that is wrong in one way (hardening issue): a config that does not match its
//! checkpoint, an absurd layer count, an unknown or tanh-form activation, a bad epsilon, another
//! architecture, a NaN weight. Each gives a one-line error naming the file (or the text whose
//! embedding is not finite), or the right answer; none hangs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::model_dir;
use serde_json::Value;

fn kiln(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("kiln runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// A copy of the MiniLM folder in a fresh temporary folder: `config.json` edited by `edit`,
/// the tokenizer linked, the checkpoint linked (or copied when `patch` changes its bytes).
/// Changes the bytes of a checkpoint.
type Patch<'a> = &'a dyn Fn(&mut Vec<u8>);

fn variant(src: &Path, edit: impl FnOnce(&mut Value), patch: Option<Patch>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    for f in ["tokenizer.json", "sentence_bert_config.json"] {
        std::os::unix::fs::symlink(src.join(f), dir.path().join(f)).unwrap();
    }
    let st = dir.path().join("model.safetensors");
    match patch {
        None => std::os::unix::fs::symlink(src.join("model.safetensors"), &st).unwrap(),
        Some(p) => {
            let mut bytes = std::fs::read(src.join("model.safetensors")).unwrap();
            p(&mut bytes);
            std::fs::write(&st, bytes).unwrap();
        }
    }
    dir
}

/// Sets the first element of an f32 tensor of a safetensors image to `v`.
fn set_first(bytes: &mut [u8], tensor: &str, v: f32) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let at = 8 + n + header[tensor]["data_offsets"][0].as_u64().unwrap() as usize;
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn embed(dir: &Path, extra: &[&str]) -> (bool, String, String) {
    let mut args = vec!["embed", "--json", "--model", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.push("A cat sits on the mat.");
    kiln(&args)
}

fn vector(json: &str) -> Vec<f64> {
    let v: Value = serde_json::from_str(json).unwrap();
    v["embeddings"][0].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

fn one_line_error(what: &str, ok: bool, err: &str, needle: &str) {
    assert!(!ok, "{what}: accepted");
    assert!(err.starts_with("error: ") && err.trim().lines().count() == 1 && err.contains(needle), "{what}: {err}");
}

#[test]
fn a_config_that_does_not_match_the_checkpoint_fails_fast_naming_config_json() {
    let Some(src) = model_dir() else { return };
    let cases: [(&str, Value, &str); 6] = [
        ("intermediate_size", 1_000_000_000_000u64.into(), "exceed 1099511627776 parameters"),
        ("num_hidden_layers", 1000.into(), "num_hidden_layers is 1000, the checkpoint has 6 layers"),
        ("num_hidden_layers", 10_000.into(), "num_hidden_layers 10000 is more than kiln builds (4096)"),
        ("num_hidden_layers", 1_000_000_000u64.into(), "more than kiln builds"),
        ("num_hidden_layers", 3.into(), "num_hidden_layers is 3, the checkpoint has 6 layers"),
        ("intermediate_size", 1000.into(), "encoder.layer.0.intermediate.dense.weight` has shape [1536, 384]"),
    ];
    for (key, value, needle) in cases {
        let dir = variant(&src, |c| c[key] = value.clone(), None);
        let t = Instant::now();
        let (ok, _, err) = embed(dir.path(), &[]);
        one_line_error(&format!("{key}={value}"), ok, &err, needle);
        assert!(err.contains("config.json"), "{err}");
        assert!(t.elapsed() < Duration::from_secs(30), "{key}={value} took {:?}", t.elapsed());
    }
}

#[test]
fn bad_activation_epsilon_and_architecture_are_refused() {
    let Some(src) = model_dir() else { return };
    let cases: [(&str, Value, &str); 6] = [
        ("intermediate_size", 1_000_000_000_000u64.into(), "exceed 1099511627776 parameters"),
        ("hidden_act", "mish".into(), "hidden_act `mish` is not supported (gelu, gelu_python, gelu_new"),
        ("layer_norm_eps", 0.0.into(), "layer_norm_eps 0 is not a positive number"),
        ("layer_norm_eps", (-1e-12).into(), "layer_norm_eps -0.000000000001 is not a positive number"),
        ("model_type", "gpt2".into(), "model_type `gpt2` is not a BERT encoder"),
        ("position_embedding_type", "relative_key".into(), "position_embedding_type `relative_key`"),
    ];
    for (key, value, needle) in cases {
        let dir = variant(&src, |c| c[key] = value.clone(), None);
        let (ok, _, err) = embed(dir.path(), &[]);
        one_line_error(&format!("{key}={value}"), ok, &err, needle);
        assert!(err.contains("config.json"), "{err}");
    }
}

/// `gelu_new` (and its aliases) is the tanh form: a different embedding from `gelu`, the same
/// on the compiled CPU backend as on the reference interpreter.
#[test]
fn tanh_gelu_configs_run_the_tanh_form() {
    let Some(src) = model_dir() else { return };
    let erf = variant(&src, |_| {}, None);
    let (ok, out, err) = embed(erf.path(), &[]);
    assert!(ok, "{err}");
    let erf = vector(&out);
    for act in ["gelu_new", "gelu_pytorch_tanh", "gelu_fast"] {
        let dir = variant(&src, |c| c["hidden_act"] = act.into(), None);
        let (ok, out, err) = embed(dir.path(), &[]);
        assert!(ok, "{act}: {err}");
        let cpu = vector(&out);
        let (ok, out, err) = embed(dir.path(), &["--backend", "reference"]);
        assert!(ok, "{act}: {err}");
        let reference = vector(&out);
        let diff = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(diff(&cpu, &reference) < 1e-5, "{act}: cpu vs reference {}", diff(&cpu, &reference));
        assert!(diff(&cpu, &erf) > 1e-5, "{act}: same as the erf GELU ({})", diff(&cpu, &erf));
    }
}

/// One NaN in a query weight makes every embedding NaN; every backend says so, naming the text.
#[test]
fn a_nan_weight_is_reported_on_every_backend() {
    let Some(src) = model_dir() else { return };
    let poison = |b: &mut Vec<u8>| set_first(b, "encoder.layer.0.attention.self.query.weight", f32::NAN);
    let dir = variant(&src, |_| {}, Some(&poison));
    let plan: PathBuf = dir.path().join("plan.kiln");
    let (ok, _, err) = kiln(&["compile", "--model", src.to_str().unwrap(), "--bucket", "1x16", "-o", plan.to_str().unwrap()]);
    assert!(ok, "{err}");
    for extra in [&["--backend", "cpu"][..], &["--backend", "reference"], &["--plan", plan.to_str().unwrap()]] {
        let (ok, _, err) = embed(dir.path(), extra);
        one_line_error(&format!("{extra:?}"), ok, &err, "the embedding of text 0 (\"A cat sits on the mat.\") is not finite");
    }
}

/// A plan runs only with the model it was compiled for: another head count or activation in
/// config.json is refused, naming the plan and the config.
#[test]
fn a_plan_for_another_config_is_refused() {
    let Some(src) = model_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let plan = tmp.path().join("plan.kiln");
    let (ok, _, err) = kiln(&["compile", "--model", src.to_str().unwrap(), "--bucket", "1x16", "-o", plan.to_str().unwrap()]);
    assert!(ok, "{err}");
    let (ok, _, err) = embed(&src, &["--plan", plan.to_str().unwrap()]);
    assert!(ok, "{err}");
    for (key, value) in [("num_attention_heads", Value::from(6)), ("hidden_act", "relu".into())] {
        let dir = variant(&src, |c| c[key] = value.clone(), None);
        let (ok, _, err) = embed(dir.path(), &["--plan", plan.to_str().unwrap()]);
        one_line_error(&format!("{key}={value}"), ok, &err, "compiled for another graph or weight table");
        assert!(err.contains(plan.to_str().unwrap()) && err.contains("config.json"), "{err}");
    }
}

/// Buckets too large for the machine (or for u64 arithmetic) are one-line errors naming the
/// bucket at compile time; an artifact holding one (compiled with the limit lifted) is refused
/// when it is loaded, by a failed allocation turned into an error, not an abort.
#[test]
fn huge_buckets_are_errors_not_aborts() {
    let Some(src) = model_dir() else { return };
    let model = src.to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let plan = tmp.path().join("big.kiln");
    let plan = plan.to_str().unwrap();
    let cases: [(&[&str], &str); 4] = [
        (&["--bucket", "100000x512"], "bucket 100000x512: the arena needs 3"),
        (&["--bucket", "1x16", "--max-arena-bytes", "1000"], "bucket 1x16: the arena needs"),
        (&["--bucket", "1099511627776x512"], "bucket 1099511627776x512: tensor `input_ids` [1099511627776, 512] would take more than"),
        (&["--bucket", "18446744073709551615x512"], "would take more than"),
    ];
    for (args, needle) in cases {
        let mut a = vec!["compile", "--report", "--model", model, "-o", plan];
        a.extend_from_slice(args);
        let (ok, _, err) = kiln(&a);
        let err = err.lines().filter(|l| !l.starts_with('[')).collect::<Vec<_>>().join("\n");
        one_line_error(&format!("{args:?}"), ok, &err, needle);
    }
    assert!(!Path::new(plan).exists(), "an artifact was written");
    let (ok, _, err) =
        kiln(&["compile", "--model", model, "--bucket", "100000x512", "--max-arena-bytes", "18446744073709551615", "-o", plan]);
    assert!(ok, "{err}");
    let needle = format!("{plan}: bucket 100000x512: not available on this machine: cannot allocate an arena of");
    let (ok, _, err) = kiln(&["inspect", plan]);
    let err = err.lines().last().unwrap_or("").to_string();
    assert!(!ok && err.contains(&needle), "inspect: {err}");
    let (ok, _, err) = embed(&src, &["--plan", plan]);
    one_line_error("embed --plan", ok, &err, &needle);
}

/// A tokenizer with more tokens than the embedding table is refused naming tokenizer.json
/// (an id past the table would otherwise fail inside the gather kernel).
#[test]
fn a_tokenizer_larger_than_the_embedding_table_is_refused() {
    let Some(src) = model_dir() else { return };
    let dir = variant(&src, |_| {}, None);
    let tok = dir.path().join("tokenizer.json");
    let mut t: Value = serde_json::from_str(&std::fs::read_to_string(&tok).unwrap()).unwrap();
    std::fs::remove_file(&tok).unwrap(); // the symlink to the original
    t["model"]["vocab"]["zzzz-not-in-the-table"] = 30522.into();
    std::fs::write(&tok, t.to_string()).unwrap();
    let (ok, _, err) = embed(dir.path(), &[]);
    one_line_error("tokenizer", ok, &err, "tokenizer.json: has 30523 tokens, the model's embedding table");
}
