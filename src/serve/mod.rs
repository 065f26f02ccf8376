//! `kiln serve`: an embedding server on tokio + axum.
//!
//! Routes: `POST /embed` (text-embeddings-inference's shape), `POST /v1/embeddings` (OpenAI's),
//! `GET /health`, `GET /info`, `GET /metrics` (Prometheus text). Handlers tokenize, check limits
//! and admit a request's texts to the [`batcher`], which batches texts of all requests by length
//! into the engine's buckets ([`cut`]); each bucket is lowered at its first request, once, or
//! mapped from an artifact at start-up.
//!
//! Unlike text-embeddings-inference (a router process in front of a model server over gRPC),
//! the router, batcher and engine share one process and one queue: on a CPU the engine is the
//! only thing worth a core, and a text crosses no process boundary.

pub mod api;
pub mod batcher;
pub mod cut;
pub mod metrics;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use kiln_runtime::{Error, Result};
use tokio::sync::mpsc;

use self::api::{ApiError, Encoding};
use self::batcher::{BatchConfig, Item, Pending};
use self::metrics::Metrics;
use crate::embedder::{finish, SharedEmbedder, TextTokenizer, TokenizeError};

/// Limits and batching of one server.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub addr: SocketAddr,
    /// Texts one request may carry (more → 413).
    pub max_inputs: usize,
    /// Texts admitted and not yet answered, over all requests (more → 503 with Retry-After).
    pub max_queue: usize,
    pub batch: BatchConfig,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions { addr: SocketAddr::from(([127, 0, 0, 1], 8080)), max_inputs: 64, max_queue: 2048, batch: BatchConfig::default() }
    }
}

struct App {
    embedder: SharedEmbedder,
    tokenizer: TextTokenizer,
    metrics: Arc<Metrics>,
    queue: mpsc::UnboundedSender<Item>,
    in_flight: AtomicUsize,
    opts: ServeOptions,
}

/// A started server.
pub struct Running {
    /// The address it listens on (the real port when 0 was asked for).
    pub addr: SocketAddr,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    batcher: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Waits until the shutdown signal has come and every request in flight is answered.
    pub async fn finished(self) -> Result<()> {
        let served = self.server.await.map_err(|e| Error::Backend(format!("the server task failed: {e}")))?;
        served.map_err(|e| Error::Backend(format!("the server failed: {e}")))?;
        // The router (and with it the queue's sender) is gone: the batcher drains and ends.
        self.batcher.await.map_err(|e| Error::Backend(format!("the batcher failed: {e}")))
    }
}

/// Binds `opts.addr` and serves until `shutdown` completes; then stops accepting connections and
/// answers what is in flight (graceful shutdown).
pub async fn start(
    embedder: SharedEmbedder,
    tokenizer: TextTokenizer,
    opts: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<Running> {
    let metrics = Arc::new(Metrics::new());
    let (queue, batcher) = batcher::spawn(embedder.clone(), metrics.clone(), opts.batch);
    let listener = tokio::net::TcpListener::bind(opts.addr).await.map_err(|e| Error::Environment(format!("cannot listen on {}: {e}", opts.addr)))?;
    let addr = listener.local_addr().map_err(|e| Error::Environment(format!("no local address: {e}")))?;
    let app = Arc::new(App { embedder, tokenizer, metrics, queue, in_flight: AtomicUsize::new(0), opts });
    let router = router(app);
    let server = tokio::spawn(async move { axum::serve(listener, router).with_graceful_shutdown(shutdown).await });
    Ok(Running { addr, server, batcher })
}

fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/embed", post(embed))
        .route("/v1/embeddings", post(openai))
        .route("/health", get(health))
        .route("/info", get(info))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(app.clone(), track))
        .with_state(app)
}

/// Counts every request by route and status and times it.
async fn track(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map_or("unmatched", |m| m.as_str()).to_string();
    let t = Instant::now();
    let resp = next.run(req).await;
    app.metrics.requests.with_label_values(&[route.as_str(), resp.status().as_str()]).inc();
    app.metrics.request_seconds.with_label_values(&[route.as_str()]).observe(t.elapsed().as_secs_f64());
    resp
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route (routes: POST /embed, POST /v1/embeddings, GET /health, GET /info, GET /metrics)")
}

async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

