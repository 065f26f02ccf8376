//! `Engine<ReferenceBackend>`: bucket choice, padding and trimming, exactly-once lowering under
//! concurrent first requests, and the precompiled-only policy.

use std::sync::Arc;

use kiln_compiler::reference::ReferenceBackend;
use kiln_compiler::ir::GraphBuilder;
use kiln_runtime::{Backend, Batch, Bucket, DType, Dim, Engine, Error, Graph, HostTensor, InputRole, LowerPolicy};

const SMALL: Bucket = Bucket::new(2, 4);
const LARGE: Bucket = Bucket::new(4, 8);
const VOCAB: usize = 10;
const H: usize = 3;

/// ids, mask -> hidden = table[ids] (per token) and pooled = masked mean of hidden over seq.
fn token_graph() -> Graph {
    let mut g = GraphBuilder::new();
    let ids = g.input("input_ids", DType::I64, vec![Dim::Batch, Dim::Seq], InputRole::TokenIds).unwrap();
    let mask = g.input("attention_mask", DType::I64, vec![Dim::Batch, Dim::Seq], InputRole::AttentionMask).unwrap();
    let table = g.weight("table", DType::F32, &[VOCAB, H]).unwrap();
    let e = g.gather(table, ids).unwrap();
    let m = g.cast(mask, DType::F32).unwrap();
    let m = g.reshape(m, vec![Dim::Batch, Dim::Seq, Dim::Fixed(1)]).unwrap();
    let masked = g.mul(e, m).unwrap();
    let sum = g.reduce_sum(masked, &[1], false).unwrap();
    let count = g.reduce_sum(m, &[1], false).unwrap();
    let pooled = g.div(sum, count).unwrap();
    g.output("hidden", e);
    g.output("pooled", pooled);
    g.finish().unwrap()
}

fn table_value(id: usize, c: usize) -> f32 {
    (id * H + c) as f32 * 0.25 - 1.0
}

fn weights() -> Vec<HostTensor> {
    let v = (0..VOCAB).flat_map(|id| (0..H).map(move |c| table_value(id, c))).collect();
    vec![HostTensor::f32(vec![VOCAB, H], v).unwrap()]
}

fn engine(policy: LowerPolicy) -> Engine<ReferenceBackend> {
    Engine::new(ReferenceBackend, token_graph(), &weights(), &[LARGE, SMALL], policy).unwrap()
}

/// Checks an engine's outputs for `seqs` against values computed directly from the table.
#[track_caller]
fn check_outputs(out: &kiln_runtime::Outputs, seqs: &[Vec<i64>]) {
    let rows = seqs.len();
    let tokens = seqs.iter().map(|s| s.len()).max().unwrap();
    let (hidden, pooled) = (&out.tensors[0], &out.tensors[1]);
    assert_eq!(hidden.shape, [rows, tokens, H], "hidden is trimmed to the batch");
    assert_eq!(pooled.shape, [rows, H], "pooled is trimmed to the batch");
    let hv = hidden.as_f32().unwrap();
    let pv = pooled.as_f32().unwrap();
    for (r, s) in seqs.iter().enumerate() {
        for t in 0..tokens {
            // Padding positions of a short row hold row 0 of the table (pad id 0).
            let id = s.get(t).copied().unwrap_or(0) as usize;
            for c in 0..H {
                assert_eq!(hv[(r * tokens + t) * H + c], table_value(id, c), "hidden[{r},{t},{c}]");
            }
        }
        for c in 0..H {
            let mean = s.iter().map(|&id| table_value(id as usize, c) as f64).sum::<f64>() / s.len() as f64;
            assert!((pv[r * H + c] as f64 - mean).abs() < 1e-6, "pooled[{r},{c}] = {}, want {mean}", pv[r * H + c]);
        }
    }
}

