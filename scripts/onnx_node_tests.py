#!/usr/bin/env python3
"""Writes onnx's own node conformance tests (the Python cases shipped in the `onnx` PyPI
package) in the backend-test layout: OUT/<test>/model.onnx, test_data_set_N/{input,output}_K.pb.

usage: onnx_node_tests.py OUT [PATTERN]   (PATTERN: a substring of the test names to keep)
"""
import os
import sys

import onnx
from onnx import numpy_helper
from onnx.backend.test.case import node


def main():
    out = sys.argv[1]
    pattern = sys.argv[2] if len(sys.argv) > 2 else ""
    n = skipped = 0
    for case in node.collect_testcases(None):
        if pattern not in case.name:
            continue
        # Every input and output as a TensorProto, or the case is skipped (sequences, optionals,
        # maps and element types numpy_helper cannot write are not tensor tests).
        sets = []
        try:
            for inputs, outputs in case.data_sets or []:
                sets.append(([numpy_helper.from_array(a, vi.name) for vi, a in zip(case.model.graph.input, inputs)],
                             [numpy_helper.from_array(a, vi.name) for vi, a in zip(case.model.graph.output, outputs)]))
        except Exception:
            skipped += 1
            continue
        if not sets:
            skipped += 1
            continue
        d = os.path.join(out, case.name)
        os.makedirs(d, exist_ok=True)
        onnx.save(case.model, os.path.join(d, "model.onnx"))
        for i, (ins, outs) in enumerate(sets):
            sd = os.path.join(d, f"test_data_set_{i}")
            os.makedirs(sd, exist_ok=True)
            for prefix, ts in (("input", ins), ("output", outs)):
                for k, t in enumerate(ts):
                    with open(os.path.join(sd, f"{prefix}_{k}.pb"), "wb") as f:
                        f.write(t.SerializeToString())
        n += 1
    print(f"wrote {n} node tests (onnx {onnx.__version__}) to {out}; skipped {skipped} without tensor data")


if __name__ == "__main__":
    main()
