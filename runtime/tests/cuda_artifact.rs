//! GPU plans in artifacts, without a GPU: a `CudaPlanSpec` payload round-trips through an
//! artifact, every damaged payload is a typed error naming its bucket, the cubin/PTX choice
//! for a range of devices, and what `PrecompiledCpu` / `PrecompiledCuda` say about an artifact
//! of the other kind. None of this needs the CUDA driver, so it all runs in CI.

use kiln_runtime::artifact::{Artifact, PlanPayload, Target};
use kiln_runtime::cpu::{PrecompiledCpu, Threads};
use kiln_runtime::cuda::{
    check_device_for_artifact, check_plan_weights, plan_from_artifact, select_code, CodeChoice,
    CudaPlanSpec, IoSlot, KernelArg, LaunchSpec, WeightEntry, CUDA_PLAN_VERSION,
};
use kiln_runtime::{Backend, Bucket, DType, Error, HostTensor};

mod common;
use common::{graph, ud2_image};


fn spec(bucket: Bucket, arch: &str, cubin: Option<Vec<u8>>) -> CudaPlanSpec {
    let n = bucket.batch * 4;
    CudaPlanSpec {
        version: CUDA_PLAN_VERSION,
        bucket,
        arch: arch.into(),
        ptx: format!(".version 8.8\n.target {arch}\n.address_size 64\n.visible .entry mul_k0(\n.param .u64 p0\n)\n{{ ret; }}\n"),
        cubin,
        arena_bytes: 2 * 4 * n as u64,
        launches: vec![LaunchSpec {
            kernel: "mul_k0".into(),
            grid: [1, 1, 1],
            block: [128, 1, 1],
            shared_bytes: 0,
            args: vec![
                KernelArg::Arena { offset: 0 },
                KernelArg::Weight { index: 0 },
                KernelArg::Arena { offset: 4 * n as u64 },
                KernelArg::I32(n as i32),
            ],
        }],
        inputs: vec![IoSlot { offset: Some(0), dtype: DType::F32, shape: vec![bucket.batch, 4] }],
        outputs: vec![IoSlot { offset: Some(4 * n as u64), dtype: DType::F32, shape: vec![bucket.batch, 4] }],
        weights: vec![WeightEntry { dtype: DType::F32, shape: vec![4] }],
        constants: vec![vec![1, 2, 3, 4]],
    }
}

const B1: Bucket = Bucket { batch: 1, seq: 1 };
const B2: Bucket = Bucket { batch: 2, seq: 1 };

fn cuda_artifact(payloads: Vec<(Bucket, PlanPayload)>) -> Artifact {
    Artifact::new(&graph(4), Target::Cuda { major: 9, minor: 0 }, payloads)
}

/// A sm_90 artifact with plans for 1x1 (with a cubin) and 2x1 (PTX only), through bytes.
fn verified() -> (Artifact, CudaPlanSpec, CudaPlanSpec) {
    let (s1, s2) = (spec(B1, "sm_90", Some(vec![0x7f, b'E', b'L', b'F', 2, 1])), spec(B2, "sm_90", None));
    let a = cuda_artifact(vec![(B1, PlanPayload::Cuda(s1.clone())), (B2, PlanPayload::Cuda(s2.clone()))]);
    (Artifact::from_bytes(&a.to_bytes()).unwrap(), s1, s2)
}

fn artifact_message(e: Error) -> String {
    match e {
        Error::Artifact { message } => message,
        other => panic!("expected Error::Artifact, got {other:?}"),
    }
}

#[test]
fn gpu_plans_round_trip_through_an_artifact() {
    let (a, s1, s2) = verified();
    assert_eq!(a.header.target, Target::Cuda { major: 9, minor: 0 });
    a.check_graph(&graph(4)).unwrap();
    assert_eq!(plan_from_artifact(&a, B1).unwrap(), s1);
    assert_eq!(plan_from_artifact(&a, B2).unwrap(), s2);
    // The decoded plans are what a device would load: valid, and made for the graph's weights.
    let uploaded: Vec<WeightEntry> = graph(4).weights.iter().map(|w| WeightEntry { dtype: w.dtype, shape: w.shape.clone() }).collect();
    check_plan_weights(&s1, &uploaded).unwrap();
    check_device_for_artifact(&a, (9, 0)).unwrap();
}

