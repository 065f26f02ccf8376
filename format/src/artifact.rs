//! Plan artifacts: the unit users ship.
//!
//! Layout (all integers little-endian):
//! ```text
//! magic        8 bytes  "KILNPLAN"
//! version      u32      FORMAT_VERSION
//! header_len   u32
//! header       bincode 2 (standard config) of ArtifactHeader
//! body_len     u64
//! body         bincode 2 of ArtifactBody (one PlanPayload per bucket)
//! checksum     32 bytes SHA-256 of every byte before it
//! signature    optional, 104 bytes: "KILNSIG1", Ed25519 public key, signature (see `trust`)
//! ```
//! [`Artifact::from_bytes`] checks size, magic, version and checksum before decoding anything,
//! then the target (architecture, CPU features) and that every plan is of the target's kind and
//! filed under its own bucket; a GPU plan is validated as it decodes. The backend that runs it
//! checks the graph's signature ([`Artifact::check_signature`]) and — a CPU plan — the kernel ABI
//! and every offset before it maps any code.
//!
//! The body holds the graph's [`Signature`] (inputs, outputs, weight table), not the graph: a
//! runtime needs no ops. The header's fingerprint is of the whole graph, so a compiler-side user
//! holding the graph checks it exactly ([`Artifact::check_graph`]). Weights are not in the
//! artifact: they come from the checkpoint through a `WeightLoader`.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::bucket::Bucket;
use crate::error::{Error, Result};
use crate::features::has_cpu_feature;
use crate::graph::Graph;
use crate::plan::cpu::CpuPlanImage;
use crate::plan::cuda::CudaPlanSpec;
use crate::signature::{fingerprint, hex, Signature};
use crate::trust::{self, TrustPolicy, SIG_BLOCK_LEN};

pub const MAGIC: &[u8; 8] = b"KILNPLAN";
include!(concat!(env!("OUT_DIR"), "/schema.rs"));

/// The container's own layout (magic, lengths, checksum, trailer), bumped by hand when it
/// changes (2: the optional signature trailer).
const LAYOUT_REVISION: u32 = 2;

/// The format version: the hash of every serialized type's definition (`build.rs`) with the
/// layout revision mixed in. Not ordered: two builds read each other's artifacts exactly when
/// their versions are equal.
pub const FORMAT_VERSION: u32 =
    u32::from_le_bytes([SCHEMA_HASH[0], SCHEMA_HASH[1], SCHEMA_HASH[2], SCHEMA_HASH[3]]) ^ LAYOUT_REVISION;
const FIXED_HEAD: usize = 8 + 4 + 4;
const CHECKSUM_LEN: usize = 32;

/// What the code in an artifact runs on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Target {
    /// x86-64 machine code needing these CPU features.
    CpuX86_64 { features: Vec<String> },
    /// PTX/cubin for a CUDA device of this compute capability.
    Cuda { major: u32, minor: u32 },
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::CpuX86_64 { features } => write!(f, "cpu-x86_64 (+{})", features.join(",+")),
            Target::Cuda { major, minor } => write!(f, "cuda sm_{major}{minor}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactHeader {
    /// The kiln version that wrote the artifact.
    pub kiln_version: String,
    pub target: Target,
    /// [`fingerprint`] of the graph the plans were compiled from.
    pub fingerprint: [u8; 32],
    /// The buckets inside, in body order.
    pub buckets: Vec<Bucket>,
}

/// One bucket's compiled plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PlanPayload {
    Cpu(CpuPlanImage),
    /// A GPU plan (PTX/cubin, launch list, arena size).
    Cuda(CudaPlanSpec),
}

