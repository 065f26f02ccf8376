//! BERT encoders (all-MiniLM-L6-v2 and friends) as kiln graphs: embeddings (word + position +
//! token type, LayerNorm), N encoder layers (self-attention, GELU-erf FFN, post-LayerNorm),
//! mean pooling over the attention mask, L2 normalization.

use std::path::Path;

use kiln_runtime::graph::{Dim, Graph, InputRole, UnaryOp, ValueId};
use kiln_runtime::{DType, Error, Result};
use serde::Deserialize;

use crate::ir::GraphBuilder;

/// The fields of a Hugging Face BERT `config.json` that the graph depends on.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default = "default_pos")]
    pub position_embedding_type: String,
    /// `bert` (or absent, as in old configs); anything else is another architecture.
    #[serde(default)]
    pub model_type: Option<String>,
}

/// Hugging Face's `hidden_act` names (`transformers.activations.ACT2FN`) and kiln's op for each.
/// `gelu_fast` is `gelu_new` written differently: the same function.
const ACTIVATIONS: [(&str, UnaryOp); 9] = [
    ("gelu", UnaryOp::Gelu),
    ("gelu_python", UnaryOp::Gelu),
    ("gelu_new", UnaryOp::GeluTanh),
    ("gelu_pytorch_tanh", UnaryOp::GeluTanh),
    ("gelu_fast", UnaryOp::GeluTanh),
    ("relu", UnaryOp::Relu),
    ("silu", UnaryOp::Silu),
    ("swish", UnaryOp::Silu),
    ("tanh", UnaryOp::Tanh),
];

/// Parameters beyond which a config is refused before any graph is built (2⁴⁰ f32 is 4 TiB):
/// a typo such as `num_hidden_layers: 1e9` fails at once instead of building for hours.
const MAX_PARAMETERS: u128 = 1 << 40;
/// Layers beyond which a config is refused (the deepest published BERT-style encoders have 48):
/// each layer is some 40 graph nodes, built before any checkpoint is read.
const MAX_LAYERS: usize = 4096;

fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_act() -> String {
    "gelu".into()
}
fn default_pos() -> String {
    "absolute".into()
}

impl BertConfig {
    /// Reads and checks `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, &e))?;
        Self::from_json(&text).map_err(|message| Error::Model { path: path.into(), message })
    }

    /// Parses and checks the text of a `config.json`.
    pub fn from_json(text: &str) -> std::result::Result<Self, String> {
        let cfg: BertConfig = serde_json::from_str(text).map_err(|e| format!("not a BERT config.json: {e}"))?;
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> std::result::Result<(), String> {
        if let Some(t) = self.model_type.as_deref().filter(|t| *t != "bert") {
            return Err(format!("model_type `{t}` is not a BERT encoder (bert)"));
        }
        if self.num_attention_heads == 0 || !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(format!(
                "hidden_size {} is not divisible by num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        self.activation()?;
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps > 0.0) {
            return Err(format!("layer_norm_eps {} is not a positive number", self.layer_norm_eps));
        }
        if self.position_embedding_type != "absolute" {
            return Err(format!(
                "position_embedding_type `{}` is not supported (absolute)",
                self.position_embedding_type
            ));
        }
        if self.num_hidden_layers > MAX_LAYERS {
            return Err(format!("num_hidden_layers {} is more than kiln builds ({MAX_LAYERS})", self.num_hidden_layers));
        }
        match self.parameters() {
            Some(n) if n <= MAX_PARAMETERS => Ok(()),
            _ => Err(format!(
                "{} layers of hidden_size {} and intermediate_size {} exceed {MAX_PARAMETERS} parameters",
                self.num_hidden_layers, self.hidden_size, self.intermediate_size
            )),
        }
    }

    /// The op of `hidden_act`.
    pub fn activation(&self) -> std::result::Result<UnaryOp, String> {
        ACTIVATIONS.iter().find(|(name, _)| *name == self.hidden_act).map(|(_, op)| *op).ok_or_else(|| {
            let known: Vec<&str> = ACTIVATIONS.iter().map(|(n, _)| *n).collect();
            format!("hidden_act `{}` is not supported ({})", self.hidden_act, known.join(", "))
        })
    }

    /// The number of parameters the config describes (None on overflow).
    pub fn parameters(&self) -> Option<u128> {
        let (h, f) = (self.hidden_size as u128, self.intermediate_size as u128);
        let emb = (self.vocab_size as u128 + self.max_position_embeddings as u128 + self.type_vocab_size as u128 + 2)
            .checked_mul(h)?;
        // Q, K, V, O (h×h + h each), FFN in and out, two LayerNorms.
        let layer = (4 * h).checked_mul(h + 1)?.checked_add(f.checked_mul(2 * h + 1)?.checked_add(5 * h)?)?;
        emb.checked_add(layer.checked_mul(self.num_hidden_layers as u128)?)
    }

    /// Checks the config against a checkpoint's tensors (name and shape) before a graph is built:
    /// the embedding tables, the first layer's FFN and the number of layers must match.
    pub fn check_checkpoint<'a>(
        &self,
        prefix: &str,
        tensors: impl IntoIterator<Item = (&'a str, &'a [usize])>,
    ) -> std::result::Result<(), String> {
        let h = self.hidden_size;
        let want: [(String, [usize; 2]); 4] = [
            (format!("{prefix}embeddings.word_embeddings.weight"), [self.vocab_size, h]),
            (format!("{prefix}embeddings.position_embeddings.weight"), [self.max_position_embeddings, h]),
            (format!("{prefix}embeddings.token_type_embeddings.weight"), [self.type_vocab_size, h]),
            (format!("{prefix}encoder.layer.0.intermediate.dense.weight"), [self.intermediate_size, h]),
        ];
        let mut layers = std::collections::BTreeSet::new();
        let mut seen = [false; 4];
        let layer_prefix = format!("{prefix}encoder.layer.");
        for (name, shape) in tensors {
            if let Some(i) = want.iter().position(|(n, _)| n == name) {
                if shape != want[i].1 {
                    return Err(format!("tensor `{name}` has shape {shape:?}, the config says {:?}", want[i].1));
                }
                seen[i] = true;
            }
            if let Some(l) = name.strip_prefix(&layer_prefix).and_then(|r| r.split('.').next()).and_then(|l| l.parse::<usize>().ok()) {
                layers.insert(l);
            }
        }
        if let Some(i) = seen.iter().position(|s| !s) {
            if !(i == 3 && self.num_hidden_layers == 0) {
                return Err(format!("the checkpoint has no tensor `{}`", want[i].0));
            }
        }
        if layers.len() != self.num_hidden_layers || layers.last().is_some_and(|&l| l + 1 != layers.len()) {
            return Err(format!(
                "num_hidden_layers is {}, the checkpoint has {} layers (encoder.layer.N)",
                self.num_hidden_layers,
                layers.len()
            ));
        }
        Ok(())
    }

    /// all-MiniLM-L6-v2's shape.
    pub fn minilm_l6() -> Self {
        BertConfig {
            vocab_size: 30522,
            hidden_size: 384,
            num_hidden_layers: 6,
            num_attention_heads: 12,
            intermediate_size: 1536,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            hidden_act: "gelu".into(),
            position_embedding_type: "absolute".into(),
            model_type: Some("bert".into()),
        }
    }

    /// A small config for fast tests.
    pub fn tiny() -> Self {
        BertConfig {
            vocab_size: 50,
            hidden_size: 16,
            num_hidden_layers: 2,
            num_attention_heads: 2,
            intermediate_size: 32,
            max_position_embeddings: 64,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            hidden_act: "gelu".into(),
            position_embedding_type: "absolute".into(),
            model_type: Some("bert".into()),
        }
    }
}

