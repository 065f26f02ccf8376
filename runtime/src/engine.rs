//! `Engine<B>`: weights held once, a set of buckets, one plan per bucket compiled at its first
//! request (exactly once, even under concurrent requests) or supplied precompiled.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::backend::{Backend, Batch, Outputs};
use crate::dtype::HostTensor;
use crate::error::{Error, Result};
use crate::graph::{Bucket, Dim, Graph};

/// Whether the engine may compile a bucket that has no plan yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LowerPolicy {
    /// Lower a bucket at its first request: compile it (a compiling backend) or map it from
    /// an artifact (a precompiled one).
    OnFirstRequest,
    /// Only run plans given with [`Engine::insert_plan`]; a miss is an error.
    PrecompiledOnly,
}

/// One bucket's plan slot. Its mutex is held while lowering, so concurrent first requests wait
/// for the one lowering instead of starting their own.
struct Slot<P> {
    plan: Mutex<Option<P>>,
}

pub struct Engine<B: Backend> {
    backend: B,
    graph: Graph,
    weights: B::Weights,
    buckets: Vec<Bucket>,
    policy: LowerPolicy,
    slots: BTreeMap<Bucket, Slot<B::Plan>>,
    /// Buckets that have a plan, kept apart from the slots so that listing them never waits on
    /// a slot's lock.
    ready: Mutex<Vec<Bucket>>,
    lowerings: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in another thread while it held the lock leaves the plan in an unknown state only
    // if it panicked mid-run; plans are rebuilt on error, so recovering the guard is sound.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<B: Backend> Engine<B> {
    /// Uploads `tensors` (indexed like `graph.weights`) and prepares the buckets.
    pub fn new(backend: B, graph: Graph, tensors: &[HostTensor], buckets: &[Bucket], policy: LowerPolicy) -> Result<Self> {
        graph.check_structure()?;
        let weights = backend.upload(tensors, &graph)?;
        Self::with_weights(backend, graph, weights, buckets, policy)
    }

    /// Builds an engine from weights already uploaded.
    pub fn with_weights(
        backend: B,
        graph: Graph,
        weights: B::Weights,
        buckets: &[Bucket],
        policy: LowerPolicy,
    ) -> Result<Self> {
        if buckets.is_empty() {
            return Err(Error::bad_batch("an engine needs at least one bucket"));
        }
        let mut buckets = buckets.to_vec();
        // Smallest first: by padded token count, then by rows.
        buckets.sort_by_key(|b| (b.batch * b.seq, b.batch, b.seq));
        buckets.dedup();
        // Structure only: shapes and a bucket's sizes are the compiler's to check, when it lowers
        // (a precompiled backend's plans were checked when they were compiled).
        graph.check_structure()?;
        let slots = buckets.iter().map(|&b| (b, Slot { plan: Mutex::new(None) })).collect();
        Ok(Engine { backend, graph, weights, buckets, policy, slots, ready: Mutex::new(Vec::new()), lowerings: AtomicUsize::new(0) })
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }
    pub fn graph(&self) -> &Graph {
        &self.graph
    }
    pub fn weights(&self) -> &B::Weights {
        &self.weights
    }
    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }
    /// How many times `lower` has been called.
    pub fn lowerings(&self) -> usize {
        self.lowerings.load(Ordering::SeqCst)
    }

    /// Supplies a precompiled plan for one of the engine's buckets.
    pub fn insert_plan(&self, bucket: Bucket, plan: B::Plan) -> Result<()> {
        let slot = self.slots.get(&bucket).ok_or_else(|| {
            Error::bad_batch(format!("bucket {bucket} is not one of this engine's buckets"))
        })?;
        *lock(&slot.plan) = Some(plan);
        self.mark_ready(bucket);
        Ok(())
    }

    fn mark_ready(&self, bucket: Bucket) {
        let mut r = lock(&self.ready);
        if !r.contains(&bucket) {
            r.push(bucket);
            r.sort();
        }
    }

    /// Buckets that have a plan now.
    pub fn compiled_buckets(&self) -> Vec<Bucket> {
        lock(&self.ready).clone()
    }

    /// The smallest bucket that fits `rows` × `tokens`.
    pub fn pick_bucket(&self, rows: usize, tokens: usize) -> Result<Bucket> {
        self.buckets.iter().copied().find(|b| b.fits(rows, tokens)).ok_or_else(|| {
            let max_b = self.buckets.iter().map(|b| b.batch).max().unwrap_or(0);
            let max_s = self.buckets.iter().map(|b| b.seq).max().unwrap_or(0);
            Error::bad_batch(format!(
                "{rows} rows x {tokens} tokens fit no bucket (largest: {max_b} rows, {max_s} tokens; buckets: {})",
                self.buckets.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(", ")
            ))
        })
    }

    /// Makes sure `bucket` has a plan (lowering it now if allowed).
    pub fn prepare(&self, bucket: Bucket) -> Result<()> {
        let slot = self.slot(bucket)?;
        let mut guard = lock(&slot.plan);
        self.ensure_plan(bucket, &mut guard)
    }

    fn slot(&self, bucket: Bucket) -> Result<&Slot<B::Plan>> {
        self.slots.get(&bucket).ok_or_else(|| {
            Error::bad_batch(format!("bucket {bucket} is not one of this engine's buckets"))
        })
    }

    fn ensure_plan(&self, bucket: Bucket, guard: &mut Option<B::Plan>) -> Result<()> {
        if guard.is_some() {
            return Ok(());
        }
        if self.policy == LowerPolicy::PrecompiledOnly {
            return Err(Error::BucketNotCompiled { requested: bucket, available: self.compiled_buckets() });
        }
        self.lowerings.fetch_add(1, Ordering::SeqCst);
        *guard = Some(self.backend.lower(&self.weights, &self.graph, bucket)?);
        self.mark_ready(bucket);
        Ok(())
    }

    /// Runs a batch: checks it, picks the smallest bucket that fits, pads it, lowers the bucket
    /// if this is its first request, runs, and returns outputs trimmed to the batch's rows (and
    /// tokens, for outputs with a seq dim).
    pub fn infer(&self, batch: &Batch) -> Result<Outputs> {
        let (rows, tokens) = batch.check(&self.graph)?;
        let bucket = self.pick_bucket(rows, tokens)?;
        let padded = batch.pad_to(&self.graph, bucket)?;
        let mut out = Outputs::for_bucket(&self.graph, bucket);
        {
            let slot = self.slot(bucket)?;
            let mut guard = lock(&slot.plan);
            self.ensure_plan(bucket, &mut guard)?;
            let plan = guard.as_mut().expect("ensure_plan leaves a plan");
            self.backend.run(plan, &padded, &mut out)?;
        }
        let tensors = self
            .graph
            .outputs
            .iter()
            .zip(out.tensors)
            .map(|(&o, t)| trim(&t, &self.graph.node(o).shape, rows, tokens))
            .collect();
        Ok(Outputs { tensors })
    }
}

/// Cuts a bucket-sized output down to `rows` × `tokens` along its batch and seq dims.
fn trim(t: &HostTensor, dims: &[Dim], rows: usize, tokens: usize) -> HostTensor {
    let to: Vec<usize> = t
        .shape
        .iter()
        .zip(dims)
        .map(|(&n, d)| match d {
            Dim::Batch => rows,
            Dim::Seq => tokens,
            Dim::Fixed(_) => n,
        })
        .collect();
    t.resized(&to)
}

/// Engines are shared across threads behind an `Arc`.
pub type SharedEngine<B> = Arc<Engine<B>>;
