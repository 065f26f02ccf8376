//! The texts' tokenizer: a Hugging Face `tokenizer.json` that never pads (the engine pads to the
//! bucket) and truncates only when asked.

use std::path::{Path, PathBuf};

use kiln_runtime::{Error, Result};

/// The texts' tokenizer (a Hugging Face `tokenizer.json`): never pads (the engine pads to the
/// bucket), truncates only when asked.
pub struct TextTokenizer {
    path: PathBuf,
    plain: tokenizers::Tokenizer,
    truncating: tokenizers::Tokenizer,
    pub max_tokens: usize,
    /// Ids must stay below this (the model's embedding table).
    vocab: usize,
}

/// Why a text cannot be embedded as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenizeError {
    /// More tokens than the model takes (and truncation was not asked for).
    TooLong { tokens: usize, max: usize },
    /// No token at all.
    Empty,
    Failed(String),
}

impl TextTokenizer {
    pub fn from_file(path: &Path, max_tokens: usize, vocab: usize) -> Result<Self> {
        let plain = tokenizers::Tokenizer::from_file(path).map_err(|e| Error::Model { path: path.to_path_buf(), message: format!("cannot load tokenizer: {e}") })?;
        Self::new(path, plain, max_tokens, vocab)
    }

    /// From a tokenizer already read from `path` (its padding and truncation are reset).
    pub fn new(path: &Path, mut plain: tokenizers::Tokenizer, max_tokens: usize, vocab: usize) -> Result<Self> {
        let bad = |m: String| Error::Model { path: path.to_path_buf(), message: m };
        plain.with_padding(None);
        plain.with_truncation(None).map_err(|e| bad(e.to_string()))?;
        if plain.get_vocab_size(true) > vocab {
            return Err(bad(format!("has {} tokens, the model's embedding table {vocab}", plain.get_vocab_size(true))));
        }
        let mut truncating = plain.clone();
        truncating
            .with_truncation(Some(tokenizers::TruncationParams { max_length: max_tokens, ..Default::default() }))
            .map_err(|e| bad(format!("cannot set truncation: {e}")))?;
        Ok(TextTokenizer { path: path.to_path_buf(), plain, truncating, max_tokens, vocab })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The token ids of `text` (special tokens added); over `max_tokens`, cut to it when
    /// `truncate`, else an error saying how long it is.
    pub fn encode(&self, text: &str, truncate: bool) -> std::result::Result<Vec<i64>, TokenizeError> {
        let ids = |t: &tokenizers::Tokenizer| -> std::result::Result<Vec<i64>, TokenizeError> {
            let e = t.encode(text, true).map_err(|e| TokenizeError::Failed(e.to_string()))?;
            Ok(e.get_ids().iter().map(|&i| i as i64).collect())
        };
        let mut v = ids(&self.plain)?;
        if v.len() > self.max_tokens {
            if !truncate {
                return Err(TokenizeError::TooLong { tokens: v.len(), max: self.max_tokens });
            }
            v = ids(&self.truncating)?;
        }
        if v.is_empty() {
            return Err(TokenizeError::Empty);
        }
        if v.iter().any(|&i| i < 0 || i as usize >= self.vocab) {
            return Err(TokenizeError::Failed(format!("a token id is outside the model's vocabulary of {}", self.vocab)));
        }
        Ok(v)
    }
}

