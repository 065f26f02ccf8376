//! Artifact verification: every corruption is a typed error, and nothing is executed. The code
//! in these artifacts is `ud2` (an illegal instruction), so running it would kill the test.

use kiln_runtime::artifact::{Artifact, PlanPayload, Target, FORMAT_VERSION};
use kiln_runtime::signature::fingerprint;
use kiln_runtime::cpu::CpuExecutable;
use kiln_runtime::{Bucket, DType, Error, Op};

mod common;
use common::{graph, ud2_image as image};



fn artifact(features: &[&str]) -> Artifact {
    let t = Target::CpuX86_64 { features: features.iter().map(|s| s.to_string()).collect() };
    let plans = [Bucket::new(1, 1), Bucket::new(2, 1)]
        .into_iter()
        .map(|b| (b, PlanPayload::Cpu(image(b, features))))
        .collect();
    Artifact::new(&graph(4), t, plans)
}

fn is_artifact_error(r: Result<Artifact, Error>) -> bool {
    matches!(r, Err(Error::Artifact { .. }))
}

#[test]
fn round_trip() {
    let a = artifact(&[]);
    let bytes = a.to_bytes();
    let b = Artifact::from_bytes(&bytes).unwrap();
    assert_eq!(a, b);
    b.check_graph(&graph(4)).unwrap();
    assert!(matches!(b.plan(Bucket::new(2, 1)).unwrap(), PlanPayload::Cpu(i) if i.bucket == Bucket::new(2, 1)));
    assert_eq!(b.header.fingerprint, fingerprint(&graph(4)));
}

#[test]
fn every_truncation_is_rejected() {
    let bytes = artifact(&[]).to_bytes();
    for n in 0..bytes.len() {
        assert!(is_artifact_error(Artifact::from_bytes(&bytes[..n])), "truncated to {n} bytes");
    }
}

#[test]
fn every_flipped_byte_is_rejected() {
    let bytes = artifact(&[]).to_bytes();
    for i in 0..bytes.len() {
        for bit in [0x01u8, 0x80] {
            let mut b = bytes.clone();
            b[i] ^= bit;
            assert!(is_artifact_error(Artifact::from_bytes(&b)), "flip {bit:#x} at byte {i} was accepted");
        }
    }
}

#[test]
fn random_mutations_are_rejected_without_panicking() {
    let bytes = artifact(&[]).to_bytes();
    let mut s = 0x9E3779B97F4A7C15u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for _ in 0..3000 {
        let mut b = bytes.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() % b.len() as u64) as usize;
            match next() % 3 {
                0 => b[i] = next() as u8,
                1 => b.insert(i, next() as u8),
                _ => {
                    b.remove(i);
                }
            }
        }
        if b != bytes {
            assert!(is_artifact_error(Artifact::from_bytes(&b)));
        }
    }
}

#[test]
fn wrong_magic_and_another_format_say_so() {
    let mut b = artifact(&[]).to_bytes();
    b[0] = b'X';
    let e = Artifact::from_bytes(&b).unwrap_err();
    assert!(e.to_string().contains("bad magic"), "{e}");
    let mut b = artifact(&[]).to_bytes();
    b[8..12].copy_from_slice(&(FORMAT_VERSION ^ 1).to_le_bytes());
    // Without a matching checksum the version is not believed: corruption, not another kiln.
    let e = Artifact::from_bytes(&b).unwrap_err();
    assert!(e.to_string().contains("corrupt") && !e.to_string().contains("another kiln build"), "{e}");
    // An intact file of another format.
    let n = b.len() - 32;
    let sum: [u8; 32] = sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(&b[..n])).into();
    b[n..].copy_from_slice(&sum);
    let e = Artifact::from_bytes(&b).unwrap_err();
    assert!(e.to_string().contains("written by another kiln build"), "{e}");
}

#[test]
fn missing_cpu_features_are_rejected_before_mapping() {
    let bytes = artifact(&["avx2", "kiln-imaginary-feature"]).to_bytes();
    let e = Artifact::from_bytes(&bytes).unwrap_err();
    assert!(e.to_string().contains("kiln-imaginary-feature"), "{e}");
    // The image-level check refuses too, so the executable is never mapped.
    let e = CpuExecutable::load(image(Bucket::new(1, 1), &["kiln-imaginary-feature"])).err().unwrap();
    assert!(e.to_string().contains("lacks features"), "{e}");
}

#[test]
fn another_graph_is_rejected() {
    let a = Artifact::from_bytes(&artifact(&[]).to_bytes()).unwrap();
    let e = a.check_graph(&graph(5)).unwrap_err();
    assert!(e.to_string().contains("another graph"), "{e}");
    let mut renamed = graph(4);
    renamed.weights[0].name = "w2".into();
    assert!(a.check_graph(&renamed).is_err());
    // What a runtime holding no graph checks: the signature (inputs, outputs, weight table).
    assert!(a.check_signature(&graph(5)).unwrap_err().to_string().contains("other inputs"));
    assert!(a.check_signature(&renamed).unwrap_err().to_string().contains("other weight table"));
}

/// The artifact ships the graph's signature, not its ops: the interface graph built from it has
/// the graph's signature and only input, weight and precompiled-output nodes.
#[test]
fn artifacts_carry_the_signature_not_the_graph() {
    let a = Artifact::from_bytes(&artifact(&[]).to_bytes()).unwrap();
    assert_eq!(a.body.signature, graph(4).signature());
    let iface = a.body.signature.graph();
    iface.check_structure().unwrap();
    assert_eq!(iface.signature(), graph(4).signature());
    assert!(iface.nodes.iter().all(|n| matches!(n.op, Op::Input { .. } | Op::Weight { .. } | Op::Precompiled { .. })));
    a.check_signature(&iface).unwrap();
    a.check_signature(&graph(4)).unwrap();
    // The interface graph is not the graph: the exact check needs the real one.
    assert!(a.check_graph(&iface).is_err());
}