#[test]
fn picks_the_smallest_bucket_pads_and_trims() {
    let e = engine(LowerPolicy::OnFirstRequest);
    assert_eq!(e.buckets(), [SMALL, LARGE]);
    assert_eq!(e.compiled_buckets(), []);

    // 1 row x 3 tokens fits 2x4: lowered once, padded to 2x4, trimmed back.
    let seqs = vec![vec![3, 1, 4]];
    let out = e.infer(&Batch::from_token_ids(e.graph(), &seqs).unwrap()).unwrap();
    check_outputs(&out, &seqs);
    assert_eq!(e.compiled_buckets(), [SMALL]);
    assert_eq!(e.lowerings(), 1);

    // Ragged rows: the short row is padded and its mask keeps the pooled mean exact.
    let seqs = vec![vec![9, 2], vec![5, 6, 7, 8]];
    let out = e.infer(&Batch::from_token_ids(e.graph(), &seqs).unwrap()).unwrap();
    check_outputs(&out, &seqs);
    assert_eq!(e.lowerings(), 1, "the 2x4 plan is reused");

    // 3 rows do not fit 2x4: the 4x8 bucket is lowered.
    let seqs = vec![vec![1], vec![2, 3, 4, 5, 6], vec![7, 8]];
    let out = e.infer(&Batch::from_token_ids(e.graph(), &seqs).unwrap()).unwrap();
    check_outputs(&out, &seqs);
    assert_eq!(e.compiled_buckets(), [SMALL, LARGE]);
    assert_eq!(e.lowerings(), 2);

    // Too many tokens for every bucket: a typed error, nothing lowered.
    let too_long = vec![(0..9).collect::<Vec<i64>>()];
    let err = e.infer(&Batch::from_token_ids(e.graph(), &too_long).unwrap()).unwrap_err();
    assert!(matches!(err, Error::BadBatch { .. }), "{err:?}");
    // An out-of-vocabulary id: a typed error naming the gather node.
    let err = e.infer(&Batch::from_token_ids(e.graph(), &[vec![1, VOCAB as i64]]).unwrap()).unwrap_err();
    assert!(matches!(&err, Error::Graph { node, .. } if node.contains("gather")), "{err:?}");
    assert_eq!(e.lowerings(), 2);
}

#[test]
fn concurrent_first_requests_lower_once() {
    let e = Arc::new(engine(LowerPolicy::OnFirstRequest));
    let seqs = vec![vec![1, 2, 3, 4, 5, 6], vec![7], vec![8, 9]]; // fits only 4x8
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let e = Arc::clone(&e);
                let seqs = seqs.clone();
                s.spawn(move || e.infer(&Batch::from_token_ids(e.graph(), &seqs).unwrap()).unwrap())
            })
            .collect();
        let outs: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for o in &outs {
            check_outputs(o, &seqs);
            assert_eq!(o, &outs[0]);
        }
    });
    assert_eq!(e.lowerings(), 1);
    assert_eq!(e.compiled_buckets(), [LARGE]);
}

#[test]
fn precompiled_only_answers_a_miss_with_bucket_not_compiled() {
    let e = engine(LowerPolicy::PrecompiledOnly);
    let small = Batch::from_token_ids(e.graph(), &[vec![1, 2]]).unwrap();
    match e.infer(&small) {
        Err(Error::BucketNotCompiled { requested, available }) => {
            assert_eq!(requested, SMALL);
            assert!(available.is_empty());
        }
        other => panic!("expected BucketNotCompiled, got {other:?}"),
    }
    // Supply the small bucket's plan: it runs; the large bucket still misses.
    let plan = e.backend().lower(e.weights(), e.graph(), SMALL).unwrap();
    e.insert_plan(SMALL, plan).unwrap();
    check_outputs(&e.infer(&small).unwrap(), &[vec![1, 2]]);
    let large = Batch::from_token_ids(e.graph(), &[vec![1; 7]]).unwrap();
    match e.infer(&large) {
        Err(Error::BucketNotCompiled { requested, available }) => {
            assert_eq!(requested, LARGE);
            assert_eq!(available, [SMALL]);
        }
        other => panic!("expected BucketNotCompiled, got {other:?}"),
    }
    assert_eq!(e.lowerings(), 0);
}