#[test]
fn a_missing_bucket_lists_the_buckets_the_artifact_has() {
    let (a, _, _) = verified();
    match plan_from_artifact(&a, Bucket::new(8, 128)) {
        Err(Error::BucketNotCompiled { requested, available }) => {
            assert_eq!(requested, Bucket::new(8, 128));
            assert_eq!(available, vec![B1, B2]);
        }
        other => panic!("expected BucketNotCompiled, got {other:?}"),
    }
}

#[test]
fn damaged_plans_are_typed_errors_naming_the_bucket() {
    // Damaged bytes are the container's business (checksum, lengths, decoding: `artifact.rs`);
    // here a writer that produced an intact file holding a bad plan.
    let cases: Vec<(&str, CudaPlanSpec)> = vec![
        ("another bucket's plan", spec(B1, "sm_90", None)),
        ("unknown layout version", CudaPlanSpec { version: CUDA_PLAN_VERSION + 1, ..spec(B2, "sm_90", None) }),
        ("launch of a kernel the PTX lacks", {
            let mut s = spec(B2, "sm_90", None);
            s.launches[0].kernel = "missing".into();
            s
        }),
        ("output outside the arena", {
            let mut s = spec(B2, "sm_90", None);
            s.outputs[0].offset = Some(s.arena_bytes);
            s
        }),
    ];
    for (what, bad) in cases {
        let a = cuda_artifact(vec![(B1, PlanPayload::Cuda(spec(B1, "sm_90", None))), (B2, PlanPayload::Cuda(bad))]);
        // Refused as the file is read...
        let m = artifact_message(Artifact::from_bytes(&a.to_bytes()).unwrap_err());
        assert!(m.contains("bucket 2x1"), "{what}: {m}");
        // ...and by the GPU loader for an artifact built in memory, while the other bucket loads.
        let m = artifact_message(plan_from_artifact(&a, B2).unwrap_err());
        assert!(m.contains("bucket 2x1"), "{what}: {m}");
        plan_from_artifact(&a, B1).unwrap();
    }
}

#[test]
fn a_plan_for_another_architecture_than_the_header_is_rejected() {
    let a = cuda_artifact(vec![(B1, PlanPayload::Cuda(spec(B1, "sm_80", None)))]);
    let m = artifact_message(plan_from_artifact(&a, B1).unwrap_err());
    assert!(m.contains("sm_80") && m.contains("sm_90") && m.contains("bucket 1x1"), "{m}");
}


#[test]
fn plans_of_the_wrong_kind_are_rejected() {
    // A CPU plan in a CUDA artifact: refused by the verifier, and by the GPU loader for an
    // artifact built in memory.
    let mixed = cuda_artifact(vec![(B1, PlanPayload::Cpu(ud2_image(B1, &[])))]);
    let m = artifact_message(Artifact::from_bytes(&mixed.to_bytes()).unwrap_err());
    assert!(m.contains("cuda artifact holds a non-cuda plan"), "{m}");
    let m = artifact_message(plan_from_artifact(&mixed, B1).unwrap_err());
    assert!(m.contains("bucket 1x1") && m.contains("CPU plan"), "{m}");

    // A GPU plan in a CPU artifact: refused by the verifier.
    let cpu_target = Target::CpuX86_64 { features: vec![] };
    let mixed = Artifact::new(&graph(4), cpu_target.clone(), vec![(B1, PlanPayload::Cuda(spec(B1, "sm_90", None)))]);
    let m = artifact_message(Artifact::from_bytes(&mixed.to_bytes()).unwrap_err());
    assert!(m.contains("cpu artifact holds a non-cpu plan"), "{m}");

    // A CPU artifact given to the GPU side.
    let cpu = Artifact::new(&graph(4), cpu_target, vec![(B1, PlanPayload::Cpu(ud2_image(B1, &[])))]);
    let m = artifact_message(plan_from_artifact(&cpu, B1).unwrap_err());
    assert!(m.contains("not a CUDA GPU"), "{m}");
    let m = artifact_message(check_device_for_artifact(&cpu, (9, 0)).unwrap_err());
    assert!(m.contains("not a CUDA GPU"), "{m}");
}

#[test]
fn precompiled_cpu_refuses_a_cuda_artifact() {
    let (a, _, _) = verified();
    let be = PrecompiledCpu::with_threads(a, Threads::Single).unwrap();
    let w = HostTensor::f32(vec![4], vec![1.0; 4]).unwrap();
    let m = artifact_message(be.upload(&[w], &graph(4)).unwrap_err());
    assert!(m.contains("cuda sm_90") && m.contains("PrecompiledCuda"), "{m}");
}

