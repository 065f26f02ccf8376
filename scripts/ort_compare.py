#!/usr/bin/env python3
"""kiln vs onnxruntime on all-MiniLM-L6-v2, same machine, same run, same thread count.

Builds the model for onnxruntime from the same model.safetensors with the onnx helper API
(embeddings, 6 encoder layers with erf GELU, mean pooling, L2 normalization: what kiln's BERT
front end builds), checks its embeddings against tests/data/minilm/golden.json, then for each
bucket times onnxruntime (intra-op threads = --threads, all graph optimizations) and
`kiln bench --backend cpu --threads N`, alternating bucket by bucket for --rounds rounds, and
prints per bucket the best median of each side and the ratio kiln/ORT (best-of-rounds keeps
the comparison meaningful on a machine shared with other work), and the median over the rounds
of each round's own ratio (the two sides of a round run seconds apart; the best medians may come
from different minutes of a shared host).

Usage: python3 scripts/ort_compare.py [--model DIR | --onnx FILE] [--buckets 1x16,1x128,...]
                                      [--threads 2] [--runs 30] [--rounds 3] [--kiln target/release/kiln]
       python3 scripts/ort_compare.py --write-onnx PATH [--legacy | --attention-op]   (only write the graph)

With --isa avx2 both sides run as on an AVX2-only machine: scripts/cpuid_no_avx512.c (built into
target/) hides AVX-512 from CPUID in this process before onnxruntime loads and, as LD_PRELOAD, in
each `kiln bench`, so MLAS and kiln both pick their AVX2 kernels (needs Linux CPUID faulting).

With --onnx FILE both sides run that file: onnxruntime loads it, kiln imports it
(`kiln bench --onnx FILE`); the inputs are the model's own (ids, an all-ones mask, zero token types).

onnx, onnxruntime and numpy are installed on first use into target/ort-venv (pip), and the
script re-runs itself there.
"""

import argparse
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, "target", "ort-venv")


def ensure_deps():
    import importlib.util

    # find_spec, not import: onnxruntime must load after the CPUID shim's count is taken (main)
    if all(importlib.util.find_spec(m) for m in ("numpy", "onnx", "onnxruntime")):
        return
    py = os.path.join(VENV, "bin", "python")
    if os.path.abspath(sys.executable) == os.path.abspath(py):
        sys.exit("onnx/onnxruntime/numpy still missing inside " + VENV)
    if not os.path.exists(py):
        print(f"creating {VENV} with onnx, onnxruntime, numpy", file=sys.stderr)
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
    subprocess.check_call([py, "-m", "pip", "install", "-q", "onnx", "onnxruntime", "numpy"])
    os.execv(py, [py] + sys.argv)


def hide_avx512():
    """Load the CPUID shim into this process (before onnxruntime); returns (library, .so path)."""
    import ctypes

    src = os.path.join(ROOT, "scripts", "cpuid_no_avx512.c")
    so = os.path.join(ROOT, "target", "cpuid_no_avx512.so")
    if not os.path.exists(so) or os.path.getmtime(so) < os.path.getmtime(src):
        os.makedirs(os.path.dirname(so), exist_ok=True)
        try:
            subprocess.check_call(["cc", "-O2", "-shared", "-fPIC", "-o", so, src])
        except (OSError, subprocess.CalledProcessError) as e:
            sys.exit(f"--isa avx2: building {so} from {src} with cc failed: {e}")
    return ctypes.CDLL(so), so


def read_safetensors(path):
    import numpy as np

    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    dtypes = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        arr = np.frombuffer(data[base + a : base + b], dtype=dtypes[info["dtype"]]).reshape(info["shape"])
        out[name] = arr.astype(np.float32) if arr.dtype != np.int64 else arr
    return out


