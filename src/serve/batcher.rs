//! The dynamic batcher. Handlers put each text of a request on one queue; a single batcher task
//! takes what is waiting when the engine is free (up to a token budget; when the engine was idle
//! it also waits up to `max_wait` for more), sorts it by length and cuts it ([`super::cut`]) into
//! batches that each run in the smallest bucket that fits.
//!
//! One batch runs at a time, on every engine thread: the CPU backend's kernels already split each
//! GEMM and attention over the thread pool, and a second concurrent run would only take its
//! threads (the pool runs a busy caller's work inline: oversubscription, not parallelism). A
//! bucket's first batch waits for its lowering *outside* the run slot, so compiling a new bucket
//! never stalls batches of buckets that already have plans; the engine lowers each bucket once
//! however many batches wait for it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kiln_runtime::Bucket;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use super::cut::cut;
use super::metrics::Metrics;
use crate::embedder::SharedEmbedder;

/// What a request gets back: one embedding per text, or why the engine could not run it.
pub type Answer = Result<Vec<Vec<f32>>, String>;

/// A request's texts in flight: results fill in as their batches finish.
pub struct Pending {
    results: Mutex<Vec<Option<Vec<f32>>>>,
    left: AtomicUsize,
    tx: Mutex<Option<oneshot::Sender<Answer>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The guarded data is a results vector and a sender: a panic elsewhere cannot leave them
    // half-written in a way that matters (a request answers at most once).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pending {
    pub fn new(n: usize) -> (Arc<Pending>, oneshot::Receiver<Answer>) {
        let (tx, rx) = oneshot::channel();
        (Arc::new(Pending { results: Mutex::new(vec![None; n]), left: AtomicUsize::new(n), tx: Mutex::new(Some(tx)) }), rx)
    }

    /// The client went away (or the request already failed): its texts need not run.
    fn abandoned(&self) -> bool {
        lock(&self.tx).as_ref().is_none_or(|t| t.is_closed())
    }

    fn fill(&self, slot: usize, v: Vec<f32>) {
        lock(&self.results)[slot] = Some(v);
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let all = std::mem::take(&mut *lock(&self.results));
            if let Some(tx) = lock(&self.tx).take() {
                let _ = tx.send(Ok(all.into_iter().map(|v| v.unwrap_or_default()).collect()));
            }
        }
    }

    fn fail(&self, message: &str) {
        if let Some(tx) = lock(&self.tx).take() {
            let _ = tx.send(Err(message.to_string()));
        }
    }
}

/// One text of a request.
pub struct Item {
    pub ids: Vec<i64>,
    pub slot: usize,
    pub req: Arc<Pending>,
}

#[derive(Debug, Clone, Copy)]
pub struct BatchConfig {
    /// Real tokens one gather takes at most (it may be cut into several batches).
    pub max_batch_tokens: usize,
    /// How long an idle engine waits for more texts after the first. Zero by default: under
    /// load texts pile up while the engine runs, so batches form anyway, and at idle a wait is
    /// pure latency (with one client, 2 ms on a ~6 ms request).
    pub max_wait: Duration,
    /// A batch's fixed cost in token-equivalents, for the cut. 8: MiniLM's 1x16 runs in the
    /// time of ~20 tokens of a large batch; 32 measured no better (examples/serve_load).
    pub per_batch_tokens: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig { max_batch_tokens: 8192, max_wait: Duration::ZERO, per_batch_tokens: 8 }
    }
}

struct Ctx {
    embedder: SharedEmbedder,
    metrics: Arc<Metrics>,
    cfg: BatchConfig,
    /// The run slot: one batch on the engine at a time.
    run: Arc<Semaphore>,
}

/// Starts the batcher; it ends when every sender of the queue is gone and the queue is empty.
pub fn spawn(embedder: SharedEmbedder, metrics: Arc<Metrics>, cfg: BatchConfig) -> (mpsc::UnboundedSender<Item>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let ctx = Arc::new(Ctx { embedder, metrics, cfg, run: Arc::new(Semaphore::new(1)) });
    (tx, tokio::spawn(batcher(rx, ctx)))
}

