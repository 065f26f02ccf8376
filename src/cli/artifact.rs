//! Artifacts and keys: `kiln inspect`, `kiln keygen`, the `--trusted-key` policy.

use std::path::PathBuf;

use kiln_runtime::{Error, Result};


/// An artifact error with the file it came from in front of its message; other errors as they are.
pub(crate) fn in_file(path: &std::path::Path, e: Error) -> Error {
    match e {
        // Already names its file.
        e @ (Error::Io { .. } | Error::Model { .. } | Error::MalformedWeights { .. }) => e,
        e => e.context(path.display()),
    }
}

/// `--trusted-key` files: none means any intact artifact (unsigned ones included).
pub(crate) fn trust_policy(keys: &[PathBuf]) -> Result<kiln_runtime::TrustPolicy> {
    if keys.is_empty() {
        return Ok(kiln_runtime::TrustPolicy::AnyIntact);
    }
    kiln_runtime::TrustPolicy::from_key_files(keys)
}

/// `kiln keygen PREFIX`: PREFIX.key (0600) and PREFIX.pub, created new (never overwritten).
pub(crate) fn keygen(prefix: &std::path::Path) -> Result<()> {
    use ed25519_dalek::pkcs8::{spki::der::pem::LineEnding, EncodePrivateKey, EncodePublicKey};
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let with_ext = |ext: &str| {
        let mut p = prefix.as_os_str().to_owned();
        p.push(ext);
        PathBuf::from(p)
    };
    let (secret_path, public_path) = (with_ext(".key"), with_ext(".pub"));
    for p in [&secret_path, &public_path] {
        if p.symlink_metadata().is_ok() {
            return Err(Error::Io { path: p.clone(), message: "already exists; kiln keygen never overwrites a file".into() });
        }
    }
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| Error::Backend(format!("no OS random source: {e}")))?;
    let key = ed25519_dalek::SigningKey::from_bytes(&seed);
    let internal = |e: &dyn std::fmt::Display| Error::Backend(format!("cannot encode the key: {e}"));
    // PKCS#8 v1 (no public key inside), the form OpenSSL 3.0 reads; ed25519-dalek reads both.
    let secret = ed25519_dalek::pkcs8::KeypairBytes { secret_key: key.to_bytes(), public_key: None }
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| internal(&e))?;
    let public = key.verifying_key().to_public_key_pem(LineEnding::LF).map_err(|e| internal(&e))?;
    let write = |p: &std::path::Path, text: &str, mode: u32| -> Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(p).map_err(|e| Error::io(p, &e))?;
        f.write_all(text.as_bytes()).map_err(|e| Error::io(p, &e))
    };
    write(&secret_path, &secret, 0o600)?;
    write(&public_path, &public, 0o644)?;
    println!("secret key: {} (keep it private)", secret_path.display());
    println!("public key: {} (key {})", public_path.display(), kiln_runtime::trust::key_id(&key.verifying_key()));
    Ok(())
}

pub(crate) fn inspect(path: &std::path::Path, trust: &kiln_runtime::TrustPolicy) -> Result<()> {
    use kiln_runtime::artifact::{Artifact, PlanPayload, FORMAT_VERSION};
    use kiln_runtime::signature::hex;
    let t = std::time::Instant::now();
    let a = Artifact::from_file_with(path, trust).map_err(|e| in_file(path, e))?;
    let verify_ms = t.elapsed().as_secs_f64() * 1e3;
    let size = std::fs::metadata(path).map_err(|e| Error::io(path, &e))?.len();
    println!("file: {} ({size} bytes)", path.display());
    println!("format: {FORMAT_VERSION:08x} (hash of the serialized types, format/build.rs)");
    println!("kiln version: {}", a.header.kiln_version);
    println!("target: {}", a.header.target);
    println!("graph fingerprint: {}", hex(&a.header.fingerprint));
    match &a.signer {
        Some(k) => println!("signed by: key {} (signature verified)", kiln_runtime::trust::key_id(k)),
        None => println!("signed by: nobody (unsigned: trust it like an executable)"),
    }
    println!("verified (magic, version, checksum, target) in {verify_ms:.2} ms");
    // Map every CPU plan as a run would (verify image, code write-then-exec, arena + constants).
    if a.body.plans.iter().any(|p| matches!(p, PlanPayload::Cpu(_))) {
        let t = std::time::Instant::now();
        for p in &a.body.plans {
            if let PlanPayload::Cpu(img) = p {
                kiln_runtime::cpu::CpuExecutable::load(img.clone()).map_err(|e| in_file(path, e))?;
            }
        }
        let ms = verify_ms + t.elapsed().as_secs_f64() * 1e3;
        println!("load (verify + map code + arenas of all buckets): {ms:.2} ms");
    }
    // Check every GPU plan against the artifact as a load would (without a device: no code is
    // loaded; the container validated each plan as it decoded).
    if let kiln_runtime::artifact::Target::Cuda { .. } = a.header.target {
        let t = std::time::Instant::now();
        for &b in &a.header.buckets {
            kiln_runtime::cuda::plan_from_artifact(&a, b).map_err(|e| in_file(path, e))?;
        }
        let ms = verify_ms + t.elapsed().as_secs_f64() * 1e3;
        println!("GPU plans decoded and validated (launches, bindings, PTX entries) in {ms:.2} ms");
    }
    for (b, p) in a.header.buckets.iter().zip(&a.body.plans) {
        match p {
            PlanPayload::Cpu(img) => println!(
                "bucket {b}: {} kernels, code {} bytes, arena {} bytes, features {}",
                img.steps.len(),
                img.code.len(),
                img.arena_bytes,
                img.required_features.join(",")
            ),
            PlanPayload::Cuda(s) => println!(
                "bucket {b}: gpu plan {}, {} launches, PTX {} bytes, cubin {}, arena {} bytes, constants {} bytes",
                s.arch,
                s.launches.len(),
                s.ptx.len(),
                s.cubin.as_ref().map_or("none".to_string(), |c| format!("{} bytes", c.len())),
                s.arena_bytes,
                s.constants.iter().map(|c| c.len()).sum::<usize>()
            ),
        }
    }
    Ok(())
}
