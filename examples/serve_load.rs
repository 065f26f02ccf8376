//! Load test of `kiln serve` with a real HTTP client (reqwest, keep-alive connections).
//!
//! Starts `kiln serve --port 0` (the release binary), warms it up (every bucket the load needs
//! is lowered then), and for each concurrency level runs closed-loop clients for a fixed time,
//! each posting one sentence per request to `/embed`. Sentences have realistic, varied lengths
//! (5 to 120 tokens, most of them short). Prints per level: throughput (sentences/s, tokens/s),
//! p50/p95/p99 latency, the share of computed tokens that were real (metrics), batches and rows
//! per batch; then stops the server and times, with `kiln bench` on the quiet machine, every
//! bucket the load used, so that the server's throughput can be set against the engine's own:
//! `vs bench` = Σ batches_b × median_b / wall time (1.0 = the server adds nothing).
//!
//! ```sh
//! cargo build --release && cargo run --release --example serve_load -- --levels 1,4,16,64 --seconds 10
//! ```
//! Other flags: `--kiln PATH` (default target/release/kiln), `--seed N`, and everything after
//! `--` goes to `kiln serve` (e.g. `-- --max-wait-ms 5`).

use std::collections::BTreeMap;
use std::io::BufRead as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WORDS: &str = "the of and to in is was for on that with as by at from his her an which this be are or had \
    have not but were they their one all there been has its more when who would will about into other them these \
    time people year new state first world after city company government during system school between number \
    university history music family group national public development house information research program report \
    service community language energy economic political international country children education students science \
    technology market water health relationship transformer embedding compiler inference latency throughput kernel \
    memory processor sentence similarity retrieval evaluation benchmark performance network architecture";

/// A small deterministic generator (xorshift64*): the same sentences on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Sentences whose lengths follow a skewed distribution: 60% short (5–30 tokens), 30% medium
/// (30–70), 10% long (70–120); about 1.2 tokens per word, plus [CLS] and [SEP].
fn sentences(n: usize, seed: u64) -> Vec<String> {
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let mut r = Rng(seed.max(1));
    (0..n)
        .map(|i| {
            let tokens = match r.below(10) {
                0..=5 => 5 + r.below(26),
                6..=8 => 30 + r.below(41),
                _ => 70 + r.below(51),
            };
            let nw = ((tokens.saturating_sub(3)) as f64 / 1.2).max(2.0) as usize;
            let mut s: Vec<String> = (0..nw).map(|_| words[r.below(words.len() as u64) as usize].to_string()).collect();
            s[0] = format!("{}{}", s[0][..1].to_uppercase(), &s[0][1..]);
            format!("{} {i}.", s.join(" "))
        })
        .collect()
}

struct Args {
    kiln: String,
    levels: Vec<usize>,
    seconds: f64,
    seed: u64,
    serve_args: Vec<String>,
}

fn args() -> Args {
    let mut a = Args { kiln: "target/release/kiln".into(), levels: vec![1, 4, 16, 64], seconds: 10.0, seed: 42, serve_args: Vec::new() };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        match x.as_str() {
            "--kiln" => a.kiln = it.next().expect("--kiln PATH"),
            "--levels" => a.levels = it.next().expect("--levels 1,4,16").split(',').map(|s| s.parse().expect("a number")).collect(),
            "--seconds" => a.seconds = it.next().expect("--seconds N").parse().expect("a number"),
            "--seed" => a.seed = it.next().expect("--seed N").parse().expect("a number"),
            "--" => a.serve_args = it.by_ref().collect(),
            o => panic!("unknown flag {o} (see the comment at the top of examples/serve_load.rs)"),
        }
    }
    a
}

/// Prometheus text → (name with labels → value).
fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn delta(a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>, k: &str) -> f64 {
    b.get(k).copied().unwrap_or(0.0) - a.get(k).copied().unwrap_or(0.0)
}

/// Batches per bucket between two scrapes.
fn bucket_counts(a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    b.keys()
        .filter_map(|k| k.strip_prefix("kiln_bucket_run_seconds_count{bucket=\"").and_then(|r| r.strip_suffix("\"}")).map(|bk| (bk.to_string(), k)))
        .map(|(bk, k)| (bk, delta(a, b, k)))
        .filter(|(_, n)| *n > 0.0)
        .collect()
}

struct Level {
    clients: usize,
    wall: f64,
    requests: usize,
    lat_ms: Vec<f64>,
    real: f64,
    computed: f64,
    batches: f64,
    rows: f64,
    run_s: f64,
    per_bucket: BTreeMap<String, f64>,
    /// Engine seconds per bucket.
    run_by_bucket: BTreeMap<String, f64>,
    /// CPU seconds this client process used.
    client_cpu: f64,
}

/// CPU seconds (user + system) this process has used, from /proc/self/stat.
fn own_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |x| x.1).split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 of the stat line (utime, stime) are 11 and 12 after the `)`; 100 Hz.
    (ticks(11) + ticks(12)) / 100.0
}

async fn scrape(http: &reqwest::Client, url: &str) -> BTreeMap<String, f64> {
    parse_metrics(&http.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap())
}

