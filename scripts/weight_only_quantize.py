#!/usr/bin/env python3
"""Weight-only 4-bit quantization of every MatMul whose right operand is an f32 initializer
[K, N], round to nearest per block of 32 along K (what onnxruntime's MatMulNBits quantizer and
the GenAI builders do), written in one of the forms those tools emit:

  nbits      com.microsoft MatMulNBits, uint4 with a zero point per block (packed two to a byte)
  nbits-sym  MatMulNBits, symmetric: no zero points (the op's default 8)
  qdq-int4   opset 21 DequantizeLinear of an int4 weight with `block_size` (scales and int4
             zero points per block), then the MatMul
  q4-gather  nbits, and the embedding tables of the Gathers as com.microsoft
             GatherBlockQuantized (transformers.js q4 exports): the largest as uint8 packed two
             to a byte with packed zero points, the others as int4 without zero points, blocks
             of 32 along the hidden axis
  bnb4-nf4   com.microsoft MatMulBnb4 (bitsandbytes NF4, blocks of 64), by onnxruntime's own
  bnb4-fp4   MatMulBnb4Quantizer (its C++ quantizer; no onnx_ir needed); FP4 likewise

The quantizer is numpy here so the test needs nothing beyond onnx and onnxruntime (their own
quantizer wants the onnx_ir package).

usage: weight_only_quantize.py IN.onnx OUT.onnx MODE
"""
import collections
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

BLOCK = 32


def pack4(values):
    """Unsigned 4-bit values (any shape) packed two to a byte, the first in the low nibble."""
    v = np.asarray(values, np.uint8).reshape(-1)
    if v.size % 2:
        v = np.append(v, 0)
    return (v[0::2] | (v[1::2] << 4)).astype(np.uint8)


