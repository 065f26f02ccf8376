#!/usr/bin/env python3
"""Per-op table of `kiln onnx-test` results over onnx's node tests.

Usage: kiln onnx-test --backend cpu target/onnx-node-tests > results.txt
       python3 scripts/onnx_op_table.py target/onnx-node-tests results.txt [--ops Add,Sub,...]

Each test counts for the op types of its model's top-level nodes that it is named after
(`test_<op>...` with the op's name lowercased, with or without underscores between words), so
`test_layer_normalization_*` and `test_reduce_mean_*` land on their ops and expanded variants
(a function body of several nodes) count for the op they test. Prints a Markdown table:
op | tests | pass | fail | unsupported | pass %, and a total line over the listed ops.
"""

import os
import re
import sys

import onnx

# The ops the ONNX issue lists (what kiln claims).
CLAIMED = (
    "Add Sub Mul Div Pow Sqrt Reciprocal Neg Abs Exp Log Erf Tanh Sigmoid Relu Gelu Softmax LogSoftmax MatMul Gemm "
    "LayerNormalization ReduceMean ReduceSum ReduceMax Gather GatherND Shape Size Unsqueeze Squeeze Concat Reshape "
    "Transpose Flatten Slice Split Expand Tile ConstantOfShape Constant Range Cast Where Equal Greater GreaterOrEqual "
    "Less LessOrEqual And Or Not Max Min Clip IsNaN Identity Dropout DequantizeLinear"
).split()


def snake(op):
    return re.sub(r"(?<!^)(?=[A-Z])", "_", op).lower()


# Test names that do not follow the op's name.
ALIASES = {"GreaterOrEqual": "greater_equal", "LessOrEqual": "less_equal"}


def owner(test, ops):
    """The claimed op a test is named after (the longest name that matches), or None."""
    name = test[len("test_"):]
    best = None
    for op in ops:
        for form in {op.lower(), snake(op), ALIASES.get(op, snake(op))}:
            if name == form or name.startswith(form + "_"):
                if best is None or len(form) > len(best[1]):
                    best = (op, form)
    return best[0] if best else None


def main():
    root, results = sys.argv[1], sys.argv[2]
    ops = CLAIMED
    if "--ops" in sys.argv:
        ops = sys.argv[sys.argv.index("--ops") + 1].split(",")
    status = {}
    for line in open(results):
        m = re.match(r"^(pass|FAIL|unsupported)\s+(test_[A-Za-z0-9_]+)", line)
        if m:
            status[m.group(2)] = m.group(1)
    rows = {op: [0, 0, 0] for op in ops}
    for test, st in sorted(status.items()):
        op = owner(test, ops)
        if op is None:
            continue
        path = os.path.join(root, test, "model.onnx")
        if os.path.exists(path):
            types = {n.op_type for n in onnx.load(path, load_external_data=False).graph.node}
            # A test named after the op but not using it (a rare naming clash) does not count.
            if op not in types and len(types) == 1:
                continue
        rows[op][["pass", "FAIL", "unsupported"].index(st)] += 1
    print("| op | tests | pass | fail | unsupported | pass % |")
    print("|---|---|---|---|---|---|")
    tot = [0, 0, 0]
    for op in ops:
        p, f, u = rows[op]
        n = p + f + u
        tot = [a + b for a, b in zip(tot, rows[op])]
        pct = f"{100 * p / n:.0f}" if n else "-"
        print(f"| {op} | {n} | {p} | {f} | {u} | {pct} |")
    n = sum(tot)
    print(f"| **all listed** | {n} | {tot[0]} | {tot[1]} | {tot[2]} | {100 * tot[0] / max(n, 1):.1f} |")


if __name__ == "__main__":
    main()
