//! Building ONNX protos by hand in tests (the importer's and the fuzzer's seeds).

use kiln_compiler::frontends::onnx::proto::{
    tensor_shape_proto, type_proto, GraphProto, ModelProto, OperatorSetIdProto, TensorShapeProto, TypeProto, ValueInfoProto,
};

/// A model around `g` importing the standard domain at opset 17 and onnxruntime's `com.microsoft`
/// contrib domain (version 1).
pub fn model_with_contrib(g: GraphProto) -> ModelProto {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![
            OperatorSetIdProto { domain: Some(String::new()), version: Some(17) },
            OperatorSetIdProto { domain: Some("com.microsoft".into()), version: Some(1) },
        ],
        graph: Some(g),
        ..Default::default()
    }
}

/// A model around `g` importing the standard domain only, at `opset`.
pub fn model(g: GraphProto, opset: i64) -> ModelProto {
    ModelProto {
        ir_version: Some(10),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(opset) }],
        graph: Some(g),
        ..Default::default()
    }
}

/// A graph input or output: `name`, ONNX element type code `elem` (1 float, 7 int64, ...) and
/// dims, each a size (`Ok`) or a symbolic name (`Err`).
pub fn value_info(name: &str, elem: i32, dims: &[Result<i64, &str>]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| tensor_shape_proto::Dimension {
            value: Some(match d {
                Ok(v) => tensor_shape_proto::dimension::Value::DimValue(*v),
                Err(p) => tensor_shape_proto::dimension::Value::DimParam(p.to_string()),
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor { elem_type: Some(elem), shape: Some(TensorShapeProto { dim }) })),
            ..Default::default()
        }),
        ..Default::default()
    }
}