def quantize(w, symmetric):
    """w [K, N] -> q [N, blocks, BLOCK] uint4 values, scales [N, blocks], zeros [N, blocks]."""
    k, n = w.shape
    blocks = -(-k // BLOCK)
    wt = np.zeros((n, blocks * BLOCK), np.float32)
    wt[:, :k] = w.T
    wb = wt.reshape(n, blocks, BLOCK)
    if symmetric:
        amax = np.abs(wb).max(axis=2)
        scale = np.where(amax > 0, amax / 7.0, 1.0).astype(np.float32)
        zero = np.full((n, blocks), 8, np.int32)
    else:
        lo, hi = np.minimum(wb.min(axis=2), 0), np.maximum(wb.max(axis=2), 0)
        scale = np.where(hi > lo, (hi - lo) / 15.0, 1.0).astype(np.float32)
        zero = np.clip(np.round(-lo / scale), 0, 15).astype(np.int32)
    q = np.clip(np.round(wb / scale[:, :, None]) + zero[:, :, None], 0, 15).astype(np.uint8)
    return q, scale, zero, k, n, blocks


def gather_block_quantized(g, node, table, biggest):
    """The Gather `node` of the f32 table [V, H] as GatherBlockQuantized (see the usage)."""
    v, h = table.shape
    blocks = h // BLOCK
    q, scale, zero, _, _, _ = quantize(table.T, symmetric=not biggest)
    # quantize() works on [K, N] along K: table.T is [H, V], so q is [V, blocks, BLOCK].
    q = q.reshape(v, h)
    name = node.input[0]
    ins = [name + "_gq", node.input[1], name + "_gscale"]
    if biggest:
        g.initializer.append(helper.make_tensor(name + "_gq", TensorProto.UINT8, [v, h // 2], pack4(q).tobytes(), raw=True))
        zrow = np.stack([pack4(z) for z in zero])
        g.initializer.append(helper.make_tensor(name + "_gzero", TensorProto.UINT8, list(zrow.shape), zrow.tobytes(), raw=True))
        ins.append(name + "_gzero")
    else:
        s4 = (q.astype(np.int16) - 8) & 0xF
        g.initializer.append(helper.make_tensor(name + "_gq", TensorProto.INT4, [v, h], pack4(s4).tobytes(), raw=True))
    g.initializer.append(numpy_helper.from_array(scale.astype(np.float32), name + "_gscale"))
    return helper.make_node("GatherBlockQuantized", ins, list(node.output), name=node.name, domain="com.microsoft",
                            gather_axis=0, quantize_axis=1, block_size=BLOCK, bits=4)


def main():
    src, dst, mode = sys.argv[1:4]
    m = onnx.load(src)
    if mode.startswith("bnb4-"):
        from onnxruntime.quantization.matmul_bnb4_quantizer import MatMulBnb4Quantizer

        q = MatMulBnb4Quantizer(m, MatMulBnb4Quantizer.NF4 if mode == "bnb4-nf4" else MatMulBnb4Quantizer.FP4, 64)
        q.process()
        onnx.save(q.model.model, dst)
        ops = collections.Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in onnx.load(dst).graph.node)
        print(" ".join(f"{k}={v}" for k, v in sorted(ops.items())))
        return
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    nodes, drop = [], set()
    tables = {n.input[0]: numpy_helper.to_array(inits[n.input[0]]) for n in g.node
              if n.op_type == "Gather" and n.input[0] in inits and len(inits[n.input[0]].dims) == 2}
    tables = {k: t for k, t in tables.items() if t.dtype == np.float32 and t.shape[1] % BLOCK == 0}
    biggest = max(tables, key=lambda k: tables[k].size, default=None)
    for node in g.node:
        if mode == "q4-gather" and node.op_type == "Gather" and node.input[0] in tables:
            nodes.append(gather_block_quantized(g, node, tables[node.input[0]], node.input[0] == biggest))
            drop.add(node.input[0])
            continue
        w = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if w is None or w.data_type != TensorProto.FLOAT or len(w.dims) != 2:
            nodes.append(node)
            continue
        q, scale, zero, k, n, blocks = quantize(numpy_helper.to_array(w), mode == "nbits-sym")
        name = node.input[1]
        drop.add(name)
        if mode in ("nbits", "nbits-sym", "q4-gather"):
            ins = [node.input[0], name + "_q4", name + "_scales"]
            g.initializer.append(helper.make_tensor(name + "_q4", TensorProto.UINT8, [n, blocks, BLOCK // 2], pack4(q).tobytes(), raw=True))
            g.initializer.append(numpy_helper.from_array(scale.reshape(-1), name + "_scales"))
            if mode != "nbits-sym":
                ins.append(name + "_zeros")
                zrow = np.stack([pack4(z) for z in zero])
                g.initializer.append(helper.make_tensor(name + "_zeros", TensorProto.UINT8, [zrow.size], zrow.tobytes(), raw=True))
            nodes.append(helper.make_node("MatMulNBits", ins, list(node.output), name=node.name, domain="com.microsoft",
                                          K=k, N=n, bits=4, block_size=BLOCK))
        elif mode == "qdq-int4":
            # int4 values are q - 8, stored [K, N]; blocks along axis 0.
            qk = (q.reshape(n, blocks * BLOCK)[:, :k].T.astype(np.int16) - 8)
            zk = (zero.T.astype(np.int16) - 8)
            g.initializer.append(helper.make_tensor(name + "_i4", TensorProto.INT4, [k, n], pack4(qk & 0xF).tobytes(), raw=True))
            g.initializer.append(numpy_helper.from_array(scale.T.copy(), name + "_scale"))
            g.initializer.append(helper.make_tensor(name + "_zp", TensorProto.INT4, [blocks, n], pack4(zk & 0xF).tobytes(), raw=True))
            nodes.append(helper.make_node("DequantizeLinear", [name + "_i4", name + "_scale", name + "_zp"], [name + "_dq"],
                                          name=name + "_dq", axis=0, block_size=BLOCK))
            nodes.append(helper.make_node("MatMul", [node.input[0], name + "_dq"], list(node.output), name=node.name))
        else:
            sys.exit(f"unknown mode {mode!r}")
    del g.node[:]
    g.node.extend(nodes)
    keep = [t for t in g.initializer if t.name not in drop]
    del g.initializer[:]
    g.initializer.extend(keep)
    if mode == "qdq-int4":
        for o in m.opset_import:
            if o.domain in ("", "ai.onnx"):
                o.version = max(o.version, 21)
    elif not any(o.domain == "com.microsoft" for o in m.opset_import):
        m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(m, dst)
    ops = collections.Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in onnx.load(dst).graph.node)
    print(" ".join(f"{k}={v}" for k, v in sorted(ops.items())))


if __name__ == "__main__":
    main()
