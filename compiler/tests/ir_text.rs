//! The graph's text form: `parse(print(g))` is `g` (up to node names) for the builder's graphs,
//! MiniLM, random graphs and graphs after the passes; bad text is an error naming its line; and
//! the filetests under `tests/golden/filecheck/` — a graph written as text, the stage to run and
//! `CHECK:` lines — each run their stage and are checked FileCheck-style, and the CPU plan of
//! each is compared with the reference interpreter on random inputs.

use kiln_compiler::backends::cpu::CpuBackend;
use kiln_compiler::ir::{parse, GraphExt as _};
use kiln_compiler::models::bert::{build_bert, BertConfig, BertOutputs};
use kiln_compiler::pipeline::{dump_after, run_pipeline, STAGES};
use kiln_compiler::reference::interpret;
use kiln_runtime::signature::fingerprint;
use kiln_runtime::{Backend, Batch, Bucket, Error, Graph, Outputs};
use kiln_testkit::filecheck;
use kiln_testkit::golden::workspace_root;
use kiln_testkit::random::{compare, random_case, random_inputs, random_weights, Rng};

fn round_trips(g: &Graph, what: &str) {
    let text = g.print();
    let back = parse(&text).unwrap_or_else(|e| panic!("{what}: {e}\n{text}"));
    assert_eq!(back.print(), text, "{what}: reprinted text differs");
    assert_eq!(fingerprint(&back), fingerprint(g), "{what}: parsed graph differs");
}

#[test]
fn builder_graphs_round_trip() {
    round_trips(&build_bert(&BertConfig::tiny(), "", BertOutputs::default()).unwrap(), "tiny BERT");
    let minilm = BertConfig::minilm_l6();
    let g = build_bert(&minilm, "", BertOutputs::default()).unwrap();
    round_trips(&g, "MiniLM");
    // After the passes (bucket-specialized, folded, laid out): what the later stages see.
    round_trips(&run_pipeline(&g, Bucket::new(2, 16)).unwrap().graph, "MiniLM after the passes");
}

#[test]
fn random_graphs_round_trip() {
    for seed in 0..200 {
        let case = random_case(seed);
        round_trips(&case.graph, &format!("random graph {seed}"));
        round_trips(&run_pipeline(&case.graph, case.bucket).unwrap().graph, &format!("random graph {seed}, lowered"));
    }
}

#[test]
fn bad_text_names_its_line() {
    let good = "input 0 \"x\": f32 [batch,4] (Other)\n%0 = input#0() : f32 [batch,4]\n%1 = tanh(%0) : f32 [batch,4]\noutput \"y\" = %1\n";
    parse(good).unwrap();
    let cases = [
        ("%1 = tanh(%0) : f32 [batch,4]", "%1 = frobnicate(%0) : f32 [batch,4]", "unknown op `frobnicate`"),
        ("%1 = tanh(%0) : f32 [batch,4]", "%1 = tanh(%0) : f32 [batch,5]", "differs from the inferred"),
        ("%1 = tanh(%0) : f32 [batch,4]", "%1 = tanh(%7) : f32 [batch,4]", "not a value defined above"),
        ("%1 = tanh(%0) : f32 [batch,4]", "%2 = tanh(%0) : f32 [batch,4]", "expected index 1"),
        ("%1 = tanh(%0) : f32 [batch,4]", "%1 = tanh(%0) : f33 [batch,4]", "unknown dtype"),
        ("input 0 \"x\"", "input 0 \"x", "unterminated"),
        ("output \"y\" = %1", "output \"y\" = %9", "not a value defined above"),
    ];
    for (from, to, want) in cases {
        let text = good.replace(from, to);
        let e = parse(&text).unwrap_err();
        let Error::Graph { node, message } = &e else { panic!("{to}: expected a graph error, got {e:?}") };
        assert!(node.starts_with("line "), "{to}: {e}");
        assert!(message.contains(want), "{to}: {e}");
        assert!(!e.to_string().contains('\n'), "{e}");
    }
}

/// One filetest: `; RUN: <stage> <bucket>`, the graph, `; CHECK...` lines.
fn run_filetest(path: &std::path::Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let run = text
        .lines()
        .find_map(|l| l.trim_start_matches(';').trim().strip_prefix("RUN: "))
        .ok_or("no `; RUN: <stage> <bucket>` line")?;
    let (stage, bucket) = run.split_once(' ').ok_or("RUN needs a stage and a bucket")?;
    if !STAGES.contains(&stage) {
        return Err(format!("unknown stage `{stage}` (stages: {})", STAGES.join(", ")));
    }
    let bucket = Bucket::parse(bucket).map_err(|e| e.to_string())?;
    let g = parse(&text).map_err(|e| e.to_string())?;
    let out = dump_after(&g, bucket, stage).map_err(|e| e.to_string())?;
    filecheck::check(&out, &filecheck::directives(&text)).map_err(|e| format!("{e}\n--- output after {stage}:\n{out}"))?;
    // The graph must also compute the right thing: the CPU plan against the reference.
    let mut rng = Rng::new(7);
    let (w, inputs) = (random_weights(&g, &mut rng), random_inputs(&g, bucket, &mut rng));
    let want = interpret(&g, &w, &inputs, bucket).map_err(|e| format!("reference: {e}"))?;
    let be = CpuBackend::single_threaded().map_err(|e| e.to_string())?;
    let weights = be.upload(&w, &g).map_err(|e| e.to_string())?;
    let mut plan = be.lower(&weights, &g, bucket).map_err(|e| e.to_string())?;
    let mut got = Outputs::for_bucket(&g, bucket);
    be.run(&mut plan, &Batch { tensors: inputs }, &mut got).map_err(|e| e.to_string())?;
    compare(&got.tensors, &want, 1e-4, 1e-4).map_err(|e| format!("cpu vs reference: {e}"))
}

#[test]
fn filetests() {
    let dir = workspace_root().join("tests/golden/filecheck");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "kir"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "expected the filetests in {}", dir.display());
    let failures: Vec<String> = files
        .iter()
        .filter_map(|f| run_filetest(f).err().map(|e| format!("{}: {e}", f.file_name().unwrap().to_string_lossy())))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
