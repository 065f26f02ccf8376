//! `kiln serve` over real HTTP (reqwest): both routes equal `kiln embed` under 64 concurrent
//! clients, each bucket lowered once, every error case with its status and a JSON message (and
//! the server serving afterwards), cold start from an artifact with no lowering, graceful
//! shutdown answering what is in flight.
//!
//! Needs the MiniLM model (`kiln fetch-model minilm`); without it the tests fail under CI and are
//! skipped with a printed reason elsewhere.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::model_dir;
use kiln::embedder::open::{open, Ladder, ModelSource, OpenOptions, Runner};
use kiln::BackendKind;
use kiln::model::{embed_ids, SentenceModel};
use kiln::serve::{start, Running, ServeOptions};
use kiln_compiler::backends::cpu::{CpuBackend, CpuOptions};
use kiln_compiler::models::bert::BertOutputs;
use kiln_runtime::cpu::Threads;
use kiln_runtime::{Bucket, Engine, LowerPolicy};
use serde_json::{json, Value};

const WORDS: &[&str] = &[
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "researchers", "measure", "latency",
    "of", "compiled", "kernels", "on", "small", "machines", "and", "servers", "answer", "requests", "from", "many",
    "clients", "embedding", "sentences", "into", "vectors", "for", "search", "ranking", "cluster", "analysis",
];

/// A deterministic sentence of `n` words, different for every `seed`.
fn sentence(seed: usize, n: usize) -> String {
    let mut s: Vec<&str> = (0..n).map(|i| WORDS[(seed * 7 + i * 13 + i * i * seed) % WORDS.len()]).collect();
    s.push(["tokens", "text", "words"][seed % 3]);
    format!("{} {seed}.", s.join(" "))
}

struct Server {
    url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    running: Option<Running>,
    http: reqwest::Client,
}

impl Server {
    async fn start(runner: Runner, ladder: Ladder, opts: ServeOptions) -> Server {
        let dir = model_dir().expect("model present");
        let open_opts = OpenOptions { source: ModelSource::Folder(dir), runner, ladder, max_tokens: None, threads: Threads::Count(2) };
        let (e, tok) = tokio::task::spawn_blocking(move || open(open_opts)).await.unwrap().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let opts = ServeOptions { addr: "127.0.0.1:0".parse().unwrap(), ..opts };
        let running = start(e, tok, opts, async move {
            let _ = rx.await;
        })
        .await
        .unwrap();
        Server { url: format!("http://{}", running.addr), stop: Some(tx), running: Some(running), http: reqwest::Client::new() }
    }

    async fn post(&self, route: &str, body: impl Into<reqwest::Body>) -> (u16, reqwest::header::HeaderMap, Value) {
        let r = self.http.post(format!("{}{route}", self.url)).body(body).send().await.unwrap();
        let (status, headers) = (r.status().as_u16(), r.headers().clone());
        let text = r.text().await.unwrap();
        let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{route}: status {status}: not JSON ({e}): {text}"));
        (status, headers, v)
    }

    async fn get(&self, route: &str) -> String {
        self.http.get(format!("{}{route}", self.url)).send().await.unwrap().text().await.unwrap()
    }

    /// A metric's value (a line `name value` of /metrics).
    async fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").await;
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')).map(|v| v.trim().parse::<f64>().unwrap()))
            .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.running.take().unwrap().finished().await.unwrap();
    }
}

/// What `kiln embed TEXT` prints for each text alone (same model, CPU backend, its own bucket).
struct Reference {
    model: SentenceModel,
    engine: Engine<CpuBackend>,
}

