#!/usr/bin/env python3
"""Writes an ONNX backend-test folder for a text model, with onnxruntime as the reference:
OUT/model.onnx (a copy) and OUT/test_data_set_N/{input,output}_K.pb, one data set per batch of
sentences (padded to the longest, attention mask 0 on padding).

usage: ort_testcase.py MODEL.onnx TOKENIZER.json OUT [--unoptimized]

--unoptimized: onnxruntime with its graph optimizations off (ORT_DISABLE_ALL), so it computes
each node as ONNX defines it. Its optimized session fuses QDQ pairs into integer kernels that
round differently (on a statically quantized MiniLM its own optimized and unoptimized outputs
agree only to cosine 0.80).
"""
import os
import shutil
import sys

import numpy as np
import onnx
import onnxruntime as ort
from tokenizers import Tokenizer
from testcase_io import write_data_set

BATCHES = [
    ["The quick brown fox jumps over the lazy dog."],
    ["kiln compiles neural networks ahead of time", "short", "A considerably longer sentence, with punctuation; numbers like 3.14159 and 42."],
]


def main():
    model, tok_path, out = sys.argv[1:4]
    so = ort.SessionOptions()
    if "--unoptimized" in sys.argv[4:]:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    os.makedirs(out, exist_ok=True)
    shutil.copy(model, os.path.join(out, "model.onnx"))
    tok = Tokenizer.from_file(tok_path)
    tok.no_padding()
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    names = [i.name for i in onnx.load(model, load_external_data=False).graph.input]
    for n, batch in enumerate(BATCHES):
        enc = [tok.encode(t) for t in batch]
        seq = max(len(e.ids) for e in enc)
        ids = np.zeros((len(batch), seq), np.int64)
        mask = np.zeros((len(batch), seq), np.int64)
        for r, e in enumerate(enc):
            ids[r, : len(e.ids)] = e.ids
            mask[r, : len(e.ids)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        feeds = {k: v for k, v in feeds.items() if k in names}
        outs = sess.run(None, feeds)
        write_data_set(os.path.join(out, f"test_data_set_{n}"), [(k, feeds[k]) for k in names], outs)
    print(f"wrote {out} ({len(BATCHES)} data sets, onnxruntime {ort.__version__})")


if __name__ == "__main__":
    main()
