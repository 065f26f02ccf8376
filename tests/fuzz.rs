//! Fuzz harnesses, on stable Rust: proptest drives mutations of valid seeds (bit flips, byte
//! sets, inserted and deleted runs, little-endian "interesting" integers written over length
//! fields) into each parser, which must answer `Ok` or a typed `Err`: never panic, abort or
//! hang. `cargo fuzz` needs nightly; proptest also shrinks a failure to a small case and records
//! its seed under `tests/fuzz.proptest-regressions`, replayed first by every later run, so a
//! crash found becomes a regression test.
//!
//! Targets: the artifact decoder and verifier (as read, and with the checksum recomputed after
//! the mutation, as an attacker would, so the decoder behind it is reached), the safetensors
//! loader, the BERT config parser, the BERT graph builder, the bucket parser, and the ONNX
//! frontend (a model with shape folding, contrib ops and an int8 weight, and one of the opset-23
//! RotaryEmbedding and Attention, each decoded, imported and run on the reference backend).
//!
//! `KILN_FUZZ_CASES` sets the cases per target (default 256, the bounded run of the test
//! suite); the long run is
//! `KILN_FUZZ_CASES=100000 cargo test --release --test fuzz -- --nocapture`.

use std::sync::OnceLock;

use kiln_compiler::backends::cpu::{CpuBackend, CpuOptions};
use kiln_compiler::codegen::cpu::CpuTarget;
use kiln_compiler::models::bert::{build_bert, BertConfig, BertOutputs};
use kiln_runtime::artifact::Artifact;
use kiln_runtime::cpu::CpuExecutable;
use kiln_runtime::{block_on, Bucket, SafetensorsLoader, TensorSpec, WeightLoader, WeightSource};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use sha2::{Digest, Sha256};

fn config() -> Config {
    let cases = std::env::var("KILN_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256);
    Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..Config::default()
    }
}

/// One edit of a seed; positions are taken modulo the input's length.
#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Set(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    /// An integer that breaks length arithmetic (0, 1, 2³¹, 2⁶³, MAX, ...) written little-endian.
    Interesting(usize, usize),
}

const INTERESTING: [u64; 10] = [0, 1, 0x7f, 0xff, 0xffff, 0x7fff_ffff, 0xffff_ffff, 1 << 31, 1 << 63, u64::MAX];

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, v)| Mutation::Set(i, v)),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16)).prop_map(|(i, v)| Mutation::Insert(i, v)),
        (any::<usize>(), 1usize..64).prop_map(|(i, n)| Mutation::Delete(i, n)),
        (any::<usize>(), 0..INTERESTING.len() * 4).prop_map(|(i, k)| Mutation::Interesting(i, k)),
    ]
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(mutation(), 1..6)
}

fn apply(seed: &[u8], ms: &[Mutation]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for m in ms {
        if b.is_empty() {
            break;
        }
        let at = |i: usize, b: &Vec<u8>| i % b.len();
        match m {
            Mutation::Flip(i, bit) => {
                let i = at(*i, &b);
                b[i] ^= 1 << bit;
            }
            Mutation::Set(i, v) => {
                let i = at(*i, &b);
                b[i] = *v;
            }
            Mutation::Insert(i, v) => {
                let i = at(*i, &b);
                b.splice(i..i, v.iter().copied());
            }
            Mutation::Delete(i, n) => {
                let i = at(*i, &b);
                let end = (i + n).min(b.len());
                b.drain(i..end);
            }
            Mutation::Interesting(i, k) => {
                let width = [1, 2, 4, 8][k % 4];
                let v = INTERESTING[k / 4].to_le_bytes();
                let i = at(*i, &b);
                let end = (i + width).min(b.len());
                b[i..end].copy_from_slice(&v[..end - i]);
            }
        }
    }
    b
}

/// A real artifact: a two-layer BERT compiled for two buckets (portable x86-64-v3 code).
fn artifact_seed() -> &'static [u8] {
    static SEED: OnceLock<Vec<u8>> = OnceLock::new();
    SEED.get_or_init(|| {
        let g = build_bert(&BertConfig::tiny(), "", BertOutputs::default()).unwrap();
        let be = CpuBackend::with_options(CpuOptions { target: CpuTarget::x86_64_v3(), ..Default::default() }).unwrap();
        be.build_artifact(&g, &[Bucket::new(1, 4), Bucket::new(2, 8)]).unwrap().to_bytes()
    })
}

