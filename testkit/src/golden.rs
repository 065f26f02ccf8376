//! Golden tests: `tests/golden/<stage>/<case>.txt` holds the printed output of one stage for
//! one input. `BLESS=1` rewrites the file; otherwise a mismatch fails with a unified-style diff.

use std::path::PathBuf;

/// The workspace root (the directory above this crate).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Compares `actual` with the golden file `rel_path` (relative to the workspace root), or
/// rewrites it when `BLESS=1`. Panics with a readable diff on a mismatch or a missing file.
pub fn check_golden(rel_path: &str, actual: &str) {
    let path = workspace_root().join(rel_path);
    if std::env::var("BLESS").is_ok_and(|v| v == "1") {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        }
        std::fs::write(&path, actual).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        return;
    }
    let expected = match std::fs::read_to_string(&path) {
        Ok(s) => s,
        Err(e) => panic!("golden file {} unreadable ({e}); run with BLESS=1 to create it", path.display()),
    };
    if expected != actual {
        panic!("golden mismatch for {rel_path} (BLESS=1 rewrites it):\n{}", diff(&expected, actual));
    }
}

/// A line diff of `a` (expected) and `b` (actual): `-` lines only in `a`, `+` only in `b`, with
/// two lines of context around each change.
pub fn diff(a: &str, b: &str) -> String {
    let (x, y): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    // Longest common subsequence table (files here are small).
    let (n, m) = (x.len(), y.len());
    let mut l = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            l[i][j] = if x[i] == y[j] { l[i + 1][j + 1] + 1 } else { l[i + 1][j].max(l[i][j + 1]) };
        }
    }
    let mut ops: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && x[i] == y[j] {
            ops.push((' ', x[i]));
            i += 1;
            j += 1;
        } else if j < m && (i == n || l[i][j + 1] >= l[i + 1][j]) {
            ops.push(('+', y[j]));
            j += 1;
        } else {
            ops.push(('-', x[i]));
            i += 1;
        }
    }
    let near: Vec<bool> = (0..ops.len())
        .map(|k| ops[k.saturating_sub(2)..(k + 3).min(ops.len())].iter().any(|(c, _)| *c != ' '))
        .collect();
    let mut out = String::new();
    let mut skipped = false;
    for (k, (c, line)) in ops.iter().enumerate() {
        if near[k] {
            if skipped {
                out.push_str("@@ ...\n");
                skipped = false;
            }
            out.push_str(&format!("{c}{line}\n"));
        } else {
            skipped = true;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_marks_changes() {
        let d = diff("a\nb\nc\n", "a\nB\nc\n");
        assert!(d.contains("-b\n") && d.contains("+B\n") && d.contains(" a\n"), "{d}");
    }
}
