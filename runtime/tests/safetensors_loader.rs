//! SafetensorsLoader against files these tests write: the happy path (zero-copy, conversion,
//! metadata without data reads) and every error a user can meet.

use std::path::{Path, PathBuf};

use half::f16;
use kiln_runtime::graph::WeightSpec;
use kiln_runtime::{
    block_on, load_graph_weights, DType, Error, SafetensorsLoader, TensorData, TensorSpec, WeightLoader, WeightSource,
};

/// Writes a safetensors file by hand: 8-byte header length, JSON header, data.
fn write_file(path: &Path, tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) {
    let mut header = String::from("{\"__metadata__\":{\"format\":\"pt\"}");
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.push_str(&format!(
            ",\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":{shape:?},\"data_offsets\":[{start},{}]}}",
            data.len()
        ));
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap();
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn tmp(name: &str) -> PathBuf {
    // Under the target dir (cargo's scratch space for integration tests), not left in /tmp.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("kiln-st-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn sample(path: &Path) {
    let h: Vec<u8> = [1.5f32, -2.0, 0.25].iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect();
    write_file(
        path,
        &[
            ("w", "F32", vec![2, 3], f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])),
            ("h", "F16", vec![3], h),
            ("ids", "I64", vec![2], [7i64, 9].iter().flat_map(|x| x.to_le_bytes()).collect()),
        ],
    );
}

fn spec(path: &Path, name: &str, dtype: DType, shape: Option<Vec<usize>>) -> TensorSpec {
    TensorSpec { source: WeightSource::Safetensors(path.into()), name: name.into(), dtype, shape }
}