/// Closed-loop clients for `secs`: each sends its next sentence as soon as the last is answered.
async fn run_level(http: &reqwest::Client, url: &str, texts: Arc<Vec<String>>, clients: usize, secs: f64) -> (f64, Vec<f64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (http, url, texts, stop) = (http.clone(), url.to_string(), texts.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = c * 7919;
            while !stop.load(Ordering::Relaxed) {
                let body = format!("{{\"inputs\": {}}}", serde_json::Value::String(texts[i % texts.len()].clone()));
                let t = Instant::now();
                let r = http.post(format!("{url}/embed")).header("content-type", "application/json").body(body).send().await.unwrap();
                let ok = r.status().is_success();
                let _ = r.bytes().await.unwrap();
                assert!(ok, "a request failed");
                lat.push(t.elapsed().as_secs_f64() * 1e3);
                i += clients;
            }
            lat
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    (start.elapsed().as_secs_f64(), lat)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let a = args();
    let mut child = Command::new(&a.kiln)
        .args(["serve", "--port", "0"])
        .args(&a.serve_args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e} (cargo build --release first)", a.kiln));
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut url = None;
    for _ in 0..20 {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            break;
        }
        eprint!("{line}");
        if let Some(u) = line.trim().strip_prefix("listening on ") {
            url = Some(u.to_string());
            break;
        }
    }
    let url = url.expect("the server printed no address");
    // Keep draining the server's stderr so it never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    // One thread for the client: it shares the machine with the server.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let texts = Arc::new(sentences(4096, a.seed));
    let levels = rt.block_on(async {
        let http = reqwest::Client::builder().pool_max_idle_per_host(256).build().unwrap();
        let max = *a.levels.iter().max().unwrap_or(&1);
        eprintln!("warm-up: {max} clients for {:.0} s (buckets are lowered at their first request)", a.seconds.min(5.0));
        run_level(&http, &url, texts.clone(), max, a.seconds.min(5.0)).await;
        let mut out = Vec::new();
        for &c in &a.levels {
            let m0 = scrape(&http, &url).await;
            let cpu0 = own_cpu_seconds();
            let (wall, mut lat) = run_level(&http, &url, texts.clone(), c, a.seconds).await;
            let client_cpu = own_cpu_seconds() - cpu0;
            let m1 = scrape(&http, &url).await;
            lat.sort_by(f64::total_cmp);
            let lv = Level {
                clients: c,
                wall,
                requests: lat.len(),
                lat_ms: lat,
                real: delta(&m0, &m1, "kiln_tokens_real_total"),
                computed: delta(&m0, &m1, "kiln_tokens_computed_total"),
                batches: delta(&m0, &m1, "kiln_batch_rows_count"),
                rows: delta(&m0, &m1, "kiln_batch_rows_sum"),
                run_s: bucket_counts(&m0, &m1).keys().map(|b| delta(&m0, &m1, &format!("kiln_bucket_run_seconds_sum{{bucket=\"{b}\"}}"))).sum(),
                per_bucket: bucket_counts(&m0, &m1),
                run_by_bucket: bucket_counts(&m0, &m1)
                    .keys()
                    .map(|b| (b.clone(), delta(&m0, &m1, &format!("kiln_bucket_run_seconds_sum{{bucket=\"{b}\"}}"))))
                    .collect(),
                client_cpu,
            };
            eprintln!("{c} clients: {} requests in {wall:.1} s", lv.requests);
            out.push(lv);
        }
        let m = scrape(&http, &url).await;
        eprintln!("lowerings: {}", m.get("kiln_lowerings_total").copied().unwrap_or(0.0));
        out
    });
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let _ = child.wait();

    // The engine alone, on the now quiet machine: every bucket the levels used.
    let mut used: Vec<String> = levels.iter().flat_map(|l| l.per_bucket.keys().cloned()).collect();
    used.sort();
    used.dedup();
    let mut bench_args = vec!["bench".to_string(), "--runs".into(), "10".into(), "--bucket".into(), used.join(",")];
    if let Some(i) = a.serve_args.iter().position(|x| x == "--model") {
        bench_args.extend(["--model".into(), a.serve_args[i + 1].clone()]);
    }
    if let Some(i) = a.serve_args.iter().position(|x| x == "--threads") {
        bench_args.extend(["--threads".into(), a.serve_args[i + 1].clone()]);
    }
    eprintln!("timing {} buckets with kiln bench", used.len());
    let out = Command::new(&a.kiln).args(&bench_args).output().expect("kiln bench runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let median: BTreeMap<String, f64> = text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("bucket ")?;
            let (b, r) = rest.split_once(": median ")?;
            Some((b.to_string(), r.split_whitespace().next()?.parse::<f64>().ok()? / 1e3))
        })
        .collect();

    println!("| clients | requests | sentences/s | tokens/s | p50 ms | p95 ms | p99 ms | real/computed tokens | batches | rows/batch | engine busy | vs kiln bench | client CPU |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for l in &levels {
        let bench_s: f64 = l.per_bucket.iter().map(|(b, n)| n * median.get(b).copied().unwrap_or(f64::NAN)).sum();
        println!(
            "| {} | {} | {:.1} | {:.0} | {:.1} | {:.1} | {:.1} | {:.3} | {:.0} | {:.1} | {:.2} | {:.2} | {:.0}% |",
            l.clients,
            l.requests,
            l.requests as f64 / l.wall,
            l.real / l.wall,
            pct(&l.lat_ms, 0.50),
            pct(&l.lat_ms, 0.95),
            pct(&l.lat_ms, 0.99),
            l.real / l.computed.max(1.0),
            l.batches,
            l.rows / l.batches.max(1.0),
            l.run_s / l.wall,
            bench_s / l.wall,
            100.0 * l.client_cpu / l.wall,
        );
    }
    // Where the engine's time in the server differs from its time alone.
    if let Some(l) = levels.last() {
        println!();
        println!("{} clients, by bucket: | bucket | batches | server run ms (mean) | kiln bench median ms |", l.clients);
        for (b, n) in &l.per_bucket {
            let run = l.run_by_bucket.get(b).copied().unwrap_or(0.0) / n * 1e3;
            println!("| {b} | {n:.0} | {run:.2} | {:.2} |", median.get(b).copied().unwrap_or(f64::NAN) * 1e3);
        }
    }
}