async fn batcher(mut rx: mpsc::UnboundedReceiver<Item>, ctx: Arc<Ctx>) {
    let mut carry: Option<Item> = None;
    loop {
        let first = match carry.take() {
            Some(i) => i,
            None => match rx.recv().await {
                Some(i) => i,
                None => break,
            },
        };
        // Waiting for the run slot lets the queue fill while the engine is busy.
        let (permit, idle) = match ctx.run.clone().try_acquire_owned() {
            Ok(p) => (p, true),
            Err(_) => match ctx.run.clone().acquire_owned().await {
                Ok(p) => (p, false),
                Err(_) => break,
            },
        };
        let budget = ctx.cfg.max_batch_tokens.max(1);
        let mut tokens = first.ids.len();
        let mut items = vec![first];
        let deadline = tokio::time::Instant::now() + ctx.cfg.max_wait;
        while tokens < budget {
            let next = match rx.try_recv() {
                Ok(i) => i,
                Err(mpsc::error::TryRecvError::Empty) if idle => match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(i)) => i,
                    _ => break,
                },
                Err(_) => break,
            };
            if tokens + next.ids.len() > budget {
                carry = Some(next);
                break;
            }
            tokens += next.ids.len();
            items.push(next);
        }
        ctx.metrics.queue_depth.sub(items.len() as i64);
        items.retain(|i| !i.req.abandoned());
        dispatch(&ctx, items, permit);
    }
}

/// Cuts `items` into batches; runs those whose bucket has a plan now (holding the run slot) and
/// sends the others to wait for their lowering.
fn dispatch(ctx: &Arc<Ctx>, mut items: Vec<Item>, permit: OwnedSemaphorePermit) {
    items.sort_by_key(|i| i.ids.len());
    let lens: Vec<usize> = items.iter().map(|i| i.ids.len()).collect();
    let Some(cuts) = cut(&lens, |r, t| ctx.embedder.pick_bucket(r, t), ctx.cfg.per_batch_tokens) else {
        // The handlers admit no text longer than the largest bucket: this is a kiln bug.
        for i in &items {
            i.req.fail("internal error: a text fits no bucket");
        }
        return;
    };
    let mut rest = items.into_iter();
    let mut ready = Vec::new();
    for c in cuts {
        let batch: Vec<Item> = rest.by_ref().take(c.end - c.start).collect();
        if ctx.embedder.is_compiled(c.bucket) {
            ready.push(batch);
        } else {
            tokio::spawn(lower_then_run(ctx.clone(), c.bucket, batch));
        }
    }
    if ready.is_empty() {
        return;
    }
    let ctx = ctx.clone();
    tokio::task::spawn_blocking(move || {
        for b in ready {
            run_batch(&ctx, b);
        }
        drop(permit);
    });
}

async fn lower_then_run(ctx: Arc<Ctx>, bucket: Bucket, batch: Vec<Item>) {
    let c = ctx.clone();
    let lowered = tokio::task::spawn_blocking(move || c.embedder.prepare(bucket)).await;
    let err = match lowered {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(format!("bucket {bucket}: {e}")),
        Err(_) => Some(format!("internal error: lowering bucket {bucket} panicked (a kiln bug)")),
    };
    if let Some(m) = err {
        for i in &batch {
            i.req.fail(&m);
        }
        return;
    }
    let Ok(permit) = ctx.run.clone().acquire_owned().await else { return };
    let _ = tokio::task::spawn_blocking(move || {
        run_batch(&ctx, batch);
        drop(permit);
    })
    .await;
}

/// Runs one batch on the engine (a blocking call) and hands each text its embedding.
fn run_batch(ctx: &Ctx, mut batch: Vec<Item>) {
    // A client may have gone while the batch waited.
    batch.retain(|i| !i.req.abandoned());
    if batch.is_empty() {
        return;
    }
    let seqs: Vec<Vec<i64>> = batch.iter_mut().map(|i| std::mem::take(&mut i.ids)).collect();
    let longest = seqs.iter().map(Vec::len).max().unwrap_or(0);
    let real: usize = seqs.iter().map(Vec::len).sum();
    let t = Instant::now();
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ctx.embedder.embed(&seqs)));
    let secs = t.elapsed().as_secs_f64();
    let m = &ctx.metrics;
    if let Some(b) = ctx.embedder.pick_bucket(seqs.len(), longest) {
        m.bucket_run_seconds.with_label_values(&[b.to_string().as_str()]).observe(secs);
        m.tokens_computed.inc_by((b.batch * b.seq) as u64);
    }
    m.batch_rows.observe(seqs.len() as f64);
    m.batch_tokens.observe(real as f64);
    m.tokens_real.inc_by(real as u64);
    match out {
        Ok(Ok(vecs)) if vecs.len() == batch.len() => {
            for (i, v) in batch.iter().zip(vecs) {
                i.req.fill(i.slot, v);
            }
        }
        Ok(Ok(vecs)) => fail_all(&batch, &format!("internal error: {} embeddings for {} texts", vecs.len(), batch.len())),
        Ok(Err(e)) => fail_all(&batch, &e.to_string()),
        Err(_) => fail_all(&batch, "internal error: the engine panicked (a kiln bug)"),
    }
}

fn fail_all(batch: &[Item], message: &str) {
    for i in batch {
        i.req.fail(message);
    }
}
