"""The backend-test layout's data sets, written once for every script that makes test cases:
DIR/input_K.pb (named tensors, in the model's input order) and DIR/output_K.pb."""
import os

from onnx import numpy_helper


def write_data_set(d, inputs, outputs):
    """inputs: (name, array) pairs in the model's input order; outputs: arrays in its output order."""
    os.makedirs(d, exist_ok=True)
    for k, (n, a) in enumerate(inputs):
        with open(os.path.join(d, f"input_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(a, n).SerializeToString())
    for k, a in enumerate(outputs):
        with open(os.path.join(d, f"output_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(a).SerializeToString())