async fn info(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    let e = &app.embedder;
    let i = e.info();
    let names = |v: &[kiln_runtime::Bucket]| v.iter().map(|b| b.to_string()).collect::<Vec<_>>();
    Json(serde_json::json!({
        "model": i.name,
        "dims": i.dims,
        "max_tokens": i.max_tokens,
        "max_inputs": app.opts.max_inputs,
        "backend": i.backend,
        "buckets": { "compiled": names(&e.compiled_buckets()), "available": names(e.buckets()) },
        "lowerings": e.lowerings(),
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

async fn metrics_text(State(app): State<Arc<App>>) -> impl IntoResponse {
    let text = app.metrics.render(app.embedder.lowerings(), app.embedder.compiled_buckets().len());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

/// Request bodies larger than this are refused with 413 (axum's default limit, kept).
const BODY_LIMIT: usize = 2 << 20;
/// An oversized body is still read, and dropped, up to this many bytes before the 413 goes out.
const BODY_DRAIN: usize = 4 * BODY_LIMIT;

/// The request body, at most [`BODY_LIMIT`] bytes, or a JSON error. An oversized body is read to
/// its end (up to [`BODY_DRAIN`]) before the refusal: answering while the client is still
/// sending makes hyper close the connection under it, and the client may then lose the 413 to
/// the reset (`tests/serve.rs` saw that as an occasional `IncompleteMessage`). Past
/// `BODY_DRAIN` the refusal goes out at once. (axum's `Bytes` extractor refuses early, hence this
/// reader; hyper has no lingering close of its own.)
async fn read_body(mut b: Body) -> std::result::Result<Bytes, ApiError> {
    let mut buf = Vec::new();
    let mut seen = 0usize;
    while let Some(frame) = std::future::poll_fn(|cx| std::pin::Pin::new(&mut b).poll_frame(cx)).await {
        let frame = frame.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "request", format!("Failed to read the request body: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        seen += data.len();
        if seen <= BODY_LIMIT {
            buf.extend_from_slice(&data);
        } else if seen > BODY_DRAIN {
            break;
        }
    }
    if seen > BODY_LIMIT {
        return Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "validation", "Failed to buffer the request body: length limit exceeded"));
    }
    Ok(Bytes::from(buf))
}

/// `POST /embed`: `{"inputs": "text" | [...], "normalize": true, "truncate": false}` →
/// `[[f32, ...], ...]`.
async fn embed(State(app): State<Arc<App>>, b: Body) -> std::result::Result<Response, ApiError> {
    let obj = api::object(&read_body(b).await?)?;
    let texts = api::texts(&obj, "inputs")?;
    let normalize = api::flag(&obj, "normalize", true)?;
    let truncate = api::flag(&obj, "truncate", false)?;
    let (vecs, _) = run(&app, texts, truncate, normalize).await?;
    Ok(Json(vecs).into_response())
}

/// `POST /v1/embeddings`: OpenAI's request and response shapes.
async fn openai(State(app): State<Arc<App>>, b: Body) -> std::result::Result<Response, ApiError> {
    let obj = api::object(&read_body(b).await?)?;
    let texts = api::texts(&obj, "input")?;
    let format = api::encoding(&obj)?;
    api::string(&obj, "model")?;
    let dims = app.embedder.info().dims;
    match obj.get("dimensions") {
        None | Some(serde_json::Value::Null) => {}
        Some(v) if v.as_u64() == Some(dims as u64) => {}
        Some(v) => return Err(ApiError::validation(format!("`dimensions` is {v}; this model's embeddings have {dims} (no shortening)"))),
    }
    // OpenAI truncates nothing: a text over the limit is an error.
    let (vecs, tokens) = run(&app, texts, false, true).await?;
    let data: Vec<serde_json::Value> = vecs
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let e = match format {
                Encoding::Float => serde_json::json!(v),
                Encoding::Base64 => serde_json::json!(api::base64_f32(v)),
            };
            serde_json::json!({ "object": "embedding", "index": i, "embedding": e })
        })
        .collect();
    Ok(Json(serde_json::json!({
        "object": "list",
        "data": data,
        "model": app.embedder.info().name,
        "usage": { "prompt_tokens": tokens, "total_tokens": tokens },
    }))
    .into_response())
}

/// Gives back a request's admission when it is answered or abandoned.
struct Admitted<'a> {
    app: &'a App,
    n: usize,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let now = self.app.in_flight.fetch_sub(self.n, Ordering::AcqRel) - self.n;
        self.app.metrics.in_flight.set(now as i64);
    }
}

