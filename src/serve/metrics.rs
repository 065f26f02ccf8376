//! `GET /metrics`: the server's counters in the Prometheus text format, kept by the Prometheus
//! project's Rust client (`prometheus`).

use prometheus::{Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

pub struct Metrics {
    registry: Registry,
    /// `kiln_requests_total{route, status}`.
    pub requests: IntCounterVec,
    /// `kiln_request_duration_seconds{route}`: from the request's arrival to its response.
    pub request_seconds: HistogramVec,
    /// `kiln_queue_depth`: texts admitted and waiting for a batch.
    pub queue_depth: IntGauge,
    /// `kiln_in_flight_texts`: texts admitted and not yet answered (the admission limit).
    pub in_flight: IntGauge,
    /// `kiln_batch_rows`: texts per batch run.
    pub batch_rows: Histogram,
    /// `kiln_batch_tokens`: real tokens per batch run.
    pub batch_tokens: Histogram,
    /// `kiln_tokens_real_total` and `kiln_tokens_computed_total` (bucket rows × seq): their ratio
    /// is the share of the engine's work that was not padding.
    pub tokens_real: IntCounter,
    pub tokens_computed: IntCounter,
    /// `kiln_padding_ratio`: 1 − real / computed tokens since start.
    pub padding_ratio: Gauge,
    /// `kiln_bucket_run_seconds{bucket}`: the engine's time per batch, by bucket.
    pub bucket_run_seconds: HistogramVec,
    /// `kiln_lowerings_total`: buckets compiled by this process (0 when serving an artifact).
    pub lowerings: IntCounter,
    /// `kiln_buckets_compiled`: buckets that have a plan.
    pub buckets_compiled: IntGauge,
}

fn must<T>(r: prometheus::Result<T>) -> T {
    // Only a malformed name or a duplicate registration fails, both fixed here at compile time.
    r.expect("metric definitions are static and registered once")
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let seconds = vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
        let requests = must(IntCounterVec::new(Opts::new("kiln_requests_total", "HTTP requests by route and status"), &["route", "status"]));
        let request_seconds = must(HistogramVec::new(
            HistogramOpts::new("kiln_request_duration_seconds", "Request latency, arrival to response").buckets(seconds.clone()),
            &["route"],
        ));
        let queue_depth = must(IntGauge::new("kiln_queue_depth", "Texts admitted and waiting for a batch"));
        let in_flight = must(IntGauge::new("kiln_in_flight_texts", "Texts admitted and not yet answered"));
        let batch_rows = must(Histogram::with_opts(
            HistogramOpts::new("kiln_batch_rows", "Texts per batch").buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]),
        ));
        let batch_tokens = must(Histogram::with_opts(
            HistogramOpts::new("kiln_batch_tokens", "Real (unpadded) tokens per batch")
                .buckets(vec![16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0]),
        ));
        let tokens_real = must(IntCounter::new("kiln_tokens_real_total", "Real tokens run"));
        let tokens_computed = must(IntCounter::new("kiln_tokens_computed_total", "Tokens computed, padding included (bucket rows x seq)"));
        let padding_ratio = must(Gauge::new("kiln_padding_ratio", "Share of computed tokens that were padding, since start"));
        let bucket_run_seconds = must(HistogramVec::new(
            HistogramOpts::new("kiln_bucket_run_seconds", "Engine time per batch, by bucket").buckets(seconds),
            &["bucket"],
        ));
        let lowerings = must(IntCounter::new("kiln_lowerings_total", "Buckets compiled by this process"));
        let buckets_compiled = must(IntGauge::new("kiln_buckets_compiled", "Buckets that have a plan"));
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(request_seconds.clone()),
            Box::new(queue_depth.clone()),
            Box::new(in_flight.clone()),
            Box::new(batch_rows.clone()),
            Box::new(batch_tokens.clone()),
            Box::new(tokens_real.clone()),
            Box::new(tokens_computed.clone()),
            Box::new(padding_ratio.clone()),
            Box::new(bucket_run_seconds.clone()),
            Box::new(lowerings.clone()),
            Box::new(buckets_compiled.clone()),
        ] {
            must(registry.register(c));
        }
        Metrics {
            registry,
            requests,
            request_seconds,
            queue_depth,
            in_flight,
            batch_rows,
            batch_tokens,
            tokens_real,
            tokens_computed,
            padding_ratio,
            bucket_run_seconds,
            lowerings,
            buckets_compiled,
        }
    }

    /// The text exposition, after bringing the engine's own counts up to date.
    pub fn render(&self, lowerings: usize, compiled: usize) -> String {
        let seen = self.lowerings.get();
        if lowerings as u64 > seen {
            self.lowerings.inc_by(lowerings as u64 - seen);
        }
        self.buckets_compiled.set(compiled as i64);
        let computed = self.tokens_computed.get();
        if computed > 0 {
            self.padding_ratio.set(1.0 - self.tokens_real.get() as f64 / computed as f64);
        }
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail on I/O; a failure would be a bad metric, caught in tests.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
