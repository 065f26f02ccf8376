#!/usr/bin/env python3
"""Exports small random-weight Hugging Face models the way users export them, and writes each
in the backend-test layout with its reference outputs (OUT/<arch>_<exporter>/
model.onnx, test_data_set_0/{input,output}_K.pb), for `kiln onnx-test`.

kiln's own tests import exports written by scripts of this repository; these are written by
PyTorch's ONNX exporters (TorchScript at opset 14, the dynamo exporter at opsets 18 and 23, the
latter with the standard Attention, RotaryEmbedding, RMSNormalization and Gelu ops) from
transformers' own modeling code: encoders (BERT and its cross-encoder head, DistilBERT,
XLM-RoBERTa and its classifier, ELECTRA, ALBERT, MPNet, DeBERTa and DeBERTa-v2, MobileBERT, ESM,
T5's and BART's encoders, ModernBERT, RoFormer, SqueezeBERT, ConvBERT), decoder-only embedders
without a cache (Llama, Qwen2, Qwen3, Gemma, Gemma 3, Mistral, Phi-3, GPT-NeoX, BLOOM, GPT-2),
CLIP's text tower, vision (ViT, DINOv2, Swin, ConvNeXt) and audio (Whisper's encoder, wav2vec2).
Dims named batch and sequence; traced at batch 2 × 9 tokens, tested at 3 × 13 with the last
row's last 3 tokens masked. onnxruntime's outputs are the reference where it runs the export
(they must agree with PyTorch's), PyTorch's where it cannot.

The cases are committed in tests/data/hf-exports (about 3 MiB compressed; tests/onnx.rs runs them on
both backends), so CI needs neither torch nor transformers (several GiB). Regenerate with
    pip install --target DIR torch==2.15.0 transformers==5.25.0 onnxscript==0.7.2
    PYTHONPATH=DIR:.pydeps python3 scripts/hf_export_cases.py tests/data/hf-exports [ARCH ...]
(an export torch cannot write, or one that does not compute the model at the tested shape, is
reported and left out).
"""
import os
import shutil
import sys
import tempfile
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch
import transformers as tf
from testcase_io import write_data_set

warnings.filterwarnings("ignore")
VOCAB = 64
SMALL = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32,
             vocab_size=VOCAB, max_position_embeddings=32)

