//! [`Bucket`]: the batch × sequence shape a plan is compiled for. A leaf module (the error type
//! names buckets, so this one must not need the error type: `Bucket::parse` lives with the graph).

use serde::{Deserialize, Serialize};
use std::fmt;

/// A fixed batch × sequence shape that a plan is compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Bucket {
    pub batch: usize,
    pub seq: usize,
}

impl Bucket {
    pub const fn new(batch: usize, seq: usize) -> Self {
        Bucket { batch, seq }
    }
    /// Whether a batch of `rows` sequences of at most `tokens` tokens fits.
    pub fn fits(&self, rows: usize, tokens: usize) -> bool {
        rows <= self.batch && tokens <= self.seq
    }
}

impl fmt::Display for Bucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.batch, self.seq)
    }
}
