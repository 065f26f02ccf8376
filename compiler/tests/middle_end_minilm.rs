//! The middle-end on MiniLM-shaped graphs: fusion counts, memory-plan ratios, plan checks.

use kiln_compiler::models::bert::{build_bert, BertConfig, BertOutputs};
use kiln_compiler::pipeline::{compile_report, run_pipeline};
use kiln_runtime::Bucket;

#[test]
fn minilm_report_smoke() {
    let g = build_bert(&BertConfig::minilm_l6(), "", BertOutputs::default()).unwrap();
    for b in [Bucket::new(1, 128), Bucket::new(8, 128), Bucket::new(32, 128)] {
        let r = compile_report(&g, b).unwrap();
        println!("{r}\n");
    }
    let l = run_pipeline(&g, Bucket::new(1, 128)).unwrap();
    println!("{}", l.program.print());
    println!("{}", l.plan.print(&l.program));
}