TEXT = ["input_ids", "attention_mask"]
CASES = {
    "bert": (lambda: tf.BertModel(tf.BertConfig(**SMALL)), TEXT + ["token_type_ids"]),
    "bert_cls": (lambda: tf.BertForSequenceClassification(tf.BertConfig(**SMALL, num_labels=1)),
                 TEXT + ["token_type_ids"]),
    "distilbert": (lambda: tf.DistilBertModel(tf.DistilBertConfig(
        vocab_size=VOCAB, dim=16, n_layers=2, n_heads=4, hidden_dim=32, max_position_embeddings=32)), TEXT),
    "xlm_roberta": (lambda: tf.XLMRobertaModel(tf.XLMRobertaConfig(**{**SMALL, "max_position_embeddings": 40})), TEXT),
    "electra": (lambda: tf.ElectraModel(tf.ElectraConfig(**{**SMALL, "embedding_size": 8})), TEXT + ["token_type_ids"]),
    "albert": (lambda: tf.AlbertModel(tf.AlbertConfig(**{**SMALL, "embedding_size": 8})), TEXT + ["token_type_ids"]),
    "mpnet": (lambda: tf.MPNetModel(tf.MPNetConfig(**SMALL)), TEXT),
    "deberta_v2": (lambda: tf.DebertaV2Model(tf.DebertaV2Config(
        **SMALL, relative_attention=True, position_buckets=16, max_relative_positions=32,
        pos_att_type=["p2c", "c2p"], position_biased_input=False)), TEXT + ["token_type_ids"]),
    "t5_encoder": (lambda: tf.T5EncoderModel(tf.T5Config(
        vocab_size=VOCAB, d_model=16, d_kv=4, num_heads=4, d_ff=32, num_layers=2,
        relative_attention_num_buckets=8, relative_attention_max_distance=16)), TEXT),
    "modernbert": (lambda: tf.ModernBertModel(tf.ModernBertConfig(
        **{**SMALL, "global_attn_every_n_layers": 2, "local_attention": 4}, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)), TEXT),
    "llama": (lambda: tf.LlamaModel(tf.LlamaConfig(**SMALL, num_key_value_heads=2, use_cache=False)), TEXT),
    "qwen2": (lambda: tf.Qwen2Model(tf.Qwen2Config(**SMALL, num_key_value_heads=2, use_cache=False)), TEXT),
    "gpt2": (lambda: tf.GPT2Model(tf.GPT2Config(
        vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=4, n_positions=32, use_cache=False)), TEXT),
    "clip_text": (lambda: tf.CLIPTextModel(tf.CLIPTextConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=32, eos_token_id=VOCAB - 1)), TEXT),
    "roformer": (lambda: tf.RoFormerModel(tf.RoFormerConfig(**SMALL)), TEXT + ["token_type_ids"]),
    "bart_encoder": (lambda: tf.BartModel(tf.BartConfig(
        vocab_size=VOCAB, d_model=16, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_position_embeddings=32)).get_encoder(), TEXT),
    "squeezebert": (lambda: tf.SqueezeBertModel(tf.SqueezeBertConfig(
        **SMALL, embedding_size=16, q_groups=2, k_groups=2, v_groups=2, post_attention_groups=2,
        intermediate_groups=4, output_groups=4)), TEXT + ["token_type_ids"]),
    "convbert": (lambda: tf.ConvBertModel(tf.ConvBertConfig(**SMALL, embedding_size=16, conv_kernel_size=5)),
                 TEXT + ["token_type_ids"]),
    "gemma": (lambda: tf.GemmaModel(tf.GemmaConfig(**SMALL, num_key_value_heads=1, head_dim=8, use_cache=False)), TEXT),
    "mistral": (lambda: tf.MistralModel(tf.MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=4,
                                                         use_cache=False)), TEXT),
    "phi3": (lambda: tf.Phi3Model(tf.Phi3Config(**SMALL, num_key_value_heads=4, use_cache=False,
                                                pad_token_id=0)), TEXT),
    "gpt_neox": (lambda: tf.GPTNeoXModel(tf.GPTNeoXConfig(**SMALL, rotary_pct=0.5, use_cache=False)), TEXT),
    "bloom": (lambda: tf.BloomModel(tf.BloomConfig(vocab_size=VOCAB, hidden_size=16, n_layer=2, n_head=4,
                                                   use_cache=False)), TEXT),
    "vit": (lambda: tf.ViTModel(tf.ViTConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32,
        image_size=16, patch_size=4)), ["pixel_values"]),
    "whisper_encoder": (lambda: tf.WhisperModel(tf.WhisperConfig(
        vocab_size=VOCAB, d_model=16, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, num_mel_bins=16,
        max_source_positions=20, max_target_positions=8, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)).get_encoder(), ["input_features"]),
    "qwen3": (lambda: tf.Qwen3Model(tf.Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=4, use_cache=False)), TEXT),
    "gemma3_text": (lambda: tf.Gemma3TextModel(tf.Gemma3TextConfig(
        **SMALL, num_key_value_heads=2, head_dim=4, sliding_window=4, use_cache=False)), TEXT),
    "mobilebert": (lambda: tf.MobileBertModel(tf.MobileBertConfig(
        **{**SMALL, "embedding_size": 8}, intra_bottleneck_size=8, true_hidden_size=8,
        num_feedforward_networks=2)), TEXT + ["token_type_ids"]),
    "deberta": (lambda: tf.DebertaModel(tf.DebertaConfig(
        **SMALL, relative_attention=True, max_relative_positions=16, pos_att_type=["p2c", "c2p"])),
        TEXT + ["token_type_ids"]),
    "esm": (lambda: tf.EsmModel(tf.EsmConfig(**SMALL, position_embedding_type="rotary", pad_token_id=1,
                                             mask_token_id=2)), TEXT),
    "xlm_roberta_cls": (lambda: tf.XLMRobertaForSequenceClassification(tf.XLMRobertaConfig(
        **{**SMALL, "max_position_embeddings": 40}, num_labels=1)), TEXT),
    "wav2vec2": (lambda: tf.Wav2Vec2Model(tf.Wav2Vec2Config(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=4, feat_extract_norm="group")), ["input_values"]),
    "convnext": (lambda: tf.ConvNextModel(tf.ConvNextConfig(
        num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], image_size=16, patch_size=4)), ["pixel_values"]),
    "swin": (lambda: tf.SwinModel(tf.SwinConfig(
        image_size=16, patch_size=2, window_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 4])),
        ["pixel_values"]),
    "dinov2": (lambda: tf.Dinov2Model(tf.Dinov2Config(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2, image_size=16,
        patch_size=4)), ["pixel_values"]),
}
# Inputs with fixed dims past the batch (an image, a spectrogram of the encoder's length, audio).
FIXED = {"pixel_values": (3, 16, 16), "input_features": (16, 40), "input_values": (400,)}


EXPORTERS = [e for e in os.environ.get("EXPORTERS", "torchscript,dynamo,dynamo23").split(",") if e]


class First(torch.nn.Module):
    """The model's first output (last_hidden_state, or the logits of a head) from positional inputs."""

    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *xs):
        out = self.model(**dict(zip(self.names, xs)))
        return out[0]