/// Texts longer than this in all are tokenized on a blocking thread, so that a large body (up to
/// the 2 MB limit) never holds up an async worker; shorter ones inline (no hand-off).
const INLINE_TOKENIZE_BYTES: usize = 16 << 10;

/// The token ids of each text, or the error of the first that cannot be embedded.
fn tokenize(tok: &TextTokenizer, texts: &[String], truncate: bool) -> std::result::Result<Vec<Vec<i64>>, ApiError> {
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| match tok.encode(t, truncate) {
            Ok(ids) => Ok(ids),
            Err(TokenizeError::TooLong { tokens, max }) => Err(ApiError::too_large(format!(
                "input {i} has {tokens} tokens, more than the model's {max} (send \"truncate\": true to cut it)"
            ))),
            Err(TokenizeError::Empty) => Err(ApiError::validation(format!("input {i} has no tokens"))),
            Err(TokenizeError::Failed(m)) => Err(ApiError::validation(format!("input {i}: {m}"))),
        })
        .collect()
}

/// Tokenizes, admits and waits for the embeddings of `texts`; also returns their token count.
async fn run(app: &Arc<App>, texts: Vec<String>, truncate: bool, normalize: bool) -> std::result::Result<(Vec<Vec<f32>>, usize), ApiError> {
    let n = texts.len();
    if n > app.opts.max_inputs {
        return Err(ApiError::too_large(format!("{n} inputs; this server takes at most {} per request", app.opts.max_inputs)));
    }
    let seqs = if texts.iter().map(String::len).sum::<usize>() <= INLINE_TOKENIZE_BYTES {
        tokenize(&app.tokenizer, &texts, truncate)?
    } else {
        let a = app.clone();
        tokio::task::spawn_blocking(move || tokenize(&a.tokenizer, &texts, truncate))
            .await
            .map_err(|_| ApiError::backend("internal error: the tokenizer panicked (a kiln bug)"))??
    };
    let tokens = seqs.iter().map(Vec::len).sum();
    let before = app.in_flight.fetch_add(n, Ordering::AcqRel);
    let admitted = Admitted { app, n };
    if before + n > app.opts.max_queue {
        return Err(ApiError::overloaded(format!("the queue is full ({before} texts in flight, at most {}); retry later", app.opts.max_queue)));
    }
    app.metrics.in_flight.set((before + n) as i64);
    let (pending, rx) = Pending::new(n);
    for (slot, ids) in seqs.into_iter().enumerate() {
        // Counted before it is sent: the batcher may take it (and count it out) at once.
        app.metrics.queue_depth.inc();
        if app.queue.send(Item { ids, slot, req: pending.clone() }).is_err() {
            app.metrics.queue_depth.dec();
            return Err(ApiError::overloaded("the server is shutting down"));
        }
    }
    let answer = rx.await.map_err(|_| ApiError::backend("the batcher stopped before answering"))?;
    drop(admitted);
    let vecs = answer.map_err(ApiError::backend)?;
    let e = app.embedder.as_ref();
    Ok((vecs.into_iter().map(|v| finish(e, v, normalize)).collect(), tokens))
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("kiln serve: shutting down, answering the requests in flight");
}

/// `kiln serve`: serves `embedder` until Ctrl-C or SIGTERM, on a small tokio runtime (the engine
/// has its own threads; the async side only parses, tokenizes and routes).
pub fn serve_until_signal(embedder: SharedEmbedder, tokenizer: TextTokenizer, opts: ServeOptions) -> Result<()> {
    if opts.max_queue < opts.max_inputs {
        return Err(Error::bad_batch(format!(
            "--max-queue {} is below --max-inputs {}: a full request could never be admitted",
            opts.max_queue, opts.max_inputs
        )));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("kiln-serve")
        .enable_all()
        .build()
        .map_err(|e| Error::Environment(format!("cannot start the async runtime: {e}")))?;
    rt.block_on(async move {
        let i = embedder.info().clone();
        let (buckets, compiled) = (embedder.buckets().len(), embedder.compiled_buckets().len());
        let running = start(embedder, tokenizer, opts, shutdown_signal()).await?;
        eprintln!(
            "kiln serve: {} ({} dims, at most {} tokens per text) on {}; {buckets} buckets, {compiled} with a plan",
            i.name, i.dims, i.max_tokens, i.backend
        );
        eprintln!("listening on http://{}", running.addr);
        running.finished().await?;
        eprintln!("kiln serve: stopped");
        Ok(())
    })
}