/// What the graph returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BertOutputs {
    /// `embeddings` [batch, hidden]: mean-pooled, L2-normalized sentence embeddings.
    pub embeddings: bool,
    /// `last_hidden_state` [batch, seq, hidden]: the encoder output.
    pub last_hidden_state: bool,
}

impl Default for BertOutputs {
    fn default() -> Self {
        BertOutputs { embeddings: true, last_hidden_state: false }
    }
}

/// The additive value for masked-out attention scores (as in the original BERT).
pub const MASK_VALUE: f32 = -10000.0;

/// Builds the sentence-embedding graph. `prefix` is prepended to every weight name (`""` for
/// sentence-transformers checkpoints, `"bert."` for `BertModel` ones saved inside a task model).
pub fn build_bert(cfg: &BertConfig, prefix: &str, outputs: BertOutputs) -> Result<Graph> {
    cfg.check().map_err(|m| Error::graph("<bert config>", m))?;
    let act = cfg.activation().map_err(|m| Error::graph("<bert config>", m))?;
    let (h, heads, ffn) = (cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size);
    let head_dim = h / heads;
    let eps = cfg.layer_norm_eps as f32;
    let f32_ = DType::F32;
    let mut g = GraphBuilder::new();
    let w = |g: &mut GraphBuilder, name: &str, shape: &[usize]| g.weight(&format!("{prefix}{name}"), f32_, shape);

    let ids = g.input("input_ids", DType::I64, vec![Dim::Batch, Dim::Seq], InputRole::TokenIds)?;
    let mask = g.input("attention_mask", DType::I64, vec![Dim::Batch, Dim::Seq], InputRole::AttentionMask)?;
    let types = g.input("token_type_ids", DType::I64, vec![Dim::Batch, Dim::Seq], InputRole::TokenTypes)?;

    // Embeddings.
    let mut x = g.scoped("embeddings", |g| {
        let word = w(g, "embeddings.word_embeddings.weight", &[cfg.vocab_size, h])?;
        let pos = w(g, "embeddings.position_embeddings.weight", &[cfg.max_position_embeddings, h])?;
        let typ = w(g, "embeddings.token_type_embeddings.weight", &[cfg.type_vocab_size, h])?;
        let we = g.gather(word, ids)?;
        let pe = g.slice(pos, 0, 0, Dim::Seq)?;
        let te = g.gather(typ, types)?;
        let s = g.add(we, pe)?;
        let s = g.add(s, te)?;
        let gamma = w(g, "embeddings.LayerNorm.weight", &[h])?;
        let beta = w(g, "embeddings.LayerNorm.bias", &[h])?;
        g.layer_norm(s, gamma, beta, eps)
    })?;

    // Additive attention mask [batch, 1, 1, seq]: 0 where attended, MASK_VALUE where padded.
    let (mask_f, ext_mask) = g.scoped("mask", |g| {
        let m = g.cast(mask, f32_)?;
        let one = g.scalar(1.0)?;
        let inv = g.sub(one, m)?;
        let big = g.scalar(MASK_VALUE)?;
        let add = g.mul(inv, big)?;
        let ext = g.reshape(add, vec![Dim::Batch, Dim::Fixed(1), Dim::Fixed(1), Dim::Seq])?;
        Ok((m, ext))
    })?;

    let scale = 1.0 / (head_dim as f32).sqrt();
    for l in 0..cfg.num_hidden_layers {
        let p = format!("encoder.layer.{l}.");
        x = g.scoped(&format!("layer{l}"), |g| {
            let heads_of = |g: &mut GraphBuilder, t: ValueId| -> Result<ValueId> {
                let r = g.reshape(t, vec![Dim::Batch, Dim::Seq, Dim::Fixed(heads), Dim::Fixed(head_dim)])?;
                g.transpose(r, &[0, 2, 1, 3])
            };
            let lin = |g: &mut GraphBuilder, x: ValueId, name: &str, out: usize, inp: usize| -> Result<ValueId> {
                let wt = w(g, &format!("{p}{name}.weight"), &[out, inp])?;
                let b = w(g, &format!("{p}{name}.bias"), &[out])?;
                g.linear(x, wt, Some(b))
            };
            let attn = g.scoped("attn", |g| {
                let q = lin(g, x, "attention.self.query", h, h)?;
                let k = lin(g, x, "attention.self.key", h, h)?;
                let v = lin(g, x, "attention.self.value", h, h)?;
                let (q, k, v) = (heads_of(g, q)?, heads_of(g, k)?, heads_of(g, v)?);
                let scores = g.matmul_t(q, k, false, true)?;
                let sc = g.scalar(scale)?;
                let scores = g.mul(scores, sc)?;
                let probs = g.softmax(scores, 3, Some(ext_mask))?;
                let ctx = g.matmul(probs, v)?;
                let ctx = g.transpose(ctx, &[0, 2, 1, 3])?;
                g.reshape(ctx, vec![Dim::Batch, Dim::Seq, Dim::Fixed(h)])
            })?;
            let o = lin(g, attn, "attention.output.dense", h, h)?;
            let r = g.add(o, x)?;
            let g1 = w(g, &format!("{p}attention.output.LayerNorm.weight"), &[h])?;
            let b1 = w(g, &format!("{p}attention.output.LayerNorm.bias"), &[h])?;
            let x1 = g.layer_norm(r, g1, b1, eps)?;
            let f = lin(g, x1, "intermediate.dense", ffn, h)?;
            let f = g.unary(act, f)?;
            let o2 = lin(g, f, "output.dense", h, ffn)?;
            let r2 = g.add(o2, x1)?;
            let g2 = w(g, &format!("{p}output.LayerNorm.weight"), &[h])?;
            let b2 = w(g, &format!("{p}output.LayerNorm.bias"), &[h])?;
            g.layer_norm(r2, g2, b2, eps)
        })?;
    }

    if outputs.last_hidden_state {
        g.output("last_hidden_state", x);
    }
    if outputs.embeddings {
        let e = g.scoped("pool", |g| {
            // Mean over the real tokens: sum(x * mask) / max(sum(mask), 1e-9).
            let m = g.reshape(mask_f, vec![Dim::Batch, Dim::Seq, Dim::Fixed(1)])?;
            let xm = g.mul(x, m)?;
            let sum = g.reduce_sum(xm, &[1], false)?;
            let cnt = g.reduce_sum(m, &[1], false)?;
            let tiny = g.scalar(1e-9)?;
            let cnt = g.max(cnt, tiny)?;
            let mean = g.div(sum, cnt)?;
            // L2 normalize: mean / max(||mean||, 1e-12).
            let sq = g.mul(mean, mean)?;
            let ss = g.reduce_sum(sq, &[1], true)?;
            let norm = g.sqrt(ss)?;
            let eps = g.scalar(1e-12)?;
            let norm = g.max(norm, eps)?;
            g.div(mean, norm)
        })?;
        g.output("embeddings", e);
    }
    g.finish()
}

/// Detects the weight-name prefix of a checkpoint from its tensor names.
pub fn detect_prefix<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<&'static str> {
    for n in names {
        if n == "embeddings.word_embeddings.weight" {
            return Some("");
        }
        if n == "bert.embeddings.word_embeddings.weight" {
            return Some("bert.");
        }
    }
    None
}
