//! The one error type of kiln. Every variant carries enough context (file, tensor, node, bucket)
//! for a user to act on it.

use std::fmt;
use std::path::PathBuf;

use crate::bucket::Bucket;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// An I/O error while reading `path`.
    Io { path: PathBuf, message: String },
    /// A weight file that is not valid safetensors (truncated, corrupt header, bad offsets).
    MalformedWeights { path: PathBuf, message: String },
    /// The graph asks for a tensor the checkpoint does not have.
    MissingTensor { path: PathBuf, tensor: String },
    /// A tensor exists but its dtype or shape differs from what the graph expects.
    TensorMismatch { path: PathBuf, tensor: String, expected: String, found: String },
    /// The graph is invalid (shape/rank/dtype mismatch); names the node at fault.
    Graph { node: String, message: String },
    /// A batch that cannot be run (wrong dtype, rank, or larger than every bucket).
    BadBatch { message: String },
    /// The engine has no plan for this bucket and may not compile one.
    BucketNotCompiled { requested: Bucket, available: Vec<Bucket> },
    /// The backend cannot run something in the graph.
    Unsupported(String),
    /// A model directory or configuration problem.
    Model { path: PathBuf, message: String },
    /// A plan artifact that failed verification (magic, version, target, checksum, fingerprint).
    Artifact { message: String },
    /// A failure of a backend's machinery at run time (a driver call, a code map).
    Backend(String),
    /// The machine lacks what this needs (no CUDA driver or GPU, no NVRTC, no host compiler):
    /// neither the user's input nor a kiln bug. The message says what is missing and what to
    /// use instead.
    Environment(String),
    /// An error with the file, bucket or step it happened in: `source` is the error itself
    /// (its variant says whose fault it is, [`Error::root`]); the chain is walked by
    /// `std::error::Error::source`.
    Context { context: String, source: Box<Error> },
    /// A kiln bug, not a problem with the user's model or input: an invariant a compiler stage
    /// relies on did not hold. Names the stage (`fuse`, `memory plan`, `cranelift`, ...).
    Internal { stage: String, message: String },
}

impl Error {
    pub fn graph(node: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Graph { node: node.into(), message: message.into() }
    }
    pub fn io(path: impl Into<PathBuf>, err: &std::io::Error) -> Self {
        Error::Io { path: path.into(), message: err.to_string() }
    }
    pub fn internal(stage: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Internal { stage: stage.into(), message: message.into() }
    }
    pub fn bad_batch(message: impl Into<String>) -> Self {
        Error::BadBatch { message: message.into() }
    }
    pub fn environment(message: impl Into<String>) -> Self {
        Error::Environment(message.into())
    }
    /// This error, in `context` (a file, a bucket, a step).
    pub fn context(self, context: impl fmt::Display) -> Self {
        Error::Context { context: context.to_string(), source: Box::new(self) }
    }
    /// The innermost error of a [`Error::Context`] chain (the error itself otherwise): what
    /// went wrong, whatever it happened in.
    pub fn root(&self) -> &Error {
        let mut e = self;
        while let Error::Context { source, .. } = e {
            e = source;
        }
        e
    }
}

fn buckets_list(b: &[Bucket]) -> String {
    if b.is_empty() {
        return "none".into();
    }
    b.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(", ")
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { path, message } => write!(f, "{}: {message}", path.display()),
            Error::MalformedWeights { path, message } => {
                write!(f, "{}: not a valid safetensors file: {message}", path.display())
            }
            Error::MissingTensor { path, tensor } => {
                write!(f, "{}: tensor `{tensor}` not found in the checkpoint", path.display())
            }
            Error::TensorMismatch { path, tensor, expected, found } => write!(
                f,
                "{}: tensor `{tensor}`: expected {expected}, found {found}",
                path.display()
            ),
            Error::Graph { node, message } => write!(f, "graph node `{node}`: {message}"),
            Error::BadBatch { message } => write!(f, "bad batch: {message}"),
            Error::BucketNotCompiled { requested, available } => write!(
                f,
                "no compiled plan for bucket {requested} and this engine may not compile one \
                 (precompiled buckets: {})",
                buckets_list(available)
            ),
            Error::Unsupported(m) => write!(f, "unsupported: {m}"),
            Error::Model { path, message } => write!(f, "{}: {message}", path.display()),
            Error::Artifact { message } => write!(f, "plan artifact rejected: {message}"),
            Error::Backend(m) => write!(f, "backend error: {m}"),
            Error::Environment(m) => write!(f, "not available on this machine: {m}"),
            Error::Context { context, source } => write!(f, "{context}: {source}"),
            Error::Internal { stage, message } => {
                write!(f, "internal error in {stage} (a kiln bug, please report it): {message}")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Context { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_chains_keep_the_root_and_read_as_one_line() {
        let e = Error::environment("no NVRTC").context("bucket 8x128").context("plan.kiln");
        assert_eq!(e.to_string(), "plan.kiln: bucket 8x128: not available on this machine: no NVRTC");
        assert_eq!(e.root(), &Error::Environment("no NVRTC".into()));
        let mut chain = Vec::new();
        let mut cur: Option<&dyn std::error::Error> = Some(&e);
        while let Some(c) = cur {
            chain.push(c.to_string());
            cur = c.source();
        }
        assert_eq!(chain.len(), 3);
        assert_eq!(chain[2], "not available on this machine: no NVRTC");
    }
}