#[test]
fn loads_zero_copy_and_converts_on_request() {
    let p = tmp("ok.safetensors");
    sample(&p);
    let l = SafetensorsLoader::new();
    let w = block_on(l.load_tensor(&spec(&p, "w", DType::F32, Some(vec![2, 3])))).unwrap();
    assert!(w.is_mapped());
    assert_eq!(w.to_host().data, TensorData::F32(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
    let h = block_on(l.load_tensor(&spec(&p, "h", DType::F32, None))).unwrap();
    assert!(!h.is_mapped());
    assert_eq!(h.to_host().data, TensorData::F32(vec![1.5, -2.0, 0.25]));
    let w16 = block_on(l.load_tensor(&spec(&p, "w", DType::BF16, None))).unwrap();
    assert_eq!(w16.to_host().to_f32_vec(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let ids = block_on(l.load_tensor(&spec(&p, "ids", DType::I64, None))).unwrap();
    assert_eq!(ids.to_host().data, TensorData::I64(vec![7, 9]));
    let both = block_on(l.load_tensors(&[spec(&p, "ids", DType::I64, None), spec(&p, "w", DType::F32, None)])).unwrap();
    assert_eq!(both.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["ids", "w"]);
    block_on(l.preload(&WeightSource::Safetensors(p.clone()))).unwrap();
    assert!(block_on(l.is_available(&WeightSource::Safetensors(p.clone()))));
    assert!(l.capabilities().zero_copy);
}

#[test]
fn metadata_lists_tensors_sorted_with_sizes() {
    let p = tmp("meta.safetensors");
    sample(&p);
    let m = block_on(SafetensorsLoader::new().get_metadata(&WeightSource::Safetensors(p.clone()))).unwrap();
    let names: Vec<_> = m.tensors.iter().map(|t| (t.name.as_str(), t.dtype, t.shape.clone(), t.bytes)).collect();
    assert_eq!(
        names,
        vec![("h", DType::F16, vec![3], 6), ("ids", DType::I64, vec![2], 16), ("w", DType::F32, vec![2, 3], 24)]
    );
    assert_eq!(m.total_bytes, 46);
}

#[test]
fn missing_file_is_an_io_error_naming_it() {
    let p = tmp("does-not-exist.safetensors");
    let l = SafetensorsLoader::new();
    let e = block_on(l.load_tensor(&spec(&p, "w", DType::F32, None))).unwrap_err();
    assert!(matches!(&e, Error::Io { path, .. } if path == &p), "{e:?}");
    assert!(e.to_string().contains("does-not-exist.safetensors"));
    assert!(!block_on(l.is_available(&WeightSource::Safetensors(p))));
}

#[test]
fn truncated_and_corrupt_files_are_malformed_errors() {
    let good = tmp("good.safetensors");
    sample(&good);
    let bytes = std::fs::read(&good).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("short-length", bytes[..5].to_vec()),
        ("truncated-header", bytes[..20].to_vec()),
        ("truncated-data", bytes[..bytes.len() - 4].to_vec()),
        ("huge-header-len", {
            let mut b = bytes.clone();
            b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
            b
        }),
        ("garbage-json", {
            let mut b = bytes.clone();
            b[8] = b'[';
            b
        }),
    ];
    for (name, b) in cases {
        let p = tmp(&format!("{name}.safetensors"));
        std::fs::write(&p, &b).unwrap();
        let e = block_on(SafetensorsLoader::new().load_tensor(&spec(&p, "w", DType::F32, None))).unwrap_err();
        assert!(matches!(&e, Error::MalformedWeights { path, .. } if path == &p), "{name}: {e:?}");
        assert!(e.to_string().contains(&format!("{name}.safetensors")), "{name}: {e}");
    }
}

#[test]
fn overlapping_offsets_are_rejected() {
    let p = tmp("overlap.safetensors");
    let header = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&[0u8; 12]);
    std::fs::write(&p, out).unwrap();
    let e = block_on(SafetensorsLoader::new().load_tensor(&spec(&p, "a", DType::F32, None))).unwrap_err();
    assert!(matches!(e, Error::MalformedWeights { .. }), "{e:?}");
}

#[test]
fn unknown_tensor_and_mismatches_name_the_tensor() {
    let p = tmp("mismatch.safetensors");
    sample(&p);
    let l = SafetensorsLoader::new();
    let e = block_on(l.load_tensor(&spec(&p, "nope", DType::F32, None))).unwrap_err();
    assert!(matches!(&e, Error::MissingTensor { tensor, .. } if tensor == "nope"), "{e:?}");
    let e = block_on(l.load_tensor(&spec(&p, "w", DType::F32, Some(vec![3, 2])))).unwrap_err();
    assert!(matches!(&e, Error::TensorMismatch { tensor, .. } if tensor == "w"), "{e:?}");
    assert!(e.to_string().contains("[3, 2]") && e.to_string().contains("[2, 3]"), "{e}");
    let e = block_on(l.load_tensor(&spec(&p, "ids", DType::F32, None))).unwrap_err();
    assert!(matches!(&e, Error::TensorMismatch { tensor, .. } if tensor == "ids"), "{e:?}");
}

#[test]
fn graph_weight_table_loads_in_order_and_checks_specs() {
    let p = tmp("table.safetensors");
    sample(&p);
    let table = vec![
        WeightSpec::new("h", DType::F32, vec![3]),
        WeightSpec::new("w", DType::F32, vec![2, 3]),
    ];
    let ts = load_graph_weights(&SafetensorsLoader::new(), &p, &table).unwrap();
    assert_eq!(ts[0].shape, vec![3]);
    assert_eq!(ts[1].to_f32_vec()[5], 6.0);
    let bad = vec![WeightSpec::new("w", DType::F32, vec![6])];
    assert!(matches!(load_graph_weights(&SafetensorsLoader::new(), &p, &bad), Err(Error::TensorMismatch { .. })));
}

#[test]
fn loader_is_dyn_compatible() {
    let l: Box<dyn WeightLoader> = Box::new(SafetensorsLoader::new());
    let p = tmp("dyn.safetensors");
    sample(&p);
    assert!(block_on(l.is_available(&WeightSource::Safetensors(p))));
}