impl PlanPayload {
    pub fn bucket(&self) -> Bucket {
        match self {
            PlanPayload::Cpu(i) => i.bucket,
            PlanPayload::Cuda(s) => s.bucket,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArtifactBody {
    /// The signature of the graph the plans were compiled from, so a runtime without the
    /// compiler can check a checkpoint against it and build batches.
    pub signature: Signature,
    pub plans: Vec<PlanPayload>,
}

/// A verified artifact.
#[derive(Debug, Clone, PartialEq)]
pub struct Artifact {
    pub header: ArtifactHeader,
    pub body: ArtifactBody,
    /// Who signed the file it was read from (None: unsigned, or built in memory).
    pub signer: Option<ed25519_dalek::VerifyingKey>,
}

/// Whether kiln `a` and `b` are semver-compatible: the same major version, or for 0.x the same
/// minor. (The format version already pins the layout; this pins the meaning of the code, such as
/// the kernels it calls, across releases.)
fn semver_compatible(a: &str, b: &str) -> bool {
    let parts = |v: &str| -> Option<(u64, u64)> {
        let mut it = v.split(['.', '-', '+']);
        Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
    };
    match (parts(a), parts(b)) {
        (Some((0, x)), Some((0, y))) => x == y,
        (Some((x, _)), Some((y, _))) => x == y,
        _ => false,
    }
}

fn reject<T>(message: impl Into<String>) -> Result<T> {
    Err(Error::Artifact { message: message.into() })
}

impl Artifact {
    pub fn new(graph: &Graph, target: Target, plans: Vec<(Bucket, PlanPayload)>) -> Self {
        let (buckets, plans) = plans.into_iter().unzip();
        Artifact {
            header: ArtifactHeader {
                kiln_version: env!("CARGO_PKG_VERSION").to_string(),
                target,
                fingerprint: fingerprint(graph),
                buckets,
            },
            body: ArtifactBody { signature: graph.signature(), plans },
            signer: None,
        }
    }

    /// The file image, signed with `key`: the unsigned image and a signature trailer.
    pub fn to_signed_bytes(&self, key: &ed25519_dalek::SigningKey) -> Vec<u8> {
        let mut out = self.to_bytes();
        let sum: [u8; 32] = out[out.len() - CHECKSUM_LEN..].try_into().unwrap();
        out.extend_from_slice(&trust::signature_block(key, &sum));
        out
    }

    /// The unsigned file image.
    pub fn to_bytes(&self) -> Vec<u8> {
        let cfg = bincode::config::standard();
        let header = bincode::serde::encode_to_vec(&self.header, cfg).expect("header encodes");
        let body = bincode::serde::encode_to_vec(&self.body, cfg).expect("body encodes");
        let mut out = Vec::with_capacity(FIXED_HEAD + header.len() + 8 + body.len() + CHECKSUM_LEN);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&body);
        let sum: [u8; 32] = Sha256::digest(&out).into();
        out.extend_from_slice(&sum);
        out
    }

    /// Reads and verifies an artifact file without trusting it with memory or time: only a
    /// regular file (not a FIFO or a device), whose fixed head and header lengths are checked
    /// against the file size before the rest is read. Then as [`Artifact::from_bytes`].
    pub fn from_file(path: &std::path::Path) -> Result<Self> {
        Self::from_file_with(path, &TrustPolicy::AnyIntact)
    }

    /// [`Artifact::from_file`] under a trust policy.
    pub fn from_file_with(path: &std::path::Path, policy: &TrustPolicy) -> Result<Self> {
        use std::io::Read;
        let io = |e: std::io::Error| Error::io(path, &e);
        let meta = std::fs::metadata(path).map_err(io)?;
        if !meta.is_file() {
            return reject("not a regular file");
        }
        let size = meta.len();
        if size < (FIXED_HEAD + 8 + CHECKSUM_LEN) as u64 {
            return reject(format!("{size} bytes is too short to be a kiln plan (truncated?)"));
        }
        let mut f = std::fs::File::open(path).map_err(io)?;
        let mut head = vec![0u8; FIXED_HEAD];
        f.read_exact(&mut head).map_err(io)?;
        if &head[..8] != MAGIC {
            return reject("not a kiln plan artifact (bad magic)");
        }
        let header_len = u32::from_le_bytes(head[12..16].try_into().unwrap()) as u64;
        if (FIXED_HEAD as u64 + header_len + 8 + CHECKSUM_LEN as u64) > size {
            return reject(format!("header length {header_len} runs past the end of the {size}-byte file"));
        }
        head.resize(FIXED_HEAD + header_len as usize + 8, 0);
        f.read_exact(&mut head[FIXED_HEAD..]).map_err(io)?;
        let body_len = u64::from_le_bytes(head[head.len() - 8..].try_into().unwrap());
        let unsigned = (head.len() as u64).checked_add(body_len).and_then(|n| n.checked_add(CHECKSUM_LEN as u64));
        if unsigned != Some(size) && unsigned.and_then(|n| n.checked_add(SIG_BLOCK_LEN as u64)) != Some(size) {
            return reject(format!("body length {body_len} does not match the {size}-byte file"));
        }
        let mut bytes = head;
        bytes.reserve_exact((size as usize).saturating_sub(bytes.len()));
        f.take(size - bytes.len() as u64).read_to_end(&mut bytes).map_err(io)?;
        if bytes.len() as u64 != size {
            return reject("the file changed size while it was read");
        }
        Self::from_bytes_with(&bytes, policy)
    }

    /// Parses and verifies an artifact: size, magic, lengths, checksum, version, then decodes
    /// header and body and checks the target against this machine. Runs nothing. Any intact
    /// artifact is accepted (see [`Artifact::from_bytes_with`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        Self::from_bytes_with(bytes, &TrustPolicy::AnyIntact)
    }

    /// [`Artifact::from_bytes`] under a trust policy: the signature (if any) and the policy are
    /// checked right after the checksum, before anything is decoded.
    pub fn from_bytes_with(bytes: &[u8], policy: &TrustPolicy) -> Result<Self> {
        if bytes.len() < FIXED_HEAD + 8 + CHECKSUM_LEN {
            return reject(format!("{} bytes is too short to be a kiln plan (truncated?)", bytes.len()));
        }
        if &bytes[..8] != MAGIC {
            return reject("not a kiln plan artifact (bad magic)");
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
        let header_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
        // Where the checksum ends, from the declared lengths; what follows is the trailer.
        let sum_end = FIXED_HEAD
            .checked_add(header_len)
            .filter(|&e| e + 8 <= bytes.len())
            .and_then(|header_end| {
                let body_len = u64::from_le_bytes(bytes[header_end..header_end + 8].try_into().unwrap());
                usize::try_from(body_len).ok()?.checked_add(header_end + 8 + CHECKSUM_LEN)
            })
            .filter(|&e| e == bytes.len() || bytes.len().checked_sub(SIG_BLOCK_LEN) == Some(e));
        let intact_at = |end: usize| {
            let want: [u8; 32] = Sha256::digest(&bytes[..end - CHECKSUM_LEN]).into();
            want.as_slice() == &bytes[end - CHECKSUM_LEN..end]
        };
        let intact = sum_end.is_some_and(intact_at);
        // The version is believed only for an intact file: random bytes after the magic are
        // corruption, not "a newer kiln".
        if version != FORMAT_VERSION && !intact {
            return reject(format!(
                "corrupt, or from an incompatible kiln: format {version:08x} (this runtime reads {FORMAT_VERSION:08x}) \
                 and the lengths or checksum do not match"
            ));
        }
        if version != FORMAT_VERSION {
            return reject(format!(
                "format {version:08x} was written by another kiln build (this runtime reads format {FORMAT_VERSION:08x}): \
                 recompile the plan with this kiln"
            ));
        }
        let Some(sum_end) = sum_end else { return reject("the header and body lengths do not match the file size") };
        if !intact {
            return reject("checksum mismatch: the file is corrupt or truncated");
        }
        let signer = trust::check(&bytes[sum_end..], &bytes[sum_end - CHECKSUM_LEN..sum_end], policy)?;
        let content = &bytes[..sum_end - CHECKSUM_LEN];
        let header_end = FIXED_HEAD + header_len;
        let cfg = bincode::config::standard().with_limit::<{ 1 << 30 }>();
        let (header, used): (ArtifactHeader, usize) =
            bincode::serde::decode_from_slice(&content[FIXED_HEAD..header_end], cfg)
                .map_err(|e| Error::Artifact { message: format!("bad header: {e}") })?;
        if used != header_len {
            return reject("header has trailing bytes");
        }
        let ours = env!("CARGO_PKG_VERSION");
        if !semver_compatible(&header.kiln_version, ours) {
            return reject(format!(
                "written by kiln {}, which this runtime (kiln {ours}) does not run: recompile the plan",
                header.kiln_version
            ));
        }
        let body_len = u64::from_le_bytes(content[header_end..header_end + 8].try_into().unwrap()) as usize;
        let body_start = header_end + 8;
        if body_start.checked_add(body_len) != Some(content.len()) {
            return reject("body length does not match the file size");
        }
        let (body, used): (ArtifactBody, usize) = bincode::serde::decode_from_slice(&content[body_start..], cfg)
            .map_err(|e| Error::Artifact { message: format!("bad body: {e}") })?;
        if used != body_len {
            return reject("body has trailing bytes");
        }
        if body.plans.len() != header.buckets.len() {
            return reject("header and body disagree on the number of buckets");
        }
        for (i, (b, p)) in header.buckets.iter().zip(&body.plans).enumerate() {
            if p.bucket() != *b {
                return reject(format!("plan {i} is filed under bucket {b} but is for bucket {}", p.bucket()));
            }
            if let PlanPayload::Cuda(spec) = p {
                spec.validate()?;
            }
        }
        let a = Artifact { header, body, signer };
        a.check_target()?;
        Ok(a)
    }

    /// Checks the artifact's target against this machine (architecture and CPU features) and
    /// that every plan is of the target's kind.
    pub fn check_target(&self) -> Result<()> {
        match &self.header.target {
            Target::CpuX86_64 { features } => {
                if !cfg!(target_arch = "x86_64") {
                    return reject(format!("compiled for {}, this machine is not x86-64", self.header.target));
                }
                let missing: Vec<&str> =
                    features.iter().map(|s| s.as_str()).filter(|f| !has_cpu_feature(f)).collect();
                if !missing.is_empty() {
                    return reject(format!("this CPU lacks features the plan needs: {}", missing.join(", ")));
                }
                for p in &self.body.plans {
                    if !matches!(p, PlanPayload::Cpu(_)) {
                        return reject("a cpu artifact holds a non-cpu plan");
                    }
                }
                Ok(())
            }
            // Whether a GPU can run it is checked when one is opened (`PrecompiledCuda`);
            // here only the shape of the artifact.
            Target::Cuda { major, .. } => {
                if *major == 0 {
                    return reject(format!("compiled for {}, which is not a CUDA architecture", self.header.target));
                }
                for p in &self.body.plans {
                    if !matches!(p, PlanPayload::Cuda(_)) {
                        return reject("a cuda artifact holds a non-cuda plan");
                    }
                }
                Ok(())
            }
        }
    }

    /// Checks that `graph` has the signature the artifact's plans were compiled for (inputs,
    /// outputs and weight table): what a runtime holding only the artifact's interface graph
    /// ([`Signature::graph`]) or the model's full graph can check.
    pub fn check_signature(&self, graph: &Graph) -> Result<()> {
        let sig = graph.signature();
        let ours = &self.body.signature;
        if sig == *ours {
            return Ok(());
        }
        let what = if sig.inputs != ours.inputs {
            "inputs"
        } else if sig.outputs != ours.outputs {
            "outputs"
        } else {
            "weight table"
        };
        reject(format!("compiled for a graph with other {what}: recompile the plan for this model"))
    }

    /// Checks that the artifact was compiled from `graph` (same ops, shapes and weight table).
    pub fn check_graph(&self, graph: &Graph) -> Result<()> {
        let fp = fingerprint(graph);
        if fp != self.header.fingerprint {
            return reject(format!(
                "compiled for another graph or weight table (artifact fingerprint {}, this model {}): \
                 recompile the plan for this model",
                &hex(&self.header.fingerprint)[..16],
                &hex(&fp)[..16]
            ));
        }
        Ok(())
    }

    /// The plan of one bucket, or an error listing the buckets the artifact has.
    pub fn plan(&self, bucket: Bucket) -> Result<&PlanPayload> {
        match self.header.buckets.iter().position(|&b| b == bucket) {
            Some(i) => Ok(&self.body.plans[i]),
            None => Err(Error::BucketNotCompiled { requested: bucket, available: self.header.buckets.clone() }),
        }
    }
}
