//! FileCheck-style assertions (LLVM's FileCheck, Cranelift's filetests): a test states the lines
//! that matter, in order, instead of snapshotting a whole dump.
//!
//! Directives, one per line of the check text (`;` comment prefix optional):
//! - `CHECK: pat` — a later line contains `pat`;
//! - `CHECK-NEXT: pat` — the very next line contains `pat`;
//! - `CHECK-NOT: pat` — no line between the previous match and the next positive match (or the
//!   end) contains `pat`;
//! - `CHECK-COUNT-N: pat` — exactly N lines of the whole output contain `pat`.
//!
//! Patterns are literal substrings (no regexes: the dumps are deterministic). Hand-written: the
//! `filecheck` crates on crates.io are unmaintained ports, and these four directives are all
//! kiln's dumps need.

/// One directive.
#[derive(Debug, Clone, PartialEq)]
pub enum Directive {
    Check(String),
    Next(String),
    Not(String),
    Count(usize, String),
}

/// The directives in `text` (lines without one are ignored).
pub fn directives(text: &str) -> Vec<Directive> {
    let mut out = Vec::new();
    for line in text.lines() {
        let l = line.trim_start().trim_start_matches(';').trim_start();
        let Some((head, pat)) = l.split_once(": ") else { continue };
        let pat = pat.trim().to_string();
        let d = match head {
            "CHECK" => Directive::Check(pat),
            "CHECK-NEXT" => Directive::Next(pat),
            "CHECK-NOT" => Directive::Not(pat),
            h => match h.strip_prefix("CHECK-COUNT-").and_then(|n| n.parse().ok()) {
                Some(n) => Directive::Count(n, pat),
                None => continue,
            },
        };
        out.push(d);
    }
    out
}

/// Checks `output` against `directives`; the error says which directive failed and where.
pub fn check(output: &str, directives: &[Directive]) -> Result<(), String> {
    if directives.is_empty() {
        return Err("no CHECK directives: a check that asserts nothing cannot fail".into());
    }
    let lines: Vec<&str> = output.lines().collect();
    // Index of the next line to search from; `last` is the line of the previous match.
    let (mut pos, mut last) = (0usize, None::<usize>);
    let mut pending_not: Vec<&str> = Vec::new();
    let not_between = |pending: &mut Vec<&str>, from: usize, to: usize| -> Result<(), String> {
        for p in pending.drain(..) {
            if let Some(i) = (from..to).find(|&i| lines[i].contains(p)) {
                return Err(format!("CHECK-NOT: `{p}` found on line {}: {}", i + 1, lines[i]));
            }
        }
        Ok(())
    };
    for d in directives {
        match d {
            Directive::Check(p) => {
                let i = (pos..lines.len()).find(|&i| lines[i].contains(p.as_str())).ok_or_else(|| {
                    format!("CHECK: `{p}` not found after line {}", last.map_or(0, |l| l + 1))
                })?;
                not_between(&mut pending_not, pos, i)?;
                (pos, last) = (i + 1, Some(i));
            }
            Directive::Next(p) => {
                let i = last.map_or(0, |l| l + 1);
                if i >= lines.len() || !lines[i].contains(p.as_str()) {
                    return Err(format!(
                        "CHECK-NEXT: `{p}` not on line {}: {}",
                        i + 1,
                        lines.get(i).copied().unwrap_or("<end of output>")
                    ));
                }
                not_between(&mut pending_not, pos, i)?;
                (pos, last) = (i + 1, Some(i));
            }
            Directive::Not(p) => pending_not.push(p),
            Directive::Count(n, p) => {
                let c = lines.iter().filter(|l| l.contains(p.as_str())).count();
                if c != *n {
                    return Err(format!("CHECK-COUNT-{n}: `{p}` is on {c} lines"));
                }
            }
        }
    }
    not_between(&mut pending_not, pos, lines.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "a = 1\nb = gelu(a)\nc = add(b, a)\nd = layer_norm(c)\n";

    fn run(checks: &str) -> Result<(), String> {
        check(OUT, &directives(checks))
    }

    #[test]
    fn directives_hold_and_fail_where_they_should() {
        run("; CHECK: gelu\n; CHECK-NEXT: add\n; CHECK-NOT: mul\n; CHECK: layer_norm").unwrap();
        run("CHECK-COUNT-2: = \nCHECK-COUNT-1: gelu").unwrap_err();
        run("CHECK-COUNT-4: = ").unwrap();
        assert!(run("CHECK: add\nCHECK: gelu").unwrap_err().contains("`gelu` not found"));
        assert!(run("CHECK: gelu\nCHECK-NEXT: layer_norm").unwrap_err().contains("line 3"));
        assert!(run("CHECK: a = 1\nCHECK-NOT: add\nCHECK: layer_norm").unwrap_err().contains("line 3"));
        assert!(run("CHECK: add\nCHECK-NOT: layer").unwrap_err().contains("CHECK-NOT"));
        assert!(run("no directives here").unwrap_err().contains("cannot fail"));
    }
}