def inputs(b, s, rng):
    """A batch of b rows of s tokens, the last row's last 3 masked."""
    ids = rng.integers(3, VOCAB - 1, size=(b, s)).astype(np.int64)
    ids[:, -1] = VOCAB - 1  # CLIP pools at the highest id (its end token)
    mask = np.ones((b, s), np.int64)
    mask[-1, s - 3:] = 0
    types = np.zeros((b, s), np.int64)
    types[:, s // 2:] = 1
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    for n, dims in FIXED.items():
        feeds[n] = rng.standard_normal((b, *dims)).astype(np.float32)
    return feeds


def export(arch, exporter, path):
    make, names = CASES[arch]
    torch.manual_seed(7)
    model = make().eval()
    # Traced at 2×9, tested at 3×13: a dim the exporter baked in as a constant shows.
    test = inputs(3, 13, np.random.default_rng(5))
    feeds = {n: test[n] for n in names}
    with torch.no_grad():  # before exporting: the exporters may leave the module changed
        ref = First(model, names)(*(torch.from_numpy(feeds[n]) for n in names)).numpy()
    trace = inputs(2, 9, np.random.default_rng(3))
    args = tuple(torch.from_numpy(trace[n]) for n in names)
    axes = {n: {0: "batch"} if n in FIXED else {0: "batch", 1: "sequence"} for n in names}
    axes["out"] = {0: "batch"}
    with torch.no_grad():
        if exporter == "torchscript":
            torch.onnx.export(First(model, names), args, path, input_names=names, output_names=["out"],
                              dynamic_axes=axes, opset_version=14, dynamo=False)
        else:
            batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("sequence", min=2, max=32)
            shapes = tuple({0: batch} if n in FIXED else {0: batch, 1: seq} for n in names)
            opset = 23 if exporter == "dynamo23" else 18
            torch.onnx.export(First(model, names), args, path, input_names=names, output_names=["out"],
                              dynamic_shapes=(shapes,), opset_version=opset, dynamo=True, external_data=False)
    return feeds, ref


def strip(path):
    """Drops what only documents the export (the dynamo exporter's per-node stack traces and
    scopes, doc strings, intermediate value types): two thirds of these small files."""
    m = onnx.load(path)
    for n in m.graph.node:
        del n.metadata_props[:]
        n.doc_string = ""
    del m.graph.value_info[:]
    onnx.save(m, path)


def save_case(d, model_path, feeds, ref):
    """onnxruntime's outputs as the reference, or PyTorch's where onnxruntime cannot run the
    export (its 1.32 refuses opset 23's RotaryEmbedding with per-token caches)."""
    os.makedirs(os.path.join(d, "test_data_set_0"), exist_ok=True)
    m = onnx.load(model_path)
    feeds = {i.name: feeds[i.name] for i in m.graph.input}  # an exporter may drop an unused input
    for i in m.graph.input:
        dims = i.type.tensor_type.shape.dim
        if any(d.HasField("dim_value") and d.dim_value != n for d, n in zip(dims, feeds[i.name].shape)):
            raise ValueError(f"the export fixed the dims of `{i.name}` at the traced shape")
    try:
        got = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"]).run(None, feeds)
        # A sanity check of the reference, not a tolerance kiln is held to (ModernBERT's
        # padded rows differ by 1e-3 between the two).
        err = np.abs(got[0] - ref).max()
        if not np.allclose(got[0], ref, rtol=1e-2, atol=1e-2):
            # The export does not compute the model at the tested shape (a trace-time
            # constant): no reference for kiln.
            raise ValueError(f"onnxruntime and PyTorch differ by {err:.3g} at the tested shape")
    except ort.capi.onnxruntime_pybind11_state.InvalidArgument as e:
        print(f"  onnxruntime cannot run it ({str(e).split('Status Message: ')[-1][:90]}): PyTorch's output is the reference")
        got = [ref]
    write_data_set(os.path.join(d, "test_data_set_0"), list(feeds.items()), got)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out, only = sys.argv[1], sys.argv[2:]
    for arch in CASES:
        if only and arch not in only:
            continue
        for exporter in EXPORTERS:
            case = f"{arch}_{exporter}"
            # Written into a folder of its own first: a case that fails leaves OUT as it was.
            with tempfile.TemporaryDirectory() as tmp:
                d = os.path.join(tmp, case)
                os.makedirs(d)
                path = os.path.join(d, "model.onnx")
                try:
                    feeds, ref = export(arch, exporter, path)
                    strip(path)
                    onnx.checker.check_model(path)
                    save_case(d, path, feeds, ref)
                except Exception as e:  # an export torch itself cannot write is reported, not a kiln case
                    print(f"{case}: export failed: {str(e).splitlines()[0][:200]}", flush=True)
                    continue
                shutil.copytree(d, os.path.join(out, case), dirs_exist_ok=True)
            print(f"{case}: written", flush=True)

if __name__ == "__main__":
    main()
