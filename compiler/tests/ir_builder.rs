//! Builder and shape inference: good graphs get the right symbolic shapes, bad ones fail at the
//! node that made the mistake, and per-bucket validation catches what symbols cannot.

use kiln_compiler::ir::GraphExt as _;
use kiln_compiler::ir::GraphBuilder;
use kiln_compiler::models::bert::{build_bert, BertConfig, BertOutputs};
use kiln_runtime::graph::{Dim, InputRole};
use kiln_runtime::{Bucket, DType, Error};

#[test]
fn matmul_broadcast_and_reshape_shapes() {
    let mut g = GraphBuilder::new();
    let x = g.input("x", DType::F32, vec![Dim::Batch, Dim::Seq, Dim::Fixed(8)], InputRole::Other).unwrap();
    let w = g.weight("w", DType::F32, &[4, 8]).unwrap();
    let y = g.matmul_t(x, w, false, true).unwrap();
    assert_eq!(g.shape(y), &[Dim::Batch, Dim::Seq, Dim::Fixed(4)]);
    let r = g.reshape(y, vec![Dim::Batch, Dim::Seq, Dim::Fixed(2), Dim::Fixed(2)]).unwrap();
    let t = g.transpose(r, &[0, 2, 1, 3]).unwrap();
    assert_eq!(g.shape(t), &[Dim::Batch, Dim::Fixed(2), Dim::Seq, Dim::Fixed(2)]);
    let s = g.reduce_sum(t, &[1, 3], true).unwrap();
    assert_eq!(g.shape(s), &[Dim::Batch, Dim::Fixed(1), Dim::Seq, Dim::Fixed(1)]);
    // Same weight name twice: same node.
    assert_eq!(g.weight("w", DType::F32, &[4, 8]).unwrap(), w);
    g.output("s", s);
    let graph = g.finish().unwrap();
    graph.validate(Some(Bucket::new(2, 5))).unwrap();
}

#[test]
fn errors_name_the_node() {
    let mut g = GraphBuilder::new();
    let x = g.input("x", DType::F32, vec![Dim::Batch, Dim::Fixed(8)], InputRole::Other).unwrap();
    let w = g.weight("w", DType::F32, &[7, 3]).unwrap();
    let e = g.scoped("layer0", |g| g.matmul(x, w)).unwrap_err();
    match &e {
        Error::Graph { node, message } => {
            assert!(node.starts_with("layer0.matmul"), "{node}");
            assert!(message.contains("inner dims"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let e = g.reshape(x, vec![Dim::Batch, Dim::Fixed(3)]).unwrap_err();
    assert!(e.to_string().contains("cannot reshape [batch,8] into [batch,3]"), "{e}");
    let v = g.weight("v", DType::F32, &[5]).unwrap();
    let e = g.add(x, v).unwrap_err();
    assert!(e.to_string().contains("do not broadcast"), "{e}");
    let e = g.transpose(x, &[0, 0]).unwrap_err();
    assert!(e.to_string().contains("not a permutation"), "{e}");
    let ids = g.input("ids", DType::I64, vec![Dim::Batch], InputRole::TokenIds).unwrap();
    let e = g.gelu(ids).unwrap_err();
    assert!(e.to_string().contains("float"), "{e}");
    assert!(g.weight("w", DType::F32, &[3, 7]).is_err());
}

#[test]
fn per_bucket_validation_catches_slices_past_the_table() {
    let mut g = GraphBuilder::new();
    let _ids = g.input("ids", DType::I64, vec![Dim::Batch, Dim::Seq], InputRole::TokenIds).unwrap();
    let pos = g.weight("pos", DType::F32, &[16, 4]).unwrap();
    let p = g.slice(pos, 0, 0, Dim::Seq).unwrap();
    g.output("p", p);
    let graph = g.finish().unwrap();
    graph.validate(Some(Bucket::new(1, 16))).unwrap();
    let e = graph.validate(Some(Bucket::new(1, 17))).unwrap_err();
    assert!(e.to_string().contains("slice end 17 past dim of size 16"), "{e}");
}

#[test]
fn minilm_graph_has_the_expected_weight_table_and_outputs() {
    let cfg = BertConfig::minilm_l6();
    let g = build_bert(&cfg, "", BertOutputs { embeddings: true, last_hidden_state: true }).unwrap();
    // 3 embedding tables + embedding LN (2) + 16 per layer.
    assert_eq!(g.weights.len(), 5 + 16 * 6);
    assert_eq!(g.output_names, ["last_hidden_state", "embeddings"]);
    assert_eq!(g.node(g.outputs[1]).shape, vec![Dim::Batch, Dim::Fixed(384)]);
    g.validate(Some(Bucket::new(32, 512))).unwrap();
    assert!(g.validate(Some(Bucket::new(1, 513))).is_err());
    let printed = g.print();
    assert!(printed.contains("\"encoder.layer.5.output.LayerNorm.bias\""));
}

#[test]
fn bucket_parse() {
    assert_eq!(Bucket::parse("8x128").unwrap(), Bucket::new(8, 128));
    assert!(Bucket::parse("8by128").is_err());
    assert!(Bucket::parse("0x128").is_err());
}