#[test]
fn cubin_or_ptx_by_device_capability() {
    use CodeChoice::{Cubin, Ptx};
    // (plan arch, has cubin, device) → choice
    let ok = [
        ("sm_90", true, (9, 0), Cubin),
        ("sm_90", false, (9, 0), Ptx),
        ("sm_90", true, (10, 0), Ptx),
        ("sm_90", true, (12, 0), Ptx),
        ("sm_80", true, (8, 0), Cubin),
        ("sm_80", true, (8, 6), Ptx),
        ("sm_80", true, (8, 9), Ptx),
        ("sm_80", false, (9, 0), Ptx),
        ("sm_86", true, (8, 6), Cubin),
        ("sm_75", true, (7, 5), Cubin),
        ("sm_70", true, (9, 0), Ptx),
        ("sm_100", true, (10, 0), Cubin),
        ("sm_100", false, (12, 0), Ptx),
        ("sm_90a", true, (9, 0), Cubin),
        ("sm_90a", false, (9, 0), Ptx),
    ];
    for (arch, cubin, dev, want) in ok {
        assert_eq!(select_code(arch, cubin, dev).unwrap(), want, "{arch} cubin={cubin} on {dev:?}");
    }
    // A device older than the plan: unsupported, naming both.
    for (arch, dev, dev_name) in [("sm_90", (8, 0), "sm_80"), ("sm_90", (8, 9), "sm_89"), ("sm_86", (8, 0), "sm_80"), ("sm_80", (7, 5), "sm_75"), ("sm_100", (9, 0), "sm_90")] {
        for cubin in [false, true] {
            match select_code(arch, cubin, dev) {
                Err(Error::Unsupported(m)) => assert!(m.contains(arch) && m.contains(dev_name), "{m}"),
                other => panic!("{arch} on {dev:?}: expected Unsupported, got {other:?}"),
            }
        }
    }
    // Architecture-specific code runs on exactly its capability.
    assert!(matches!(select_code("sm_90a", false, (10, 0)), Err(Error::Unsupported(m)) if m.contains("sm_90a") && m.contains("sm_100")));
    // Not an architecture at all.
    assert!(matches!(select_code("compute_90", false, (9, 0)), Err(Error::Artifact { .. })));

    // The artifact-level check uses the same rule.
    let (a, _, _) = verified();
    check_device_for_artifact(&a, (9, 0)).unwrap();
    check_device_for_artifact(&a, (10, 0)).unwrap();
    assert!(matches!(check_device_for_artifact(&a, (8, 6)), Err(Error::Unsupported(m)) if m.contains("sm_90") && m.contains("sm_86")));
}

#[test]
fn plan_weights_must_match_the_upload() {
    let s = spec(B1, "sm_90", None);
    check_plan_weights(&s, &[WeightEntry { dtype: DType::F32, shape: vec![4] }]).unwrap();
    let m = artifact_message(check_plan_weights(&s, &[WeightEntry { dtype: DType::F32, shape: vec![5] }]).unwrap_err());
    assert!(m.contains("bucket 1x1") && m.contains("weight 0"), "{m}");
    let m = artifact_message(check_plan_weights(&s, &[]).unwrap_err());
    assert!(m.contains("1 weights") && m.contains("has 0"), "{m}");
}

#[cfg(feature = "cuda")]
mod with_driver_api {
    use kiln_runtime::cuda::{missing_driver_error, PrecompiledCuda};

    use super::*;

    #[test]
    fn precompiled_cuda_refuses_a_cpu_artifact_before_touching_the_driver() {
        let cpu = Artifact::new(&graph(4), Target::CpuX86_64 { features: vec![] }, vec![(B1, PlanPayload::Cpu(ud2_image(B1, &[])))]);
        let m = artifact_message(PrecompiledCuda::new(cpu).unwrap_err());
        assert!(m.contains("not a CUDA GPU"), "{m}");
    }

    #[test]
    fn precompiled_cuda_without_a_driver_is_a_one_line_error() {
        if kiln_runtime::cuda::driver_present().is_ok() {
            eprintln!("SKIPPED: a CUDA driver library is present on this machine");
            return;
        }
        let (a, _, _) = verified();
        let e = PrecompiledCuda::new(a).unwrap_err();
        assert_eq!(e, missing_driver_error());
        let m = e.to_string();
        assert!(m.contains("driver") && !m.contains('\n'), "{m}");
    }
}