/// What a loader does with an artifact, short of running it: verify, check the graph, map every
/// CPU plan (code and arena). Nothing is executed.
fn load_artifact(bytes: &[u8]) {
    if let Ok(a) = Artifact::from_bytes(bytes) {
        let _ = a.check_signature(&a.body.signature.graph());
        for p in &a.body.plans {
            if let kiln_runtime::artifact::PlanPayload::Cpu(img) = p {
                let _ = CpuExecutable::load(img.clone());
            }
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn artifact_decoder(ms in mutations(), rechecksum in any::<bool>()) {
        let mut b = apply(artifact_seed(), &ms);
        if rechecksum && b.len() >= 32 {
            let n = b.len() - 32;
            let sum: [u8; 32] = Sha256::digest(&b[..n]).into();
            b[n..].copy_from_slice(&sum);
        }
        load_artifact(&b);
    }
}

/// A safetensors file with the dtypes kiln reads.
fn safetensors_seed() -> &'static [u8] {
    static SEED: OnceLock<Vec<u8>> = OnceLock::new();
    SEED.get_or_init(|| {
        use safetensors::tensor::{Dtype, TensorView};
        let f32s: Vec<u8> = (0..12).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let i64s: Vec<u8> = (0..4).flat_map(|i| (i as i64).to_le_bytes()).collect();
        let f16s: Vec<u8> = (0..6).flat_map(|i| half::f16::from_f32(i as f32).to_le_bytes()).collect();
        let views = vec![
            ("w", TensorView::new(Dtype::F32, vec![3, 4], &f32s).unwrap()),
            ("ids", TensorView::new(Dtype::I64, vec![4], &i64s).unwrap()),
            ("h", TensorView::new(Dtype::F16, vec![2, 3], &f16s).unwrap()),
        ];
        safetensors::serialize(views, None).unwrap()
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn safetensors_loader(ms in mutations()) {
        let b = apply(safetensors_seed(), &ms);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        std::fs::write(&path, &b).unwrap();
        let source = WeightSource::Safetensors(path);
        let loader = SafetensorsLoader::new();
        let mut specs: Vec<TensorSpec> = ["w", "ids", "h"]
            .iter()
            .map(|n| TensorSpec { source: source.clone(), name: n.to_string(), dtype: kiln_runtime::DType::F32, shape: None })
            .collect();
        if let Ok(meta) = block_on(loader.get_metadata(&source)) {
            specs.extend(meta.tensors.iter().map(|t| TensorSpec {
                source: source.clone(),
                name: t.name.clone(),
                dtype: t.dtype,
                shape: Some(t.shape.clone()),
            }));
        }
        for s in &specs {
            if let Ok(t) = block_on(loader.load_tensor(s)) {
                let _ = t.to_host();
            }
        }
        let _ = block_on(loader.load_tensors(&specs));
    }
}

const CONFIG_SEED: &str = r#"{"architectures": ["BertModel"], "model_type": "bert", "vocab_size": 60,
 "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 32,
 "max_position_embeddings": 64, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
 "hidden_act": "gelu", "position_embedding_type": "absolute"}"#;

proptest! {
    #![proptest_config(config())]

    /// Parse, check and build: a config that parses must build a graph or give an error.
    #[test]
    fn config_parser_and_builder(ms in mutations()) {
        let b = apply(CONFIG_SEED.as_bytes(), &ms);
        if let Ok(cfg) = BertConfig::from_json(&String::from_utf8_lossy(&b)) {
            let _ = build_bert(&cfg, "", BertOutputs { embeddings: true, last_hidden_state: true });
        }
    }
}

/// Field values: small ones and ones that break arithmetic.
fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![0usize..40, Just(1usize << 20), Just(1usize << 40), Just(usize::MAX), Just(usize::MAX / 2 + 1)]
}

proptest! {
    #![proptest_config(config())]

    /// The builder on configs made field by field (the parser's checks run inside it too).
    #[test]
    fn bert_builder(
        vocab in dim(), hidden in dim(), layers in prop_oneof![0usize..4, Just(5000usize), Just(usize::MAX)],
        heads in dim(), ffn in dim(), pos in dim(), types in dim(),
        eps in prop_oneof![Just(1e-12), Just(0.0), Just(-1.0), Just(f64::NAN), Just(f64::INFINITY)],
        act in prop_oneof![Just("gelu"), Just("gelu_new"), Just("relu"), Just("silu"), Just("mish")],
    ) {
        let cfg = BertConfig {
            vocab_size: vocab, hidden_size: hidden, num_hidden_layers: layers, num_attention_heads: heads,
            intermediate_size: ffn, max_position_embeddings: pos, type_vocab_size: types, layer_norm_eps: eps,
            hidden_act: act.into(), position_embedding_type: "absolute".into(), model_type: None,
        };
        let _ = build_bert(&cfg, "", BertOutputs::default());
    }

    #[test]
    fn bucket_parser(s in "[0-9x ,+-]{0,24}", ms in mutations()) {
        for text in [s.clone(), String::from_utf8_lossy(&apply(b"8x128", &ms)).into_owned()] {
            if let Ok(b) = Bucket::parse(&text) {
                // What parses prints back to itself.
                prop_assert_eq!(Bucket::parse(&b.to_string()).unwrap(), b);
            }
        }
    }
}

/// A small transformer-ish ONNX model: an embedding table, SkipLayerNormalization, contrib
/// Attention with a mask, a shape subgraph feeding a Reshape, an int8 weight dequantized, a
/// reduction and a softmax.
fn onnx_seed() -> &'static [u8] {
    use kiln_compiler::frontends::onnx::proto::{
        tensor_proto::DataType, AttributeProto, GraphProto, NodeProto, TensorProto,
    };
    use prost::Message;
    static SEED: OnceLock<Vec<u8>> = OnceLock::new();
    SEED.get_or_init(|| {
        let vi = |name: &str, elem: DataType, dims: &[Result<i64, &str>]| kiln_testkit::onnx_proto::value_info(name, elem as i32, dims);
        let f32s = |name: &str, dims: &[i64]| {
            let n: i64 = dims.iter().product();
            let v = (0..n).map(|i| ((i * 37 % 19) as f32 - 9.0) / 10.0).collect();
            TensorProto { name: Some(name.into()), data_type: Some(DataType::Float as i32), dims: dims.to_vec(), float_data: v, ..Default::default() }
        };
        let int = |name: &str, k: i64| AttributeProto { name: Some(name.into()), i: Some(k), r#type: Some(2), ..Default::default() };
        let ints = |name: &str, v: &[i64]| AttributeProto { name: Some(name.into()), ints: v.to_vec(), r#type: Some(7), ..Default::default() };
        let node = |op: &str, domain: &str, ins: &[&str], outs: &[&str], attrs: Vec<AttributeProto>| NodeProto {
            op_type: Some(op.into()),
            domain: Some(domain.into()),
            input: ins.iter().map(|s| s.to_string()).collect(),
            output: outs.iter().map(|s| s.to_string()).collect(),
            attribute: attrs,
            ..Default::default()
        };
        let q: Vec<u8> = (0..64).map(|i| ((i % 7) as i8 - 3) as u8).collect();
        let g = GraphProto {
            node: vec![
                node("Gather", "", &["emb", "input_ids"], &["e"], vec![]),
                node("SkipLayerNormalization", "com.microsoft", &["e", "e", "gamma", "beta"], &["ln"], vec![]),
                node("Cast", "", &["attention_mask"], &["m32"], vec![int("to", 6)]),
                node("Attention", "com.microsoft", &["ln", "w", "bias", "m32"], &["a"], vec![int("num_heads", 2)]),
                node("Shape", "", &["a"], &["sh"], vec![]),
                node("Gather", "", &["sh", "zero"], &["b0"], vec![int("axis", 0)]),
                node("Unsqueeze", "", &["b0", "zero1"], &["b1"], vec![]),
                node("Concat", "", &["b1", "minus1"], &["shp"], vec![int("axis", 0)]),
                node("Reshape", "", &["a", "shp"], &["flat"], vec![]),
                node("Cast", "", &["wq"], &["wf"], vec![int("to", 1)]),
                node("Mul", "", &["wf", "scale"], &["wd"], vec![]),
                node("MatMul", "", &["ln", "wd"], &["p"], vec![]),
                node("ReduceMean", "", &["p"], &["pm"], vec![ints("axes", &[1]), int("keepdims", 0)]),
                node("Softmax", "", &["pm"], &["y"], vec![int("axis", -1)]),
            ],
            input: vec![
                vi("input_ids", DataType::Int64, &[Err("batch"), Err("sequence")]),
                vi("attention_mask", DataType::Int64, &[Err("batch"), Err("sequence")]),
            ],
            output: vec![vi("y", DataType::Float, &[Err("batch"), Ok(8)]), vi("flat", DataType::Float, &[Err("batch"), Ok(-1)])],
            initializer: vec![
                f32s("emb", &[30, 8]),
                f32s("gamma", &[8]),
                f32s("beta", &[8]),
                f32s("w", &[8, 24]),
                f32s("bias", &[24]),
                f32s("scale", &[]),
                TensorProto { name: Some("wq".into()), data_type: Some(DataType::Int8 as i32), dims: vec![8, 8], raw_data: Some(q), ..Default::default() },
                TensorProto { name: Some("zero".into()), data_type: Some(DataType::Int64 as i32), dims: vec![], int64_data: vec![0], ..Default::default() },
                TensorProto { name: Some("zero1".into()), data_type: Some(DataType::Int64 as i32), dims: vec![1], int64_data: vec![0], ..Default::default() },
                TensorProto { name: Some("minus1".into()), data_type: Some(DataType::Int64 as i32), dims: vec![1], int64_data: vec![-1], ..Default::default() },
            ],
            ..Default::default()
        };
        kiln_testkit::onnx_proto::model_with_contrib(g).encode_to_vec()
    })
}

/// `bytes` written as model.onnx in a fresh folder (kept alive by the returned guard) and opened.
fn open_onnx(bytes: &[u8]) -> (tempfile::TempDir, kiln_runtime::Result<kiln_compiler::frontends::onnx::OnnxModel>) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("model.onnx");
    std::fs::write(&p, bytes).unwrap();
    let m = kiln_compiler::frontends::onnx::OnnxModel::open(&p, &[]);
    (dir, m)
}

/// What `kiln run --onnx` does with a model: decode, import for the inputs' shapes, load the
/// weights and run it on the reference backend (token ids and a mask for each [batch, seq]
/// integer input, zeros for the rest).
fn run_onnx(bytes: &[u8]) {
    use kiln_runtime::{HostTensor, TensorData};
    let (_dir, Ok(m)) = open_onnx(bytes) else { return };
    let inputs: Vec<HostTensor> = m
        .inputs
        .iter()
        .map(|i| {
            let shape: Vec<usize> = i.dims.iter().map(|d| d.as_ref().map(|&v| v.min(4)).unwrap_or(3)).collect();
            let n: usize = shape.iter().product();
            HostTensor::new(shape, TensorData::I64((0..n as i64).map(|k| k % 5).collect())).unwrap()
        })
        .collect();
    let _ = kiln::onnx::run_model(&m, &inputs, kiln::BackendKind::Reference);
}

/// The shapes and attributes of [`onnx23_model`].
#[derive(Debug, Clone)]
struct Onnx23 {
    /// Embedding width (Q's width).
    width: i64,
    /// Width of K and V (`MatMul` by a [width, kv_width] weight).
    kv_width: i64,
    q_heads: i64,
    kv_heads: i64,
    causal: i64,
    /// The attention mask's dims (float, an initializer), or none.
    mask: Option<Vec<i64>>,
    rotary_heads: i64,
    rotary_dim: i64,
    interleaved: i64,
    /// Rows and columns of the cos and sin caches.
    cache: (i64, i64),
}

/// A model of the opset-23 ops written over kiln ops at import: RotaryEmbedding (3-D, caches
/// indexed by position ids) feeding the standard Attention (3-D, grouped-query heads, causal,
/// with a float mask).
fn onnx23_model(c: &Onnx23) -> Vec<u8> {
    use kiln_compiler::frontends::onnx::proto::{
        tensor_proto::DataType, AttributeProto, GraphProto, NodeProto, TensorProto,
    };
    use prost::Message;
    let vi = |name: &str, elem: DataType, dims: &[Result<i64, &str>]| kiln_testkit::onnx_proto::value_info(name, elem as i32, dims);
    let f32s = |name: &str, dims: &[i64]| {
        let n: i64 = dims.iter().map(|&d| d.max(0)).product();
        let v = (0..n).map(|i| ((i * 37 % 19) as f32 - 9.0) / 10.0).collect();
        TensorProto { name: Some(name.into()), data_type: Some(DataType::Float as i32), dims: dims.to_vec(), float_data: v, ..Default::default() }
    };
    let int = |name: &str, k: i64| AttributeProto { name: Some(name.into()), i: Some(k), r#type: Some(2), ..Default::default() };
    let node = |op: &str, ins: &[&str], outs: &[&str], attrs: Vec<AttributeProto>| NodeProto {
        op_type: Some(op.into()),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    };
    let rotary = vec![int("num_heads", c.rotary_heads), int("rotary_embedding_dim", c.rotary_dim), int("interleaved", c.interleaved)];
    let attention = vec![int("q_num_heads", c.q_heads), int("kv_num_heads", c.kv_heads), int("is_causal", c.causal)];
    let mut attn_in = vec!["xr", "kv", "kv"];
    let mut init = vec![
        f32s("emb", &[30, c.width]),
        f32s("cos", &[c.cache.0, c.cache.1]),
        f32s("sin", &[c.cache.0, c.cache.1]),
        f32s("wkv", &[c.width, c.kv_width]),
    ];
    if let Some(dims) = &c.mask {
        attn_in.push("mask");
        init.push(f32s("mask", dims));
    }
    let g = GraphProto {
        node: vec![
            node("Gather", &["emb", "input_ids"], &["x"], vec![]),
            node("RotaryEmbedding", &["x", "cos", "sin", "position_ids"], &["xr"], rotary),
            node("MatMul", &["x", "wkv"], &["kv"], vec![]),
            node("Attention", &attn_in, &["y"], attention),
        ],
        input: vec![
            vi("input_ids", DataType::Int64, &[Err("batch"), Err("sequence")]),
            vi("position_ids", DataType::Int64, &[Err("batch"), Err("sequence")]),
        ],
        output: vec![vi("y", DataType::Float, &[Err("batch"), Err("sequence"), Ok(c.width)])],
        initializer: init,
        ..Default::default()
    };
    kiln_testkit::onnx_proto::model(g, 23)
    .encode_to_vec()
}

/// [`onnx23_model`] well formed: width 8 in 2 query heads of 4, one KV head, rotary over whole
/// heads, a [3, 3] mask (`run_onnx` runs 3 × 3).
fn onnx23_seed() -> &'static [u8] {
    static SEED: OnceLock<Vec<u8>> = OnceLock::new();
    SEED.get_or_init(|| {
        onnx23_model(&Onnx23 {
            width: 8,
            kv_width: 4,
            q_heads: 2,
            kv_heads: 1,
            causal: 1,
            mask: Some(vec![3, 3]),
            rotary_heads: 2,
            rotary_dim: 0,
            interleaved: 0,
            cache: (16, 2),
        })
    })
}

/// Consistent shapes and attributes (head size 2, 4 or 6, 1..3 KV heads each shared by 1..3
/// query heads, rotary over whole heads, a mask of a shape that broadcasts, of any shape, or
/// none) with, in most cases, one of them replaced by an arbitrary value.
fn onnx23_params() -> impl Strategy<Value = Onnx23> {
    let masks = prop_oneof![
        Just(None),
        Just(Some(vec![3, 3])),
        Just(Some(vec![3, 1, 1, 3])),
        Just(Some(vec![1, 2])),
        proptest::option::of(proptest::collection::vec(0i64..5, 0..6)),
    ];
    let any = -1i64..10;
    (1i64..4, 1i64..4, 1i64..4, 0i64..2, masks, 0usize..9, any, 0i64..2).prop_map(|(half, hk, group, causal, mask, broken, v, interleaved)| {
        let (d, hq) = (2 * half, hk * group);
        let mut c = Onnx23 {
            width: hq * d,
            kv_width: hk * d,
            q_heads: hq,
            kv_heads: hk,
            causal,
            mask,
            rotary_heads: hq,
            rotary_dim: 0,
            interleaved,
            cache: (16, d / 2),
        };
        match broken {
            1 => c.width = v.max(1),
            2 => c.kv_width = v.max(0),
            3 => c.q_heads = v,
            4 => c.kv_heads = v,
            5 => c.rotary_heads = v,
            6 => c.rotary_dim = v,
            7 => c.cache = (v.max(0), c.cache.1),
            8 => c.cache = (c.cache.0, v.max(0)),
            _ => {}
        }
        c
    })
}

/// One input of a single-node model: a graph input of fixed dims (float, or int64 when the
/// flag is set), or an initializer.
#[derive(Debug, Clone)]
enum NodeInput {
    /// Dims, and whether it is int64.
    Graph(Vec<i64>, bool),
    /// An int64 initializer's values, a scalar when the flag is set and there is one value.
    Ints(Vec<i64>, bool),
    /// A float initializer's dims.
    Floats(Vec<i64>),
    /// An 8-bit integer initializer's values (int8 when the flag is set, else uint8), a scalar
    /// when there is one value.
    Bytes(Vec<i64>, bool),
    /// An omitted optional input (empty name).
    Omitted,
}

/// Attribute names the importer reads (any op's: a node gets the ones it reads or ignores the
/// rest).
const ATTR_NAMES: &[&str] = &[
    "axis", "axes", "keepdims", "perm", "to", "epsilon", "transA", "transB", "alpha", "beta", "mode",
    "noop_with_empty_axes", "select_last_index", "largest", "sorted", "batch_dims", "stash_type",
    "approximate", "exclusive", "reverse", "start", "end", "allowzero", "value", "fmod", "upper",
    "interleaved", "rotary_embedding_dim", "num_heads", "q_num_heads", "kv_num_heads", "is_causal",
    "scale", "softcap", "saturate", "split", "num_outputs", "equation", "direction", "min", "max",
    "K", "N", "bits", "block_size", "output_dtype", "detect_negative", "lambd", "bias", "gamma",
    "opset", "accuracy_level", "qkv_hidden_sizes", "mask_filter_value", "unidirectional",
];

/// One attribute: name index, and its value as an int, ints, a float or a string.
#[derive(Debug, Clone)]
enum AttrValue {
    Int(i64),
    Ints(Vec<i64>),
    Float(f32),
    Str(&'static str),
}

fn node_input() -> impl Strategy<Value = NodeInput> {
    let dim = prop_oneof![12 => 1i64..5, 1 => Just(0i64)];
    prop_oneof![
        8 => (proptest::collection::vec(dim, 0..5), proptest::bool::weighted(0.25)).prop_map(|(d, int)| NodeInput::Graph(d, int)),
        2 => (proptest::collection::vec(-3i64..6, 0..5), any::<bool>()).prop_map(|(v, s)| NodeInput::Ints(v, s)),
        1 => proptest::collection::vec(1i64..4, 0..4).prop_map(NodeInput::Floats),
        1 => (proptest::collection::vec(0i64..256, 1..9), any::<bool>()).prop_map(|(v, s)| NodeInput::Bytes(v, s)),
        1 => Just(NodeInput::Omitted),
    ]
}

fn attr_value() -> impl Strategy<Value = AttrValue> {
    prop_oneof![
        (-3i64..6).prop_map(AttrValue::Int),
        proptest::collection::vec(-3i64..6, 0..5).prop_map(AttrValue::Ints),
        (-2.0f32..2.0).prop_map(AttrValue::Float),
        proptest::sample::select(vec!["", "none", "tanh", "constant", "reflect", "edge", "ij,jk->ik"]).prop_map(AttrValue::Str),
    ]
}

/// One node's op (from `ops`), up to `max_ins - 1` inputs, attributes and output count.
type SingleOp = (&'static str, Vec<NodeInput>, Vec<(usize, AttrValue)>, usize);

fn single_op(ops: Vec<&'static str>, max_ins: usize) -> impl Strategy<Value = SingleOp> {
    (
        proptest::sample::select(ops),
        proptest::collection::vec(node_input(), 0..max_ins),
        proptest::collection::vec((0usize..64, attr_value()), 0..4),
        prop_oneof![6 => Just(1usize), 1 => 2usize..4],
    )
}

/// A model of one node of a supported op (of `domain`: "" or "com.microsoft") over arbitrary
/// inputs and attributes.
fn single_node_model(op: &str, domain: &str, ins: &[NodeInput], attrs: &[(usize, AttrValue)], outs: usize) -> Vec<u8> {
    use kiln_compiler::frontends::onnx::proto::{
        tensor_proto::DataType, type_proto, AttributeProto, GraphProto, NodeProto, TensorProto, TypeProto, ValueInfoProto,
    };
    use prost::Message;
    let mut g = GraphProto::default();
    let mut names = Vec::new();
    for (i, input) in ins.iter().enumerate() {
        let name = format!("in{i}");
        match input {
            NodeInput::Graph(dims, int) => {
                let dims: Vec<Result<i64, &str>> = dims.iter().map(|&d| Ok(d)).collect();
                let elem = if *int { DataType::Int64 } else { DataType::Float };
                g.input.push(kiln_testkit::onnx_proto::value_info(&name, elem as i32, &dims));
            }
            NodeInput::Ints(v, scalar) => g.initializer.push(TensorProto {
                name: Some(name.clone()),
                data_type: Some(DataType::Int64 as i32),
                dims: if *scalar && v.len() == 1 { vec![] } else { vec![v.len() as i64] },
                int64_data: v.clone(),
                ..Default::default()
            }),
            NodeInput::Bytes(v, signed) => g.initializer.push(TensorProto {
                name: Some(name.clone()),
                data_type: Some(if *signed { DataType::Int8 } else { DataType::Uint8 } as i32),
                dims: if v.len() == 1 { vec![] } else { vec![v.len() as i64] },
                int32_data: v.iter().map(|&x| if *signed { x as u8 as i8 as i32 } else { x as i32 }).collect(),
                ..Default::default()
            }),
            NodeInput::Floats(dims) => {
                let n: i64 = dims.iter().product();
                g.initializer.push(TensorProto {
                    name: Some(name.clone()),
                    data_type: Some(DataType::Float as i32),
                    dims: dims.clone(),
                    float_data: (0..n).map(|k| (k % 7) as f32 / 4.0 - 0.75).collect(),
                    ..Default::default()
                });
            }
            NodeInput::Omitted => {
                names.push(String::new());
                continue;
            }
        }
        names.push(name);
    }
    let attribute = attrs
        .iter()
        .map(|(n, v)| {
            let mut a = AttributeProto { name: Some(ATTR_NAMES[n % ATTR_NAMES.len()].into()), ..Default::default() };
            match v {
                AttrValue::Int(i) => (a.i, a.r#type) = (Some(*i), Some(2)),
                AttrValue::Ints(v) => (a.ints, a.r#type) = (v.clone(), Some(7)),
                AttrValue::Float(f) => (a.f, a.r#type) = (Some(*f), Some(1)),
                AttrValue::Str(s) => (a.s, a.r#type) = (Some(s.as_bytes().to_vec()), Some(3)),
            }
            a
        })
        .collect();
    let out_names: Vec<String> = (0..outs).map(|i| format!("y{i}")).collect();
    g.node.push(NodeProto {
        op_type: Some(op.into()),
        domain: Some(domain.into()),
        name: Some("n".into()),
        input: names,
        output: out_names.clone(),
        attribute,
        ..Default::default()
    });
    // Outputs of unknown type and shape: the importer infers them.
    for name in out_names {
        g.output.push(ValueInfoProto {
            name: Some(name),
            r#type: Some(TypeProto { value: Some(type_proto::Value::TensorType(type_proto::Tensor::default())), ..Default::default() }),
            ..Default::default()
        });
    }
    let mut m = kiln_testkit::onnx_proto::model(g, 23);
    if !domain.is_empty() {
        m.opset_import.push(kiln_compiler::frontends::onnx::proto::OperatorSetIdProto { domain: Some(domain.into()), version: Some(1) });
    }
    m.encode_to_vec()
}

/// `model` (one node) with each float graph input of rank 3 or more first passed through a
/// MaxPool of 1-wide windows (the same values): the importer then holds those inputs as rows
/// of channels too (`import/channel_rows.rs`), and per-element ops, BatchNormalization and the
/// window ops read them that way.
fn after_window_op(model: &[u8]) -> Vec<u8> {
    use kiln_compiler::frontends::onnx::proto::{type_proto, AttributeProto, ModelProto, NodeProto};
    use prost::Message;
    let mut m = ModelProto::decode(model).expect("a model this file encoded");
    let g = m.graph.as_mut().expect("graph");
    let mut pools = Vec::new();
    for vi in &g.input {
        let Some(type_proto::Value::TensorType(t)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) else { continue };
        let rank = t.shape.as_ref().map_or(0, |s| s.dim.len());
        if t.elem_type != Some(1) || rank < 3 {
            continue;
        }
        let (from, to) = (vi.name().to_string(), format!("{}.pooled", vi.name()));
        for n in g.node.iter_mut() {
            for i in n.input.iter_mut().filter(|i| **i == from) {
                *i = to.clone();
            }
        }
        pools.push(NodeProto {
            op_type: Some("MaxPool".into()),
            name: Some(format!("pool.{from}")),
            input: vec![from],
            output: vec![to],
            attribute: vec![AttributeProto { name: Some("kernel_shape".into()), ints: vec![1; rank - 2], r#type: Some(7), ..Default::default() }],
            ..Default::default()
        });
    }
    pools.append(&mut g.node);
    g.node = pools;
    m.encode_to_vec()
}

/// Imports and runs a single-node model on the reference backend: any answer but a panic, and
/// an error is one line. Where the reference runs it, the CPU backend (lowered, compiled by
/// Cranelift) must too, to the same values within f32 rounding.
fn run_single_node(bytes: &[u8]) {
    use kiln_runtime::{HostTensor, TensorData};
    let (_dir, m) = open_onnx(bytes);
    let m = match m {
        Ok(m) => m,
        Err(e) => return assert!(!e.to_string().contains('\n'), "{e}"),
    };
    let inputs: Vec<HostTensor> = m
        .inputs
        .iter()
        .map(|i| {
            let shape: Vec<usize> = i.dims.iter().map(|d| d.clone().unwrap_or(2)).collect();
            let n: usize = shape.iter().product();
            HostTensor::new(shape, TensorData::I64((0..n as i64).map(|k| k % 5 - 2).collect())).unwrap()
        })
        .collect();
    let want = match kiln::onnx::run_model(&m, &inputs, kiln::BackendKind::Reference) {
        Ok(y) => y,
        Err(e) => return assert!(!e.to_string().contains('\n'), "{e}"),
    };
    let got = kiln::onnx::run_model(&m, &inputs, kiln::BackendKind::Cpu).unwrap_or_else(|e| panic!("cpu: {e}"));
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!((g.shape.clone(), g.data.dtype()), (w.shape.clone(), w.data.dtype()));
        let (g, w) = (g.data.to_f64_vec(), w.data.to_f64_vec());
        for (a, b) in g.iter().zip(&w) {
            let close = (a - b).abs() <= 1e-5 + 1e-4 * b.abs() || (a.is_nan() && b.is_nan()) || a == b;
            assert!(close, "cpu {a} vs reference {b}: {g:?} vs {w:?}");
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn onnx_frontend(ms in mutations()) {
        run_onnx(&apply(onnx_seed(), &ms));
    }

    #[test]
    fn onnx_frontend_opset23(ms in mutations()) {
        run_onnx(&apply(onnx23_seed(), &ms));
    }

    /// Every supported op, alone, over arbitrary inputs (graph inputs of any rank and size,
    /// empty ones included, integer and float initializers, omitted optional inputs) and
    /// attributes of any type.
    #[test]
    fn onnx_single_ops(c in single_op(kiln_compiler::frontends::onnx::import::supported_ops(), 5)) {
        run_single_node(&single_node_model(c.0, "", &c.1, &c.2, c.3));
    }

    /// The same with the op's rank ≥ 3 float inputs made by a window op: what the importer
    /// does with values it holds as rows of channels.
    #[test]
    fn onnx_single_ops_after_a_window_op(c in single_op(kiln_compiler::frontends::onnx::import::supported_ops(), 5)) {
        run_single_node(&after_window_op(&single_node_model(c.0, "", &c.1, &c.2, c.3)));
    }

    /// The same for every `com.microsoft` op the importer knows (the contrib ops of optimized
    /// and quantized exports).
    #[test]
    fn onnx_single_contrib_ops(c in single_op(kiln_compiler::frontends::onnx::import::supported_contrib_ops(), 8)) {
        run_single_node(&single_node_model(c.0, "com.microsoft", &c.1, &c.2, c.3));
    }

    /// Not bytes but the shapes and attributes of RotaryEmbedding and Attention: the importer's
    /// shape checks, not the protobuf decoder, meet each case.
    #[test]
    fn onnx_attention_and_rotary_shapes(c in onnx23_params()) {
        run_onnx(&onnx23_model(&c));
    }
}

#[test]
fn onnx_seed_runs() {
    let (_dir, m) = open_onnx(onnx_seed());
    let m = m.unwrap();
    let ids = kiln_runtime::HostTensor::i64(vec![2, 3], vec![1, 2, 3, 4, 5, 6]).unwrap();
    let mask = kiln_runtime::HostTensor::i64(vec![2, 3], vec![1, 1, 1, 1, 1, 0]).unwrap();
    let out = kiln::onnx::run_model(&m, &[ids, mask], kiln::BackendKind::Reference).unwrap();
    assert_eq!((out[0].shape.clone(), out[1].shape.clone()), (vec![2, 8], vec![2, 24]));
    // The opset-23 seed, at the shapes `run_onnx` gives it (3 × 3: the mask is [3, 3]).
    let (_dir23, m) = open_onnx(onnx23_seed());
    let m = m.unwrap();
    let ids = kiln_runtime::HostTensor::i64(vec![3, 3], (0..9).map(|k| k % 5).collect()).unwrap();
    let out = kiln::onnx::run_model(&m, &[ids.clone(), ids], kiln::BackendKind::Reference).unwrap();
    assert_eq!(out[0].shape, vec![3, 3, 8]);
    assert!(out[0].as_f32().unwrap().iter().all(|v| v.is_finite()));
}

/// Found by `onnx_single_ops`: an integer division by zero feeding another integer op. Every
/// integer value holds what storing it would leave (1 / 0 saturates to i64::MAX, then / -2), on
/// the reference as on the CPU, which materializes or fuses the intermediate as it likes.
#[test]
fn integer_division_by_zero_agrees_on_every_backend() {
    use kiln_compiler::frontends::onnx::proto::{tensor_proto::DataType, GraphProto, NodeProto, TensorProto};
    use prost::Message;
    let node = |ins: &[&str], out: &str| NodeProto { op_type: Some("Div".into()), input: ins.iter().map(|s| s.to_string()).collect(), output: vec![out.into()], ..Default::default() };
    let g = GraphProto {
        node: vec![node(&["a", "x"], "t"), node(&["t", "c"], "y")],
        input: vec![kiln_testkit::onnx_proto::value_info("x", 7, &[Ok(4)])],
        output: vec![kiln_testkit::onnx_proto::value_info("y", 7, &[Ok(4)])],
        initializer: vec![
            TensorProto { name: Some("a".into()), data_type: Some(DataType::Int64 as i32), dims: vec![4], int64_data: vec![0, 0, 1, 0], ..Default::default() },
            TensorProto { name: Some("c".into()), data_type: Some(DataType::Int64 as i32), dims: vec![4], int64_data: vec![1, 1, -2, 1], ..Default::default() },
        ],
        ..Default::default()
    };
    let (_dir, m) = open_onnx(&kiln_testkit::onnx_proto::model(g, 17).encode_to_vec());
    let m = m.unwrap();
    let x = kiln_runtime::HostTensor::i64(vec![4], vec![-2, -1, 0, 1]).unwrap();
    for k in [kiln::BackendKind::Reference, kiln::BackendKind::Cpu] {
        let y = kiln::onnx::run_model(&m, std::slice::from_ref(&x), k).unwrap();
        // (2^63 - 1 held as a float is 2^63: halved, -2^62.)
        assert_eq!(y[0].data, kiln_runtime::TensorData::I64(vec![0, 0, -(1 << 62), 0]), "{k:?}");
    }
}
