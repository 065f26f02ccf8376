//! `kiln embed`: a few texts, once. The model, tokenizer and engine come from [`Opened`], as
//! for `kiln serve`; only the buckets differ: one bucket of exactly these texts (JIT), or an
//! artifact's, each plan mapped at its first use.

use kiln_runtime::cpu::Threads;
use kiln_runtime::{Bucket, Error, Result};

use super::open::{Mapping, ModelSource, Opened, Runner};
use super::TokenizeError;
use crate::onnx::l2_normalize;

/// One vector per text: the model's own output, or per-token states pooled then L2-normalized
/// (as sentence-transformers gives them). Texts past the model's limit are truncated.
pub fn embed_texts(source: &ModelSource, runner: Runner, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
    let mut o = Opened::new(source, runner, Threads::Auto)?;
    let plan = o.plan_path().map(std::path::Path::to_path_buf);
    if let (_, Some(seq)) = o.fixed_dims() {
        // Texts are cut at a fixed sequence length, as at the model's own limit.
        o.cap_tokens(seq);
    }
    let tok = o.tokenizer()?;
    let seqs = texts
        .iter()
        .map(|t| {
            tok.encode(t, true).map_err(|e| {
                let message = match e {
                    TokenizeError::Failed(m) => format!("cannot tokenize {t:?}: {m}"),
                    TokenizeError::Empty => format!("{t:?} has no tokens"),
                    TokenizeError::TooLong { tokens, max } => format!("{t:?} has {tokens} tokens, the model takes {max}"),
                };
                Error::Model { path: tok.path().to_path_buf(), message }
            })
        })
        .collect::<Result<Vec<_>>>()?;
    if seqs.is_empty() {
        return Ok(Vec::new());
    }
    let buckets = match (o.artifact_buckets(), o.fixed_dims()) {
        (Some(b), _) => b.to_vec(),
        (None, (rows, seq)) => {
            let b = bucket_for(&seqs, matches!(source, ModelSource::Folder(_)), o.max_tokens());
            // A fixed dim of the model (one sequence length or batch size) is the bucket's.
            vec![Bucket::new(rows.unwrap_or(b.batch), seq.unwrap_or(b.seq))]
        }
    };
    let e = o.start(&buckets, Mapping::OnUse)?;
    let v = e.embed(&seqs).map_err(|err| match &plan {
        Some(p) => err.context(p.display()),
        None => err,
    })?;
    Ok(if e.info().pooled && !e.normalized() { v.into_iter().map(l2_normalize).collect() } else { v })
}

/// The bucket a one-off request compiles: its rows and its longest text, rounded up to a
/// multiple of 16 tokens for a model folder (a handful of plans cover every request; never past
/// the model's limit), exact for an ONNX model (whose sequence dim may be fixed).
fn bucket_for(seqs: &[Vec<i64>], round: bool, max_tokens: usize) -> Bucket {
    let tokens = seqs.iter().map(|s| s.len()).max().unwrap_or(1).max(1);
    let seq = if round { (tokens.div_ceil(16) * 16).min(max_tokens.max(tokens)) } else { tokens };
    Bucket::new(seqs.len(), seq)
}

#[cfg(test)]
mod tests {
    use super::bucket_for;
    use kiln_runtime::Bucket;

    #[test]
    fn buckets_round_to_16_within_the_limit() {
        let s = |n: usize| vec![1i64; n];
        assert_eq!(bucket_for(&[s(3), s(17)], true, 256), Bucket::new(2, 32));
        assert_eq!(bucket_for(&[s(250)], true, 256), Bucket::new(1, 256));
        assert_eq!(bucket_for(&[s(250)], true, 250), Bucket::new(1, 250));
        assert_eq!(bucket_for(&[s(17)], false, 512), Bucket::new(1, 17));
    }
}