def build_model(model_dir, legacy=False, attention_op=False):
    """MiniLM as an ONNX graph. `legacy`: as exporters wrote it before opset 17 (opset 14,
    LayerNorm written out as ReduceMean / Sub / Pow / ReduceMean / Add / Sqrt / Div / Mul / Add).
    `attention_op`: opset 23, each layer's attention one standard `Attention` node over 3-D Q, K, V
    with the additive mask expanded to [B, 1, S, S] (as PyTorch's exporter writes
    scaled_dot_product_attention from opset 23; onnxruntime wants the mask's query dim)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    w = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    prefix = "" if "embeddings.word_embeddings.weight" in w else "bert."
    g = lambda name: w[prefix + name]  # noqa: E731
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    hd = h // heads
    eps = cfg.get("layer_norm_eps", 1e-12)
    nodes, inits = [], []

    def init(name, arr):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    counter = [0]

    def node(op, ins, **attrs):
        counter[0] += 1
        out = f"{op.lower()}_{counter[0]}"
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    def const(name, v, dtype=np.float32):
        return init(name, np.array(v, dtype=dtype))

    def layer_norm(x, pfx):
        gamma, beta = init(pfx + ".weight", g(pfx + ".weight")), init(pfx + ".bias", g(pfx + ".bias"))
        if not legacy:
            return node("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=eps)
        m = node("ReduceMean", [x], axes=[-1], keepdims=1)
        d = node("Sub", [x, m])
        v = node("ReduceMean", [node("Pow", [d, const(pfx + ".two", 2.0)])], axes=[-1], keepdims=1)
        n = node("Div", [d, node("Sqrt", [node("Add", [v, const(pfx + ".eps", eps)])])])
        return node("Add", [node("Mul", [n, gamma]), beta])

    def linear(x, pfx):
        wt = init(pfx + ".weight.T", g(pfx + ".weight").T)
        y = node("MatMul", [x, wt])
        return node("Add", [y, init(pfx + ".bias", g(pfx + ".bias"))])

    ids, mask, tt = "input_ids", "attention_mask", "token_type_ids"
    # Embeddings.
    we = node("Gather", [init("word", g("embeddings.word_embeddings.weight")), ids], axis=0)
    te = node("Gather", [init("type", g("embeddings.token_type_embeddings.weight")), tt], axis=0)
    # Absolute positions 0..seq: the first `seq` rows of the position table.
    seq = node("Slice", [node("Shape", [ids]), const("s1", [1], np.int64), const("s2", [2], np.int64)])
    pe = node("Slice", [init("pos", g("embeddings.position_embeddings.weight")), const("s0", [0], np.int64), seq, const("ax0", [0], np.int64)])
    x = node("Add", [node("Add", [we, te]), pe])
    x = layer_norm(x, "embeddings.LayerNorm")
    # Additive mask [B, 1, 1, S]: (1 - mask) * -10000.
    mf = node("Cast", [mask], to=TensorProto.FLOAT)
    madd = node("Mul", [node("Sub", [const("onef", 1.0), mf]), const("neg", -10000.0)])
    madd = node("Unsqueeze", [madd, const("axes12", [1, 2], np.int64)])
    if attention_op:
        # [B, 1, 1, S] expanded to [B, 1, S, S] by the shape of the ids.
        sh = node("Shape", [ids])
        bdim = node("Slice", [sh, const("b0", [0], np.int64), const("b1", [1], np.int64)])
        mask4 = node("Expand", [madd, node("Concat", [bdim, const("bone", [1], np.int64), seq, seq], axis=0)])
    if not attention_op:
        split_shape = const("split_shape", [0, 0, heads, hd], np.int64)
        merge_shape = const("merge_shape", [0, 0, h], np.int64)
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q = linear(x, p + "attention.self.query")
        k = linear(x, p + "attention.self.key")
        v = linear(x, p + "attention.self.value")
        if attention_op:
            ctx = node("Attention", [q, k, v, mask4], q_num_heads=heads, kv_num_heads=heads)
        else:
            q = node("Transpose", [node("Reshape", [q, split_shape])], perm=[0, 2, 1, 3])
            k = node("Transpose", [node("Reshape", [k, split_shape])], perm=[0, 2, 3, 1])
            v = node("Transpose", [node("Reshape", [v, split_shape])], perm=[0, 2, 1, 3])
            s = node("Add", [node("Div", [node("MatMul", [q, k]), const(f"sqrt{i}", np.sqrt(hd))]), madd])
            pr = node("Softmax", [s], axis=-1)
            ctx = node("Reshape", [node("Transpose", [node("MatMul", [pr, v])], perm=[0, 2, 1, 3]), merge_shape])
        a = linear(ctx, p + "attention.output.dense")
        x = layer_norm(node("Add", [a, x]), p + "attention.output.LayerNorm")
        f = linear(x, p + "intermediate.dense")
        f = node("Mul", [node("Mul", [f, const(f"half{i}", 0.5)]), node("Add", [node("Erf", [node("Div", [f, const(f"sqrt2_{i}", np.sqrt(2.0))])]), const(f"one{i}", 1.0)])])
        o = linear(f, p + "output.dense")
        x = layer_norm(node("Add", [o, x]), p + "output.LayerNorm")
    # Mean pooling over the mask, then L2 normalization.
    m3 = node("Unsqueeze", [mf, const("axis2", [2], np.int64)])
    summed = node("ReduceSum", [node("Mul", [x, m3]), const("axis1", [1], np.int64)], keepdims=0)
    count = node("Max", [node("ReduceSum", [m3, const("axis1b", [1], np.int64)], keepdims=0), const("tiny", 1e-9)])
    mean = node("Div", [summed, count])
    norm = node("Max", [node("Sqrt", [node("ReduceSum", [node("Mul", [mean, mean]), const("axisl", [1], np.int64)], keepdims=1)]), const("tiny2", 1e-12)])
    emb = node("Div", [mean, norm])
    nodes.append(helper.make_node("Identity", [emb], ["embeddings"]))
    dims = ["batch", "seq"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, dims) for n in (ids, mask, tt)]
    outputs = [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", h])]
    graph = helper.make_graph(nodes, "minilm", inputs, outputs, inits)
    opset = 23 if attention_op else 14 if legacy else 17
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if attention_op else 8
    onnx.checker.check_model(model)
    return model


def session(model, threads):
    """A session over an onnx ModelProto or a file path."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    src = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def feeds(batch, seq):
    import numpy as np

    ids = np.array([[101 if t == 0 else 1000 + (r * 7919 + t * 104729) % 20000 for t in range(seq)] for r in range(batch)], dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def check_golden(sess):
    import numpy as np

    path = os.path.join(ROOT, "tests", "data", "minilm", "golden.json")
    if not os.path.exists(path):
        return None
    gd = json.load(open(path))
    pb = gd["padded_batch"]
    ids = np.array(pb["ids"], dtype=np.int64)
    mask = np.array(pb["attention_mask"], dtype=np.int64)
    got = sess.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
    want = np.array(pb["embeddings"], dtype=np.float64)
    return float(np.abs(got - want).max())


def time_ort(sess, batch, seq, runs):
    names = {i.name for i in sess.get_inputs()}
    f = {k: v for k, v in feeds(batch, seq).items() if k in names}
    t0 = time.perf_counter()
    n = 0
    while n < 3 or (time.perf_counter() - t0 < 0.5 and n < 50):
        sess.run(None, f)
        n += 1
    ms = []
    for _ in range(runs):
        t = time.perf_counter()
        sess.run(None, f)
        ms.append((time.perf_counter() - t) * 1e3)
    ms.sort()
    return ms[len(ms) // 2]


def time_kiln(kiln, source, bucket, threads, runs, preload=None):
    cmd = [kiln, "bench", *source, "--bucket", bucket, "--backend", "cpu", "--threads", str(threads), "--runs", str(runs)]
    env = dict(os.environ, LD_PRELOAD=preload) if preload else None
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    if preload and "ymm FMA loop" not in out:
        sys.exit("kiln did not take its AVX2 path under the CPUID shim:\n" + out)
    med = re.search(r"median ([0-9.]+) ms", out)
    low = re.search(r"lowering ([0-9.]+) ms", out)
    if not med:
        sys.exit("kiln bench printed no median:\n" + out)
    return float(med.group(1)), float(low.group(1)) if low else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.environ.get("KILN_MODEL_DIR", os.path.join(ROOT, "models", "all-MiniLM-L6-v2")))
    ap.add_argument("--buckets", default="1x16,1x128,8x128,32x128,1x512")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--kiln", default=os.path.join(ROOT, "target", "release", "kiln"))
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best median of each side is kept")
    ap.add_argument("--onnx", help="time this ONNX file on both sides instead of the model kiln builds")
    ap.add_argument("--write-onnx", metavar="PATH", help="only write the ONNX graph built from --model to PATH")
    ap.add_argument("--legacy", action="store_true", help="build it as exporters before opset 17 did (LayerNorm written out)")
    ap.add_argument("--attention-op", action="store_true", help="build it at opset 23 with each attention one standard Attention node")
    ap.add_argument("--isa", choices=["native", "avx2"], default="native",
                    help="avx2: hide AVX-512 from CPUID on both sides (an AVX2-only machine on this one)")
    args = ap.parse_args()
    shim, preload = hide_avx512() if args.isa == "avx2" else (None, None)
    ensure_deps()
    if args.write_onnx:
        import onnx

        onnx.save(build_model(args.model, args.legacy, args.attention_op), args.write_onnx)
        return
    if not os.path.exists(args.kiln):
        subprocess.check_call(["cargo", "build", "--release", "--bin", "kiln"], cwd=ROOT)
    import numpy  # noqa: F401  (loaded first: its own CPUIDs are not onnxruntime's)

    traps = shim.kiln_cpuid_traps() if shim else 0
    import onnxruntime as ort

    if shim:
        n = shim.kiln_cpuid_traps() - traps
        if n == 0:
            sys.exit("onnxruntime ran no CPUID under the shim: cannot tell which kernels it chose")
        print(f"ISA: AVX-512 hidden from CPUID on both sides ({n} CPUIDs answered while onnxruntime loaded; each kiln run is checked for its ymm path)")
    if args.onnx:
        sess = session(os.path.abspath(args.onnx), args.threads)
        source = ["--onnx", os.path.abspath(args.onnx)]
        print(f"onnxruntime {ort.__version__}, {args.threads} thread(s); both sides run {args.onnx}")
    else:
        sess = session(build_model(args.model, args.legacy, args.attention_op), args.threads)
        source = ["--model", args.model]
        err = check_golden(sess)
        print(f"onnxruntime {ort.__version__}, {args.threads} thread(s); ORT model vs golden embeddings: max abs diff {err}")
    print(f"{'bucket':>8} {'kiln ms':>10} {'ORT ms':>10} {'kiln/ORT':>9} {'paired':>7} {'kiln lowering ms':>17}   (best median of {args.rounds} alternating rounds; paired: median of the rounds' own ratios)")
    for b in args.buckets.split(","):
        batch, seq = (int(x) for x in b.split("x"))
        best_ort, best_kiln, low = float("inf"), float("inf"), float("nan")
        ratios = []
        for _ in range(max(1, args.rounds)):
            o = time_ort(sess, batch, seq, args.runs)
            k, low = time_kiln(args.kiln, source, b, args.threads, args.runs, preload)
            best_ort, best_kiln = min(best_ort, o), min(best_kiln, k)
            ratios.append(k / o)
        paired = statistics.median(ratios)
        print(f"{b:>8} {best_kiln:10.3f} {best_ort:10.3f} {best_kiln / best_ort:9.3f} {paired:7.3f} {low:17.1f}", flush=True)

if __name__ == "__main__":
    main()
