#!/usr/bin/env python3
"""Quantizes an f32 text model with onnxruntime's quantization tools, the way their users do,
and prints the op counts of the result:

  qdq          quantize_static, QDQ format (QuantizeLinear/DequantizeLinear around every
               MatMul, Add, Mul, ...; uint8 activations, int8 weights per tensor)
  qdq-channel  the same with int8 activations and int8 weights per output channel
  qoperator    quantize_static, QOperator format (QLinearMatMul and the com.microsoft
               QLinearAdd / QLinearMul / QLinearSoftmax)
  dynamic      quantize_dynamic: int8 weights (reduce_range, see `dynamic`), uint8 activations
               quantized per batch (DynamicQuantizeLinear + MatMulInteger)
  dynamic-ext  that, then saved by an onnxruntime session at its extended level
               (com.microsoft DynamicQuantizeMatMul / MatMulIntegerToFloat, FusedMatMul, Gelu,
               SkipLayerNormalization), as optimum's quantized-and-optimized models are

Static quantization is calibrated on a few real sentences (MiniLM's tokenizer), so the ranges
are those of text, not of random ids.

usage: ort_quantize.py IN.onnx TOKENIZER.json OUT.onnx MODE
"""
import collections
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static
from tokenizers import Tokenizer

SENTENCES = [
    "The cat sat on the mat and looked out of the window.",
    "Compilers turn programs into machine code ahead of time.",
    "A quick brown fox jumps over the lazy dog, twice.",
    "What is the capital of France? Paris, of course.",
    "Neural networks learn representations of their inputs.",
    "It rained all day, so we stayed inside and read books.",
]


class Sentences(CalibrationDataReader):
    def __init__(self, model, tok_path):
        tok = Tokenizer.from_file(tok_path)
        tok.no_padding()
        names = [i.name for i in onnx.load(model, load_external_data=False).graph.input]
        self.feeds = []
        for s in SENTENCES:
            ids = np.array([tok.encode(s).ids], np.int64)
            f = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
            self.feeds.append({k: v for k, v in f.items() if k in names})
        self.it = iter(self.feeds)

    def get_next(self):
        return next(self.it, None)


def dynamic(src, dst):
    # reduce_range (7-bit weights): onnxruntime's u8×s8 kernel on AVX2 without VNNI adds pairs
    # of products in int16 with saturation (VPMADDUBSW, as its quantization docs say), which
    # full-range weights overflow, so its output, the tests' reference, is off there (max abs
    # 1.04e-2 on one sentence on a Zen 3, 2026-12-07, where kiln's two backends agreed; 4.5e-8
    # with reduce_range).
    quantize_dynamic(src, dst, weight_type=QuantType.QInt8, reduce_range=True)


def main():
    src, tok, dst, mode = sys.argv[1:5]
    if mode == "qdq":
        quantize_static(src, dst, Sentences(src, tok), quant_format=QuantFormat.QDQ)
    elif mode == "qdq-channel":
        quantize_static(src, dst, Sentences(src, tok), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    elif mode == "qoperator":
        quantize_static(src, dst, Sentences(src, tok), quant_format=QuantFormat.QOperator)
    elif mode == "dynamic":
        dynamic(src, dst)
    elif mode == "dynamic-ext":
        tmp = dst + ".dynamic.onnx"
        dynamic(src, tmp)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = dst
        ort.InferenceSession(tmp, so, providers=["CPUExecutionProvider"])
        os.remove(tmp)
    else:
        sys.exit(f"unknown mode {mode!r}")
    ops = collections.Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in onnx.load(dst).graph.node)
    print(" ".join(f"{k}={v}" for k, v in sorted(ops.items())))


if __name__ == "__main__":
    main()