impl Reference {
    fn new() -> Reference {
        let model = SentenceModel::open(&model_dir().unwrap(), BertOutputs::default()).unwrap();
        let weights = model.load_weights().unwrap();
        let be = CpuBackend::with_options(CpuOptions { threads: Threads::Count(2), ..Default::default() }).unwrap();
        let buckets: Vec<Bucket> = (1..=16).map(|k| Bucket::new(1, 16 * k)).collect();
        let engine = Engine::new(be, model.graph.clone(), &weights, &buckets, LowerPolicy::OnFirstRequest).unwrap();
        Reference { model, engine }
    }
    fn embed(&self, text: &str) -> Vec<f32> {
        let ids = self.model.tokenize(&[text]).unwrap();
        embed_ids(&self.engine, &ids).unwrap().remove(0)
    }
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn from_base64(s: &str) -> Vec<f32> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD.decode(s).unwrap();
    bytes.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_routes_equal_kiln_embed_under_64_concurrent_clients() {
    if model_dir().is_none() {
        return;
    }
    let s = Arc::new(Server::start(Runner::Jit(BackendKind::Cpu), Ladder::default(), ServeOptions::default()).await);
    // 64 clients, each with its own texts (2 to 80 words), interleaving both routes and formats.
    let mut tasks = Vec::new();
    for c in 0..64usize {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut got: Vec<(String, Vec<f32>)> = Vec::new();
            for r in 0..2usize {
                let seed = c * 10 + r;
                let texts: Vec<String> = (0..1 + (seed % 3)).map(|k| sentence(seed * 3 + k, 2 + (seed * 17 + k * 29) % 79)).collect();
                let vecs: Vec<Vec<f32>> = match (c + r) % 3 {
                    0 => {
                        let (st, _, v) = s.post("/embed", json!({ "inputs": texts }).to_string()).await;
                        assert_eq!(st, 200, "{v}");
                        v.as_array().unwrap().iter().map(floats).collect()
                    }
                    1 => {
                        let (st, _, v) = s.post("/v1/embeddings", json!({ "input": texts, "model": "minilm" }).to_string()).await;
                        assert_eq!(st, 200, "{v}");
                        assert_eq!(v["object"], "list");
                        assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() >= texts.len() as u64 * 3);
                        v["data"].as_array().unwrap().iter().enumerate().map(|(i, d)| {
                            assert_eq!(d["index"], i);
                            floats(&d["embedding"])
                        }).collect()
                    }
                    _ => {
                        let body = json!({ "input": texts, "encoding_format": "base64" }).to_string();
                        let (st, _, v) = s.post("/v1/embeddings", body).await;
                        assert_eq!(st, 200, "{v}");
                        v["data"].as_array().unwrap().iter().map(|d| from_base64(d["embedding"].as_str().unwrap())).collect()
                    }
                };
                assert_eq!(vecs.len(), texts.len());
                got.extend(texts.into_iter().zip(vecs));
            }
            got
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let reference = tokio::task::spawn_blocking(move || {
        let r = Reference::new();
        all.iter().map(|(t, v)| (t.clone(), max_abs(v, &r.embed(t)))).collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let worst = reference.iter().map(|x| x.1).fold(0.0, f32::max);
    println!("{} texts from 64 clients: max abs vs kiln embed {worst:.2e}", reference.len());
    for (t, e) in &reference {
        assert!(*e <= 1e-6, "{t:?}: max abs {e:e} vs kiln embed");
    }
    // Each bucket used was lowered exactly once; texts shared batches.
    let info: Value = serde_json::from_str(&s.get("/info").await).unwrap();
    let compiled = info["buckets"]["compiled"].as_array().unwrap().len() as f64;
    assert_eq!(s.metric("kiln_lowerings_total").await, compiled);
    let batches = s.metric("kiln_batch_rows_count").await;
    assert!(batches < reference.len() as f64, "{batches} batches for {} texts: nothing was batched", reference.len());
    let (real, computed) = (s.metric("kiln_tokens_real_total").await, s.metric("kiln_tokens_computed_total").await);
    println!("batches {batches}, buckets compiled {compiled}, real/computed tokens {:.3}", real / computed);
    assert_eq!(s.metric("kiln_in_flight_texts").await, 0.0);
    Arc::into_inner(s).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_has_its_status_and_a_json_message_and_the_server_goes_on() {
    if model_dir().is_none() {
        return;
    }
    let opts = ServeOptions { max_inputs: 8, max_queue: 8, ..ServeOptions::default() };
    let s = Server::start(Runner::Jit(BackendKind::Cpu), Ladder::default(), opts).await;
    let long = sentence(1, 300);
    let nine: Vec<String> = (0..9).map(|i| sentence(i, 3)).collect();
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("/embed", "{\"inputs\": [\"a\",".into(), 422, "not valid JSON"),
        ("/embed", "[\"a\"]".into(), 422, "must be a JSON object"),
        ("/embed", json!({ "inputs": 5 }).to_string(), 422, "`inputs` must be a string"),
        ("/embed", json!({ "inputs": ["a", null] }).to_string(), 422, "`inputs[1]` must be a string"),
        ("/embed", json!({ "inputs": [] }).to_string(), 422, "empty array"),
        ("/embed", json!({ "text": "a" }).to_string(), 422, "missing field `inputs`"),
        ("/embed", json!({ "inputs": "a", "normalize": "yes" }).to_string(), 422, "`normalize` must be true or false"),
        ("/embed", json!({ "inputs": nine }).to_string(), 413, "9 inputs"),
        ("/embed", json!({ "inputs": [long.clone()] }).to_string(), 413, "more than the model's 256"),
        ("/v1/embeddings", json!({ "input": [long.clone()] }).to_string(), 413, "more than the model's 256"),
        ("/v1/embeddings", json!({ "input": "a", "encoding_format": "hex" }).to_string(), 422, "encoding_format"),
        ("/v1/embeddings", json!({ "input": "a", "dimensions": 128 }).to_string(), 422, "`dimensions` is 128"),
        ("/v1/embeddings", json!({ "input": [[1, 2]] }).to_string(), 422, "`input[0]` must be a string"),
        ("/nope", "{}".into(), 404, "no such route"),
        ("/embed", "x".repeat(3 << 20), 413, "length limit"),
    ];
    for (route, body, status, msg) in cases {
        let (st, _, v) = s.post(route, body).await;
        assert_eq!(st, status, "{route}: {v}");
        let m = v["error"].as_str().unwrap_or_else(|| panic!("no error message: {v}"));
        assert!(m.contains(msg), "{route}: {m:?} lacks {msg:?}");
        assert!(!m.contains('\n'), "one line: {m:?}");
    }
    // Truncation on request: the long text is cut to 256 tokens and embedded.
    let (st, _, v) = s.post("/embed", json!({ "inputs": long, "truncate": true }).to_string()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v[0].as_array().unwrap().len(), 384);
    // A large body (tokenized off the async workers), cut to the limit too.
    let huge = sentence(2, 30_000);
    let (st, _, v2) = s.post("/embed", json!({ "inputs": [huge, "short"], "truncate": true }).to_string()).await;
    assert_eq!(st, 200, "{v2}");
    assert_eq!(v2.as_array().unwrap().len(), 2);

    // Queue full: 8 long texts in a bucket never compiled keep the queue's 8 places while they
    // lower and run; a ninth text meanwhile gets 503 with Retry-After.
    let eight: Vec<String> = (0..8).map(|i| sentence(100 + i, 150)).collect();
    let body = json!({ "inputs": eight }).to_string();
    let (url, http) = (s.url.clone(), s.http.clone());
    let big = tokio::spawn(async move { http.post(format!("{url}/embed")).body(body).send().await.unwrap().status().as_u16() });
    let mut saw_full = false;
    for _ in 0..2000 {
        if s.metric("kiln_in_flight_texts").await == 8.0 {
            let (st, h, v) = s.post("/embed", json!({ "inputs": "one more" }).to_string()).await;
            assert_eq!(st, 503, "{v}");
            assert_eq!(h.get("retry-after").unwrap(), "1");
            assert!(v["error"].as_str().unwrap().contains("queue is full"), "{v}");
            saw_full = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(saw_full, "never saw the 8 texts in flight");
    assert_eq!(big.await.unwrap(), 200);
    // Still serving, and every refusal was counted by status.
    let (st, _, v) = s.post("/embed", json!({ "inputs": ["after the errors", "still here"] }).to_string()).await;
    assert_eq!(st, 200, "{v}");
    let metrics = s.get("/metrics").await;
    for needle in ["status=\"413\"", "status=\"422\"", "status=\"503\"", "status=\"404\""] {
        assert!(metrics.contains(needle), "no {needle} in /metrics");
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_start_from_an_artifact_lowers_nothing() {
    let Some(dir) = model_dir() else { return };
    let m = SentenceModel::open(&dir, BertOutputs::default()).unwrap();
    let buckets = [Bucket::new(1, 32), Bucket::new(4, 64)];
    let artifact = CpuBackend::new().unwrap().build_artifact(&m.graph, &buckets).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("minilm.kiln");
    std::fs::write(&path, artifact.to_bytes()).unwrap();
    let runner = Runner::Plan { path, trust: kiln_runtime::TrustPolicy::AnyIntact };
    let s = Server::start(runner, Ladder::default(), ServeOptions::default()).await;
    let texts = vec![sentence(7, 5), sentence(8, 30), sentence(9, 12)];
    let (st, _, v) = s.post("/embed", json!({ "inputs": texts }).to_string()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(s.metric("kiln_lowerings_total").await, 0.0);
    let info: Value = serde_json::from_str(&s.get("/info").await).unwrap();
    assert_eq!(info["buckets"]["compiled"], json!(["1x32", "4x64"]));
    assert_eq!(info["max_tokens"], 64);
    let got: Vec<Vec<f32>> = v.as_array().unwrap().iter().map(floats).collect();
    let r = tokio::task::spawn_blocking(Reference::new).await.unwrap();
    for (t, g) in texts.iter().zip(&got) {
        let e = max_abs(g, &r.embed(t));
        assert!(e <= 1e-6, "{t:?}: {e:e}");
    }
    // Longer than the artifact's longest bucket: refused, not compiled.
    let (st, _, v) = s.post("/embed", json!({ "inputs": sentence(1, 80) }).to_string()).await;
    assert_eq!(st, 413, "{v}");
    assert_eq!(s.metric("kiln_lowerings_total").await, 0.0);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_requests_in_flight() {
    if model_dir().is_none() {
        return;
    }
    let mut s = Server::start(Runner::Jit(BackendKind::Cpu), Ladder::default(), ServeOptions::default()).await;
    let texts: Vec<String> = (0..16).map(|i| sentence(200 + i, 100)).collect();
    let body = json!({ "inputs": texts }).to_string();
    let (url, http) = (s.url.clone(), s.http.clone());
    let req = tokio::spawn(async move {
        let r = http.post(format!("{url}/embed")).body(body).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    });
    while s.metric("kiln_in_flight_texts").await < 16.0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let _ = s.stop.take().unwrap().send(());
    let (st, text) = req.await.unwrap();
    assert_eq!(st, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 16);
    let url = s.url.clone();
    s.running.take().unwrap().finished().await.unwrap();
    // Stopped: no new connection is accepted.
    assert!(reqwest::get(format!("{url}/health")).await.is_err());
}

/// The binary: `kiln serve --port 0` prints its address, serves, and on SIGTERM drains and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_serves_and_stops_on_sigterm() {
    use std::io::BufRead as _;
    let Some(dir) = model_dir() else { return };
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["serve", "--port", "0", "--threads", "2", "--model"])
        .arg(&dir)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut url = None;
    let mut log = String::new();
    for _ in 0..10 {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            break;
        }
        log.push_str(&line);
        if let Some(u) = line.trim().strip_prefix("listening on ") {
            url = Some(u.to_string());
            break;
        }
    }
    let url = url.unwrap_or_else(|| panic!("no address printed:\n{log}"));
    let r = reqwest::Client::new().post(format!("{url}/embed")).body(r#"{"inputs": "hello"}"#).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let status = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let code = tokio::task::spawn_blocking(move || child.wait().unwrap()).await.unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    assert!(code.success(), "exit {code:?}: {rest}");
    assert!(rest.contains("shutting down") && rest.contains("stopped"), "{rest}");
}

/// An explicit bucket list caps the text length at its longest bucket: a longer text is a 413
/// (or truncated on request), never an engine error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_buckets_cap_the_text_length() {
    if model_dir().is_none() {
        return;
    }
    let ladder = Ladder { explicit: vec![Bucket::new(4, 32)], ..Ladder::default() };
    let s = Server::start(Runner::Jit(BackendKind::Cpu), ladder, ServeOptions::default()).await;
    let long = sentence(3, 60);
    let (st, _, v) = s.post("/embed", json!({ "inputs": long }).to_string()).await;
    assert_eq!(st, 413, "{v}");
    assert!(v["error"].as_str().unwrap().contains("more than the model's 32"), "{v}");
    let (st, _, v) = s.post("/embed", json!({ "inputs": [long, "short"], "truncate": true }).to_string()).await;
    assert_eq!(st, 200, "{v}");
    s.stop().await;
}
