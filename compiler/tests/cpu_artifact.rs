//! CPU plans through artifacts: compiled by `CpuBackend`, written, read back and run by the
//! compiler-free `PrecompiledCpu` — same outputs, bit for bit, as the JIT plan; missing buckets
//! and other graphs are typed errors.

use kiln_runtime::cpu::verify_image;
use kiln_compiler::backends::cpu::CpuBackend;
use kiln_compiler::models::bert::{build_bert, BertConfig, BertOutputs};
use kiln_testkit::random::{random_inputs, random_weights, Rng};
use kiln_runtime::artifact::Artifact;
use kiln_runtime::cpu::{PrecompiledCpu, Threads, WeightPrep};
use kiln_runtime::{Backend, Batch, Bucket, Error, Outputs};

fn graph(layers: usize) -> kiln_runtime::Graph {
    let cfg: BertConfig = serde_json::from_str(&format!(
        r#"{{"vocab_size": 50, "hidden_size": 32, "num_hidden_layers": {layers}, "num_attention_heads": 4,
            "intermediate_size": 64, "max_position_embeddings": 32}}"#
    ))
    .unwrap();
    build_bert(&cfg, "", BertOutputs { embeddings: true, last_hidden_state: true }).unwrap()
}

#[test]
fn precompiled_plans_run_like_jit_plans() {
    let g = graph(2);
    let mut rng = Rng::new(5);
    let weights = random_weights(&g, &mut rng);
    let buckets = [Bucket::new(1, 8), Bucket::new(2, 16)];
    let jit = CpuBackend::single_threaded().unwrap();
    let artifact = jit.build_artifact(&g, &buckets).unwrap();
    let bytes = artifact.to_bytes();
    let pre = PrecompiledCpu::with_threads(Artifact::from_bytes(&bytes).unwrap(), Threads::Single).unwrap();
    assert!(!pre.caps().can_lower);
    let wj = jit.upload(&weights, &g).unwrap();
    let wp = pre.upload(&weights, &g).unwrap();
    for &b in &buckets {
        let inputs = random_inputs(&g, b, &mut rng);
        let batch = Batch { tensors: inputs };
        let mut pj = jit.lower(&wj, &g, b).unwrap();
        let mut pp = pre.lower(&wp, &g, b).unwrap();
        // Linear layers read pre-packed weights.
        assert!(pp.image().weights.iter().any(|s| matches!(s.prep, WeightPrep::PackedB { .. })));
        let (mut oj, mut op) = (Outputs::for_bucket(&g, b), Outputs::for_bucket(&g, b));
        jit.run(&mut pj, &batch, &mut oj).unwrap();
        pre.run(&mut pp, &batch, &mut op).unwrap();
        assert_eq!(oj, op, "bucket {b}");
    }
    // A bucket the artifact lacks: listed.
    match pre.lower(&wp, &g, Bucket::new(4, 32)) {
        Err(Error::BucketNotCompiled { requested, available }) => {
            assert_eq!(requested, Bucket::new(4, 32));
            assert_eq!(available, buckets.to_vec());
        }
        other => panic!("expected BucketNotCompiled, got {:?}", other.map(|_| ())),
    }
    // Another graph (one more layer): refused at upload and at lower.
    let g3 = graph(3);
    let w3 = random_weights(&g3, &mut rng);
    assert!(matches!(pre.upload(&w3, &g3), Err(Error::Artifact { .. })));
    assert!(matches!(pre.lower(&wp, &g3, buckets[0]), Err(Error::Artifact { .. })));
}

#[test]
fn tampered_images_are_rejected_before_mapping() {
    let g = graph(1);
    let jit = CpuBackend::single_threaded().unwrap();
    let (c, _) = jit.compile(&g, Bucket::new(1, 4), false).unwrap();
    verify_image(&c.image).unwrap();
    let mut i = c.image.clone();
    i.arena_init.push((i.arena_bytes - 2, vec![0; 8]));
    assert!(matches!(verify_image(&i), Err(Error::Artifact { .. })));
    let mut i = c.image.clone();
    if let Some(s) = i.weights.iter_mut().find(|s| matches!(s.prep, WeightPrep::PackedB { .. })) {
        if let WeightPrep::PackedB { offset, .. } = &mut s.prep {
            *offset += 1 << 20;
        }
    }
    assert!(matches!(verify_image(&i), Err(Error::Artifact { .. })));
    let mut i = c.image.clone();
    i.kernel_abi += 1;
    assert!(verify_image(&i).unwrap_err().to_string().contains("ABI"));
    let mut i = c.image.clone();
    i.inputs[0].offset = i.outputs[0].offset;
    assert!(verify_image(&i).unwrap_err().to_string().contains("overlap"));
}

/// A plan runs exactly its types, as a GPU plan does: a mistyped input or output buffer given
/// straight to `run` (past the engine's `Batch::check`) is a bad batch naming it, never converted.
#[test]
fn plans_refuse_mistyped_inputs_and_outputs() {
    let g = graph(1);
    let b = Bucket::new(1, 8);
    let be = CpuBackend::single_threaded().unwrap();
    let w = be.upload(&random_weights(&g, &mut Rng::new(1)), &g).unwrap();
    let mut plan = be.lower(&w, &g, b).unwrap();
    let inputs = random_inputs(&g, b, &mut Rng::new(2));
    let mut out = Outputs::for_bucket(&g, b);
    be.run(&mut plan, &Batch { tensors: inputs.clone() }, &mut out).unwrap();
    let mut bad = inputs.clone();
    bad[0] = kiln_runtime::HostTensor::new(bad[0].shape.clone(), bad[0].data.convert(kiln_runtime::DType::F32)).unwrap();
    let e = be.run(&mut plan, &Batch { tensors: bad }, &mut out).unwrap_err();
    assert!(matches!(e, Error::BadBatch { .. }) && e.to_string().contains("input 0 is f32"), "{e}");
    let mut bad_out = Outputs::for_bucket(&g, b);
    bad_out.tensors[0] = kiln_runtime::HostTensor::zeros(kiln_runtime::DType::F16, bad_out.tensors[0].shape.clone());
    let e = be.run(&mut plan, &Batch { tensors: inputs }, &mut bad_out).unwrap_err();
    assert!(e.to_string().contains("output buffer 0 is f16"), "{e}");
}
