//! Signed artifacts end to end: `kiln keygen`, `compile --sign`, and `--trusted-key` on
//! `inspect` and `embed --plan`. A tampered artifact whose checksum was recomputed, one signed by
//! another key, and an unsigned one are refused under the trust policy before any code is
//! mapped; a correctly signed one gives the JIT's bits.

mod common;

use std::path::Path;
use std::process::Command;

use common::model_dir;
use sha2::{Digest, Sha256};

fn kiln(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("kiln runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The artifact with one byte of its body changed and the checksum recomputed (what an
/// attacker who can write the file does). The signature trailer, if any, is kept.
fn tamper(bytes: &[u8], signed: bool) -> Vec<u8> {
    let mut b = bytes.to_vec();
    let end = b.len() - if signed { 104 } else { 0 };
    let at = end - 32 - 100; // inside the body, away from the lengths
    b[at] ^= 0x5a;
    let sum: [u8; 32] = Sha256::digest(&b[..end - 32]).into();
    b[end - 32..end].copy_from_slice(&sum);
    b
}

#[test]
fn only_artifacts_signed_by_a_trusted_key_run_under_the_policy() {
    let Some(model) = model_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let p = |n: &str| tmp.path().join(n);
    for k in ["alice", "mallory"] {
        let (ok, out, err) = kiln(&["keygen", s(&p(k))]);
        assert!(ok && out.contains("public key"), "{err}");
    }
    let (ok, _, err) = kiln(&["keygen", s(&p("alice"))]);
    assert!(!ok && err.contains("already exists"), "keygen overwrote a key: {err}");

    let compile = |out: &str, sign: Option<&str>| {
        let mut a = vec!["compile", "--model", s(&model), "--bucket", "1x16", "--target", "cpu-native", "-o", out];
        if let Some(k) = sign {
            a.extend_from_slice(&["--sign", k]);
        }
        let (ok, _, err) = kiln(&a);
        assert!(ok, "{err}");
    };
    let (signed, unsigned) = (p("signed.kiln"), p("unsigned.kiln"));
    compile(s(&signed), Some(s(&p("alice.key"))));
    compile(s(&unsigned), None);
    let bytes = std::fs::read(&signed).unwrap();
    let tampered_signed = p("tampered-signed.kiln");
    std::fs::write(&tampered_signed, tamper(&bytes, true)).unwrap();
    // The trailer stripped, then tampered: an unsigned file with a valid checksum.
    let stripped = p("tampered-stripped.kiln");
    std::fs::write(&stripped, tamper(&bytes[..bytes.len() - 104], false)).unwrap();

    let text = "Signed plans run only under a trusted key.";
    let embed = |plan: Option<&Path>, keys: &[&Path]| {
        let mut a = vec!["embed".to_string(), "--json".into(), "--model".into(), s(&model).into()];
        if let Some(pl) = plan {
            a.extend(["--plan".to_string(), s(pl).into()]);
        }
        for k in keys {
            a.extend(["--trusted-key".to_string(), s(k).into()]);
        }
        a.push(text.into());
        let a: Vec<&str> = a.iter().map(|x| x.as_str()).collect();
        kiln(&a)
    };
    let (alice, mallory) = (p("alice.pub"), p("mallory.pub"));

    // Signed by alice, alice trusted: the JIT's bits.
    let (ok, jit, err) = embed(None, &[]);
    assert!(ok, "{err}");
    let (ok, out, err) = embed(Some(&signed), &[&alice]);
    assert!(ok, "{err}");
    assert_eq!(out, jit, "signed plan and JIT differ");
    let (ok, out, err) = kiln(&["inspect", s(&signed), "--trusted-key", s(&alice)]);
    assert!(ok && out.contains("signed by: key") && out.contains("signature verified"), "{out}{err}");
    // Several trusted keys: any one suffices.
    let (ok, _, err) = embed(Some(&signed), &[&mallory, &alice]);
    assert!(ok, "{err}");

    let refusals: [(&Path, &[&Path], &str); 5] = [
        (&signed, &[&mallory], "which is not one of the 1 trusted key(s)"),
        (&unsigned, &[&alice], "unsigned, and only signed artifacts are trusted"),
        (&tampered_signed, &[&alice], "does not verify: the file was altered"),
        (&stripped, &[&alice], "unsigned, and only signed artifacts are trusted"),
        // Without a policy a signature present must still verify.
        (&tampered_signed, &[], "does not verify: the file was altered"),
    ];
    for (plan, keys, needle) in refusals {
        let (ok, _, err) = embed(Some(plan), keys);
        assert!(!ok && err.trim().lines().count() == 1 && err.contains(needle) && err.contains(s(plan)), "{plan:?}: {err}");
        let mut a = vec!["inspect", s(plan)];
        for k in keys {
            a.extend_from_slice(&["--trusted-key", s(k)]);
        }
        let (ok, _, err) = kiln(&a);
        assert!(!ok && err.contains(needle), "inspect {plan:?}: {err}");
    }
    // Without a policy an unsigned (even re-checksummed) artifact runs: the documented default.
    let (ok, _, err) = embed(Some(&unsigned), &[]);
    assert!(ok, "{err}");

    // A key file that is not a key, and a secret key given as a public one.
    let (ok, _, err) = embed(Some(&signed), &[&p("alice.key")]);
    assert!(!ok && err.contains("not an Ed25519 public key"), "{err}");
    let (ok, _, err) = kiln(&["compile", "--model", s(&model), "--bucket", "1x16", "-o", s(&p("x.kiln")), "--sign", s(&alice)]);
    assert!(!ok && err.contains("not an Ed25519 secret key"), "{err}");
}
