#!/usr/bin/env python3
"""Writes small models of onnxruntime's com.microsoft contrib ops (the ones optimized
transformer exports carry) in the backend-test layout, with onnxruntime's outputs as the
reference: OUT/<case>/model.onnx, test_data_set_0/{input,output}_K.pb.

usage: ort_contrib_cases.py OUT
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from testcase_io import write_data_set

RNG = np.random.default_rng(7)
B, S, H = 2, 7, 16


def rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def write(out, name, nodes, inputs, outputs, inits=()):
    """inputs: [(name, array)] fed at run time; outputs: [(name, elem type, shape)]."""
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(a, n) for n, a in inits],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    d = os.path.join(out, name)
    os.makedirs(os.path.join(d, "test_data_set_0"), exist_ok=True)
    onnx.save(model, os.path.join(d, "model.onnx"))
    sess = ort.InferenceSession(os.path.join(d, "model.onnx"), providers=["CPUExecutionProvider"])
    write_data_set(os.path.join(d, "test_data_set_0"), inputs, sess.run(None, dict(inputs)))


def ms(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, domain="com.microsoft", **attrs)


def main():
    out = sys.argv[1]
    F = TensorProto.FLOAT
    x = rand(B, S, H, scale=2.0)
    bias = rand(H)
    write(out, "bias_gelu", [ms("BiasGelu", ["x", "b"], ["y"])], [("x", x)], [("y", F, [B, S, H])], [("b", bias)])
    write(out, "fast_gelu_bias", [ms("FastGelu", ["x", "b"], ["y"])], [("x", x)], [("y", F, [B, S, H])], [("b", bias)])
    write(out, "fast_gelu", [ms("FastGelu", ["x"], ["y"])], [("x", x)], [("y", F, [B, S, H])])
    write(out, "quick_gelu", [ms("QuickGelu", ["x"], ["y"], alpha=1.5)], [("x", x)], [("y", F, [B, S, H])])
    write(out, "gelu_ms", [ms("Gelu", ["x"], ["y"])], [("x", x)], [("y", F, [B, S, H])])

    q, k = rand(B, 3, S, 8), rand(B, 3, S, 8)
    write(out, "fused_matmul_scaled", [ms("FusedMatMul", ["q", "k"], ["y"], transB=1, alpha=0.35)], [("q", q), ("k", k)], [("y", F, [B, 3, S, S])])
    write(out, "fused_matmul_ta", [ms("FusedMatMul", ["q", "k"], ["y"], transA=1)], [("q", q), ("k", k)], [("y", F, [B, 3, 8, 8])])
    skip = rand(B, S, H)
    g, beta = rand(H) + 1.0, rand(H)
    write(out, "skip_layer_norm", [ms("SkipLayerNormalization", ["x", "s", "g", "beta", "b"], ["y", "", "", "sum"], epsilon=1e-5)],
          [("x", x), ("s", skip)], [("y", F, [B, S, H]), ("sum", F, [B, S, H])], [("g", g), ("beta", beta), ("b", bias)])
    write(out, "skip_layer_norm_plain", [ms("SkipLayerNormalization", ["x", "s", "g"], ["y"])],
          [("x", x), ("s", skip)], [("y", F, [B, S, H])], [("g", g)])
    write(out, "skip_simplified_layer_norm", [ms("SkipSimplifiedLayerNormalization", ["x", "s", "g", "b"], ["y", "", "", "sum"], epsilon=1e-6)],
          [("x", x), ("s", skip)], [("y", F, [B, S, H]), ("sum", F, [B, S, H])], [("g", g), ("b", bias)])
    write(out, "simplified_layer_norm", [helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["y"], axis=-1, epsilon=1e-6)],
          [("x", x)], [("y", F, [B, S, H])], [("g", g)])

    V, P = 50, 20
    ids = RNG.integers(0, V, (B, S)).astype(np.int32)
    seg = RNG.integers(0, 2, (B, S)).astype(np.int32)
    mask = np.ones((B, S), np.int32)
    mask[1, 4:] = 0
    word, pos, segt = rand(V, H), rand(P, H), rand(2, H)
    write(out, "embed_layer_norm",
          [ms("EmbedLayerNormalization", ["ids", "seg", "word", "pos", "segt", "g", "beta", "mask"], ["y", "mask_index"], epsilon=1e-12)],
          [("ids", ids), ("seg", seg), ("mask", mask)], [("y", F, [B, S, H]), ("mask_index", TensorProto.INT32, [B])],
          [("word", word), ("pos", pos), ("segt", segt), ("g", g), ("beta", beta)])
    write(out, "embed_layer_norm_no_segment",
          [ms("EmbedLayerNormalization", ["ids", "", "word", "pos", "", "g", "beta", "mask"], ["y", "mask_index"])],
          [("ids", ids), ("mask", mask)], [("y", F, [B, S, H]), ("mask_index", TensorProto.INT32, [B])],
          [("word", word), ("pos", pos), ("g", g), ("beta", beta)])

    heads = 4
    w, wb = rand(H, 3 * H, scale=0.3), rand(3 * H)
    att = lambda ins, **a: [ms("Attention", ins, ["y"], num_heads=heads, **a)]
    yo = [("y", F, [B, S, H])]
    write(out, "attention_2d_mask", att(["x", "w", "wb", "mask"]), [("x", x), ("mask", mask)], yo, [("w", w), ("wb", wb)])
    write(out, "attention_lengths", att(["x", "w", "wb", "len"]), [("x", x), ("len", np.array([7, 4], np.int32))], yo, [("w", w), ("wb", wb)])
    write(out, "attention_no_mask", att(["x", "w", "wb"]), [("x", x)], yo, [("w", w), ("wb", wb)])
    m3 = np.tril(np.ones((S, S), np.int32))[None].repeat(B, 0)
    write(out, "attention_3d_mask", att(["x", "w", "wb", "m3"]), [("x", x), ("m3", m3)], yo, [("w", w), ("wb", wb)])
    wv = rand(H, 2 * H + 24, scale=0.3)
    write(out, "attention_qkv_sizes", att(["x", "w", "wb"], qkv_hidden_sizes=[H, H, 24], scale=0.2), [("x", x)], [("y", F, [B, S, 24])],
          [("w", wv), ("wb", rand(2 * H + 24))])
    # Causal (a decoder's attention, onnxruntime's optimizer fuses GPT-2's so), with and without padding.
    write(out, "attention_unidirectional", att(["x", "w", "wb", "mask"], unidirectional=1), [("x", x), ("mask", mask)], yo,
          [("w", w), ("wb", wb)])
    write(out, "attention_unidirectional_no_mask", att(["x", "w", "wb"], unidirectional=1), [("x", x)], yo, [("w", w), ("wb", wb)])
    # MultiHeadAttention: Q, K, V apart (K/V longer than Q), a packed bias, padding masks.
    L = 9
    qm, km, vm = rand(B, S, H), rand(B, L, H), rand(B, L, 24)
    kpm = np.ones((B, L), np.int32)
    kpm[0, 6:] = 0
    mha = lambda ins, **a: [ms("MultiHeadAttention", ins, ["y"], num_heads=heads, **a)]
    write(out, "mha_bias_mask", mha(["q", "k", "v", "b", "m"]), [("q", qm), ("k", km), ("v", vm), ("m", kpm)], [("y", F, [B, S, 24])],
          [("b", rand(2 * H + 24))])
    write(out, "mha_lengths", mha(["q", "k", "v", "", "len"], scale=0.3), [("q", qm), ("k", km), ("v", vm), ("len", np.array([9, 5], np.int32))],
          [("y", F, [B, S, 24])])
    # onnxruntime's transformer optimizer chains these: mask_index from EmbedLayerNormalization.
    write(out, "embed_then_attention",
          [ms("EmbedLayerNormalization", ["ids", "seg", "word", "pos", "segt", "g", "beta", "mask"], ["e", "mi"]),
           ms("Attention", ["e", "w", "wb", "mi"], ["a"], num_heads=heads),
           ms("SkipLayerNormalization", ["a", "e", "g", "beta"], ["y"])],
          [("ids", ids), ("seg", seg), ("mask", mask)], yo,
          [("word", word), ("pos", pos), ("segt", segt), ("g", g), ("beta", beta), ("w", w), ("wb", wb)])
    print(f"wrote contrib op cases to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
