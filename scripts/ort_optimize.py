#!/usr/bin/env python3
"""Runs onnxruntime's transformer optimizer (what optimum's O2 level runs) over a BERT-style
ONNX model, so the result carries com.microsoft contrib ops (SkipLayerNormalization, BiasGelu,
and Attention / EmbedLayerNormalization where its patterns match), and prints the op counts.

usage: ort_optimize.py IN.onnx OUT.onnx NUM_HEADS HIDDEN
"""
import builtins
import collections
import sys

import numpy as np
import onnx
from onnxruntime.transformers.optimizer import optimize_model


def main():
    src, dst, heads, hidden = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    # The optimizer's LayerNorm fusion calls float() on a [1]-shaped epsilon, which numpy 2
    # refuses; give that module a float() that takes one-element arrays.
    for name, mod in list(sys.modules.items()):
        if name.endswith("fusion_layernorm"):
            mod.float = lambda x: builtins.float(np.asarray(x).reshape(-1)[0])
    m = optimize_model(src, model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0)
    m.save_model_to_file(dst)
    ops = collections.Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in onnx.load(dst).graph.node)
    print(" ".join(f"{k}={v}" for k, v in sorted(ops.items())))
    if not any(k.startswith("com.microsoft::") for k in ops):
        sys.exit("the optimizer fused nothing into contrib ops")


if __name__ == "__main__":
    main()