#[test]
fn missing_bucket_lists_the_ones_present() {
    let a = Artifact::from_bytes(&artifact(&[]).to_bytes()).unwrap();
    let e = a.plan(Bucket::new(8, 128)).unwrap_err();
    let s = e.to_string();
    assert!(s.contains("8x128") && s.contains("1x1, 2x1"), "{s}");
}

#[test]
fn images_with_entries_or_bindings_outside_are_rejected() {
    let mut i = image(Bucket::new(1, 1), &[]);
    i.steps[0].entry = 99;
    assert!(CpuExecutable::load(i).is_err());
    let mut i = image(Bucket::new(1, 1), &[]);
    i.outputs[0].offset = 120;
    assert!(CpuExecutable::load(i).is_err());
}

/// The executor maps and calls real code: `mov dword [rdi+64], 0x40400000 (3.0); xor eax, eax;
/// ret`, i.e. the kernel writes 3.0 into the first output element in the arena (rdi = arena)
/// and returns status 0.
#[test]
#[cfg(target_arch = "x86_64")]
fn executor_runs_verified_code() {
    use kiln_runtime::cpu::Inline;
    use kiln_runtime::HostTensor;
    let mut img = image(Bucket::new(1, 1), &[]);
    img.code = vec![0xC7, 0x47, 0x40, 0x00, 0x00, 0x40, 0x40, 0x31, 0xC0, 0xC3];
    let mut exe = CpuExecutable::load(img).unwrap();
    let input = HostTensor::f32(vec![1, 4], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    let mut out = vec![HostTensor::zeros(DType::F32, vec![1, 4])];
    unsafe { exe.run(&[], std::ptr::null(), std::slice::from_ref(&input), &mut out, &Inline) }.unwrap();
    assert_eq!(out[0].to_f32_vec(), vec![3.0, 0.0, 0.0, 0.0]);
    assert_eq!(&exe.arena()[..16], &[0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64]);
    // A batch of the wrong shape is refused before any code runs.
    let bad = HostTensor::f32(vec![2, 4], vec![0.0; 8]).unwrap();
    assert!(unsafe { exe.run(&[], std::ptr::null(), &[bad], &mut out, &Inline) }.is_err());
}

/// Signed artifacts through the library API: the signer is reported, every single-byte flip and
/// every truncation of a signed file is refused under a policy that trusts its key, and a
/// policy trusting another key refuses it.
#[test]
fn signatures_and_trust_policy() {
    use ed25519_dalek::SigningKey;
    use kiln_runtime::TrustPolicy;
    let (alice, mallory) = (SigningKey::from_bytes(&[7; 32]), SigningKey::from_bytes(&[9; 32]));
    let a = artifact(&[]);
    let bytes = a.to_signed_bytes(&alice);
    let trust_alice = TrustPolicy::SignedBy(vec![alice.verifying_key()]);
    let b = Artifact::from_bytes_with(&bytes, &trust_alice).unwrap();
    assert_eq!(b.signer, Some(alice.verifying_key()));
    assert_eq!((b.header, b.body), (a.header.clone(), a.body.clone()));
    assert_eq!(Artifact::from_bytes(&bytes).unwrap().signer, Some(alice.verifying_key()));
    let e = Artifact::from_bytes_with(&bytes, &TrustPolicy::SignedBy(vec![mallory.verifying_key()])).unwrap_err();
    assert!(e.to_string().contains("not one of the 1 trusted key(s)"), "{e}");
    let e = Artifact::from_bytes_with(&a.to_bytes(), &trust_alice).unwrap_err();
    assert!(e.to_string().contains("unsigned"), "{e}");
    for i in 0..bytes.len() {
        let mut c = bytes.clone();
        c[i] ^= 0x01;
        assert!(is_artifact_error(Artifact::from_bytes_with(&c, &trust_alice)), "flip at {i} accepted");
    }
    for n in 0..bytes.len() {
        assert!(is_artifact_error(Artifact::from_bytes_with(&bytes[..n], &trust_alice)), "truncation to {n} accepted");
    }
}

/// Node names are labels: renaming one keeps the fingerprint; an op, a shape, an output name or
/// a weight name changes it.
#[test]
fn fingerprint_ignores_node_names_only() {
    let g = graph(4);
    let fp = fingerprint(&g);
    let mut renamed = g.clone();
    renamed.nodes[2].name = "product".into();
    assert_eq!(fingerprint(&renamed), fp);
    let mut op = g.clone();
    op.nodes[2].op = kiln_runtime::Op::Binary(kiln_runtime::BinaryOp::Add);
    let mut out = g.clone();
    out.output_names[0] = "z".into();
    let mut w = g.clone();
    w.weights[0].name = "v".into();
    for other in [op, out, w, graph(5)] {
        assert_ne!(fingerprint(&other), fp);
    }
}

/// The kiln version in the header is checked: another release series is refused by name.
#[test]
fn another_kiln_release_is_refused() {
    let mut a = artifact(&[]);
    for (v, ok) in [(env!("CARGO_PKG_VERSION"), true), ("0.1.99", true), ("0.2.0", false), ("1.0.0", false), ("garbage", false)] {
        a.header.kiln_version = v.into();
        let r = Artifact::from_bytes(&a.to_bytes());
        assert_eq!(r.is_ok(), ok, "{v}: {r:?}");
        if !ok {
            assert!(r.unwrap_err().to_string().contains(&format!("written by kiln {v}")));
        }
    }
}
