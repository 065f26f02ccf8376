#!/usr/bin/env python3
"""Writes small models of what a text encoder export does not carry, in the backend-test layout,
with onnxruntime's outputs as the reference (OUT/<case>/model.onnx,
test_data_set_0/{input,output}_K.pb): the window, channel-norm and resize ops of vision exports
(a ResNet stem and block, MobileNet's depthwise and grouped convolutions, a decoder with
transposed convolutions and resizes, 1-D and 3-D convolutions, a ViT patch embedding), and a
decoder-style rotary embedding whose angles come from a run-time `position_ids` input (Sin and
Cos of run-time values), stacked recurrent layers (LSTM, GRU, RNN) over rows of different
lengths, DFT / STFT, and convolution blocks quantized dynamically (ConvInteger) and statically
(QLinearConv).

Weights are initializers (most above kiln's 64-element weight threshold, so they take the
path real models take: rearranged at import into weights of their own).

usage: ort_model_cases.py OUT
       ort_model_cases.py --resnet18 FILE [THREADS]   writes ResNet-18 (random weights,
           1x3x224x224, opset 17) and prints onnxruntime's median time on it; time kiln with
           `kiln bench --onnx FILE --bucket 1x1`
       ort_model_cases.py --mobilenetv2 FILE [THREADS]   the same for MobileNetV2 1.0
"""
import os
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from testcase_io import write_data_set

RNG = np.random.default_rng(11)
F = TensorProto.FLOAT


def rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


class Model:
    def __init__(self):
        self.nodes, self.inits, self.k = [], [], 0

    def init(self, a):
        self.k += 1
        name = f"w{self.k}"
        self.inits.append(numpy_helper.from_array(np.asarray(a), name))
        return name

    def op(self, op, ins, **attrs):
        self.k += 1
        out = f"t{self.k}"
        self.nodes.append(helper.make_node(op, ins, [out], name=f"n{self.k}_{op}", **attrs))
        return out

    def conv(self, x, cin, cout, k, group=1, bias=True, **attrs):
        ks = k if isinstance(k, tuple) else (k, k)
        w = self.init(rand(cout, cin // group, *ks, scale=(2.0 / (cin // group * np.prod(ks))) ** 0.5))
        ins = [x, w] + ([self.init(rand(cout, scale=0.1))] if bias else [])
        return self.op("Conv", ins, group=group, **attrs)

    def bn(self, x, c):
        p = [rand(c, scale=0.2) + 1.0, rand(c, scale=0.1), rand(c, scale=0.1), np.abs(rand(c)) + 0.5]
        return self.op("BatchNormalization", [x] + [self.init(a) for a in p], epsilon=1e-5)


def write(out, name, m, x, y, opset=21):
    """x: the input array, or {name: array} for several."""
    feeds = x if isinstance(x, dict) else {"x": x}
    graph = helper.make_graph(
        m.nodes,
        name,
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()],
        [helper.make_tensor_value_info(y, F, [])],
        m.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    model.graph.output[0].type.tensor_type.ClearField("shape")
    save_case(out, name, model, feeds)


def save_case(out, name, model, feeds):
    """`model` (a ModelProto) and onnxruntime's outputs on `feeds` as OUT/<name>."""
    d = os.path.join(out, name)
    os.makedirs(os.path.join(d, "test_data_set_0"), exist_ok=True)
    onnx.save(model, os.path.join(d, "model.onnx"))
    sess = ort.InferenceSession(os.path.join(d, "model.onnx"), providers=["CPUExecutionProvider"])
    write_data_set(os.path.join(d, "test_data_set_0"), list(feeds.items()), sess.run(None, feeds))


def resnet(out):
    m = Model()
    t = m.conv("x", 3, 16, 7, strides=[2, 2], pads=[3, 3, 3, 3])
    t = m.op("Relu", [m.bn(t, 16)])
    t = m.op("MaxPool", [t], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    r = m.op("Relu", [m.bn(m.conv(t, 16, 16, 3, pads=[1, 1, 1, 1], bias=False), 16)])
    r = m.bn(m.conv(r, 16, 16, 3, pads=[1, 1, 1, 1], bias=False), 16)
    t = m.op("Relu", [m.op("Add", [t, r])])
    t = m.conv(t, 16, 32, 1, strides=[2, 2])
    t = m.op("Flatten", [m.op("GlobalAveragePool", [t])])
    t = m.op("Gemm", [t, m.init(rand(10, 32, scale=0.2)), m.init(rand(10))], transB=1)
    write(out, "resnet_block", m, rand(2, 3, 32, 32), t)


def mobilenet(out):
    m = Model()
    t = m.conv("x", 8, 8, 3, group=8, strides=[2, 2], auto_pad="SAME_UPPER")
    t = m.op("Clip", [t, m.init(np.float32(0)), m.init(np.float32(6))])
    t = m.conv(t, 8, 24, 1)
    t = m.conv(t, 24, 24, 3, group=4, pads=[2, 2, 2, 2], dilations=[2, 2])
    t = m.op("HardSwish", [t])
    t = m.op("AveragePool", [t], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)
    t = m.op("GlobalMaxPool", [t])
    write(out, "mobilenet_block", m, rand(1, 8, 21, 19), t)


def decoder(out):
    m = Model()
    t = m.op("ConvTranspose", ["x", m.init(rand(16, 8, 4, 4, scale=0.2)), m.init(rand(8))], strides=[2, 2], pads=[1, 1, 1, 1])
    t = m.op("Relu", [t])
    t = m.op("ConvTranspose", [t, m.init(rand(8, 4, 3, 3, scale=0.3))], group=2, strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])
    t = m.op("Resize", [t, "", m.init(np.array([1, 1, 1.5, 1.5], np.float32))], mode="linear")
    t = m.op("Resize", [t, "", "", m.init(np.array([1, 8, 40, 50], np.int64))], mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    t = m.op("Resize", [t, "", m.init(np.array([0.5, 0.75], np.float32))], mode="cubic", axes=[2, 3])
    t = m.conv(t, 8, 6, 1)
    t = m.op("InstanceNormalization", [t, m.init(rand(6) + 1.0), m.init(rand(6))])
    write(out, "decoder", m, rand(1, 16, 5, 6), t)


def conv1d(out):
    m = Model()
    w = m.init(rand(8, 4, 5, scale=0.3))
    t = m.op("Conv", ["x", w, m.init(rand(8))], dilations=[2], pads=[4, 4])
    t = m.op("GroupNormalization", [t, m.init(rand(8) + 1.0), m.init(rand(8))], num_groups=2)
    t = m.op("Conv", [t, m.init(rand(8, 2, 3, scale=0.3))], group=4, strides=[3], pads=[1, 0])
    t = m.op("LpPool", [t], kernel_shape=[3], p=3)
    write(out, "conv1d", m, rand(2, 4, 50), t)


def conv3d(out):
    m = Model()
    t = m.op("Conv", ["x", m.init(rand(4, 2, 3, 3, 3, scale=0.3)), m.init(rand(4))], pads=[1, 1, 1, 1, 1, 1])
    t = m.op("MaxPool", [t], kernel_shape=[2, 2, 2], strides=[2, 2, 2])
    t = m.op("AveragePool", [t], kernel_shape=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1], count_include_pad=1)
    write(out, "conv3d", m, rand(1, 2, 6, 7, 8), t)


def vit_patch(out):
    m = Model()
    t = m.conv("x", 3, 32, 16, strides=[16, 16])
    t = m.op("Reshape", [t, m.init(np.array([2, 32, 16], np.int64))])
    t = m.op("Transpose", [t], perm=[0, 2, 1])
    t = m.op("LayerNormalization", [t, m.init(rand(32) + 1.0), m.init(rand(32))], axis=-1)
    write(out, "vit_patch_embed", m, rand(2, 3, 64, 64), t)


def pixel_shuffle(out):
    m = Model()
    t = m.op("SpaceToDepth", ["x"], blocksize=2)
    t = m.conv(t, 12, 12, 3, pads=[1, 1, 1, 1])
    t = m.op("LRN", [t], size=5, alpha=1e-3, beta=0.75, bias=1.0)
    t = m.op("DepthToSpace", [t], blocksize=2, mode="CRD")
    write(out, "pixel_shuffle", m, rand(1, 3, 12, 10), t)


def rotary_positions(out):
    """Rotate-half rotary embedding (LLaMA/Qwen exports) at positions given as an input:
    angles = position_ids · inv_freq, then Cos / Sin of a run-time value."""
    b, s, h, d = 2, 9, 2, 16
    m = Model()
    inv = m.init((10000.0 ** (-np.arange(0, d, 2) / d)).astype(np.float32))
    p = m.op("Cast", ["position_ids"], to=F)
    p = m.op("Unsqueeze", [p, m.init(np.array([-1], np.int64))])
    ang = m.op("Mul", [p, inv])
    emb = m.op("Concat", [ang, ang], axis=-1)
    cos = m.op("Unsqueeze", [m.op("Cos", [emb]), m.init(np.array([1], np.int64))])
    sin = m.op("Unsqueeze", [m.op("Sin", [emb]), m.init(np.array([1], np.int64))])
    x1 = m.op("Slice", ["x", m.init(np.array([0], np.int64)), m.init(np.array([d // 2], np.int64)), m.init(np.array([3], np.int64))])
    x2 = m.op("Slice", ["x", m.init(np.array([d // 2], np.int64)), m.init(np.array([d], np.int64)), m.init(np.array([3], np.int64))])
    rot = m.op("Concat", [m.op("Neg", [x2]), x1], axis=-1)
    y = m.op("Add", [m.op("Mul", ["x", cos]), m.op("Mul", [rot, sin])])
    pos = np.stack([np.arange(s) + 3, np.arange(s) * 700 + 11]).astype(np.int64)
    write(out, "rotary_runtime_positions", m, {"x": rand(b, h, s, d), "position_ids": pos}, y)


def save_and_time(m, t, name, path, threads):
    """Saves the 1x3x224x224 → [1, 1000] classifier `m` (output `t`) to `path` and prints
    onnxruntime's median time on it."""
    graph = helper.make_graph(m.nodes, name, [helper.make_tensor_value_info("x", F, [1, 3, 224, 224])],
                              [helper.make_tensor_value_info(t, F, [1, 1000])], m.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    x = rand(1, 3, 224, 224)
    for _ in range(3):
        sess.run(None, {"x": x})
    ms = []
    for _ in range(20):
        t0 = time.perf_counter()
        sess.run(None, {"x": x})
        ms.append((time.perf_counter() - t0) * 1e3)
    print(f"onnxruntime {ort.__version__}, {threads} thread(s): median {np.median(ms):.2f} ms over {len(ms)} runs")


def mobilenetv2(path, threads):
    """MobileNetV2 1.0 (random weights): inverted residual blocks of 1x1 expansion, 3x3
    depthwise (strides 1 and 2) and 1x1 projection, each with batch norm, ReLU6 as Clip."""
    m = Model()

    def relu6(t):
        return m.op("Clip", [t, m.init(np.array(0.0, np.float32)), m.init(np.array(6.0, np.float32))])

    t = relu6(m.bn(m.conv("x", 3, 32, 3, strides=[2, 2], pads=[1, 1, 1, 1], bias=False), 32))
    cin = 32
    for e, cout, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for j in range(n):
            st = s if j == 0 else 1
            h = cin * e
            r = t if e == 1 else relu6(m.bn(m.conv(t, cin, h, 1, bias=False), h))
            r = relu6(m.bn(m.conv(r, h, h, 3, group=h, strides=[st, st], pads=[1, 1, 1, 1], bias=False), h))
            r = m.bn(m.conv(r, h, cout, 1, bias=False), cout)
            t = m.op("Add", [t, r]) if st == 1 and cin == cout else r
            cin = cout
    t = relu6(m.bn(m.conv(t, cin, 1280, 1, bias=False), 1280))
    t = m.op("Flatten", [m.op("GlobalAveragePool", [t])])
    t = m.op("Gemm", [t, m.init(rand(1000, 1280, scale=0.05)), m.init(rand(1000))], transB=1)
    save_and_time(m, t, "mobilenetv2", path, threads)


def resnet18(path, threads):
    m = Model()
    t = m.conv("x", 3, 64, 7, strides=[2, 2], pads=[3, 3, 3, 3], bias=False)
    t = m.op("Relu", [m.bn(t, 64)])
    t = m.op("MaxPool", [t], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for i, cout in enumerate([64, 128, 256, 512]):
        for j in range(2):
            s = 2 if (j == 0 and i > 0) else 1
            r = m.op("Relu", [m.bn(m.conv(t, cin, cout, 3, strides=[s, s], pads=[1, 1, 1, 1], bias=False), cout)])
            r = m.bn(m.conv(r, cout, cout, 3, pads=[1, 1, 1, 1], bias=False), cout)
            sc = t if (s == 1 and cin == cout) else m.bn(m.conv(t, cin, cout, 1, strides=[s, s], bias=False), cout)
            t = m.op("Relu", [m.op("Add", [sc, r])])
            cin = cout
    t = m.op("Flatten", [m.op("GlobalAveragePool", [t])])
    t = m.op("Gemm", [t, m.init(rand(1000, 512, scale=0.05)), m.init(rand(1000))], transB=1)
    save_and_time(m, t, "resnet18", path, threads)


def recurrent(out):
    """A bidirectional LSTM with peepholes and clip over rows of different lengths (a run-time
    sequence_lens), then a reverse GRU (linear_before_reset) and a Relu RNN (onnxruntime has no
    batch-major layout = 1; the node tests cover it)."""
    s, b, i = 12, 3, 8
    m = Model()
    lens = np.array([12, 7, 1], np.int32)
    h1, h2, h3 = 16, 8, 6
    t = m.op("LSTM", ["x", m.init(rand(2, 4 * h1, i, scale=0.4)), m.init(rand(2, 4 * h1, h1, scale=0.3)), m.init(rand(2, 8 * h1, scale=0.1)),
                      "sequence_lens", m.init(rand(2, b, h1, scale=0.5)), m.init(rand(2, b, h1, scale=0.5)), m.init(rand(2, 3 * h1, scale=0.2))],
             hidden_size=h1, direction="bidirectional", clip=5.0)
    t = m.op("Reshape", [m.op("Transpose", [t], perm=[0, 2, 1, 3]), m.init(np.array([s, b, 2 * h1], np.int64))])
    t = m.op("GRU", [t, m.init(rand(1, 3 * h2, 2 * h1, scale=0.3)), m.init(rand(1, 3 * h2, h2, scale=0.3)), m.init(rand(1, 6 * h2, scale=0.1)), "sequence_lens"],
             hidden_size=h2, direction="reverse", linear_before_reset=1)
    t = m.op("Squeeze", [t, m.init(np.array([1], np.int64))])
    n = len(m.nodes)
    m.nodes.append(helper.make_node("RNN", [t, m.init(rand(1, h3, h2, scale=0.4)), m.init(rand(1, h3, h3, scale=0.4))], ["", "rnn_h"],
                                    name=f"n{n}_RNN", hidden_size=h3, activations=["Relu"]))
    write(out, "recurrent", m, {"x": rand(s, b, i), "sequence_lens": lens}, "rnn_h")


def recurrent_activations(out):
    """RNNs chained through the parametric activations (LeakyRelu, HardSigmoid, Elu,
    ThresholdedRelu, Softsign, Affine) with their alpha and beta given or defaulted."""
    m = Model()
    t, width = "x", 3
    for i, (act, alpha, beta) in enumerate([("LeakyRelu", [0.2], None), ("HardSigmoid", [0.3], [0.4]), ("Elu", None, None),
                                           ("ThresholdedRelu", [0.1], None), ("Softsign", None, None), ("Affine", [0.5], [0.1])]):
        kw = dict(hidden_size=5, activations=[act])
        if alpha:
            kw["activation_alpha"] = alpha
        if beta:
            kw["activation_beta"] = beta
        y = f"rnn{i}_y"
        m.nodes.append(helper.make_node("RNN", [t, m.init(rand(1, 5, width, scale=0.5)), m.init(rand(1, 5, 5, scale=0.5))], [y], name=f"rnn{i}", **kw))
        t, width = m.op("Squeeze", [y, m.init(np.array([1], np.int64))]), 5
    write(out, "recurrent_activations", m, rand(4, 2, 3), t, opset=17)


def spectral(out):
    """A real signal cut to 15 points and transformed one-sided, back to 15 real samples by the
    inverse of a one-sided spectrum (odd length), then framed and Hann-windowed by STFT."""
    m = Model()
    t = m.op("DFT", ["x", m.init(np.array(15, np.int64))], axis=1, onesided=1)
    t = m.op("DFT", [t, m.init(np.array(15, np.int64))], axis=1, inverse=1, onesided=1)
    w = m.init((0.5 - 0.5 * np.cos(2 * np.pi * np.arange(6) / 6)).astype(np.float32))
    t = m.op("STFT", [t, m.init(np.array(3, np.int64)), w])
    write(out, "spectral", m, rand(2, 20, 1), t, opset=17)


def quantized_conv(out):
    """The MobileNet block through onnxruntime's quantize_dynamic: DynamicQuantizeLinear and
    ConvInteger (uint8 weights) with the scales multiplied back."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src = os.path.join(out, "mobilenet_block", "model.onnx")
    dst = os.path.join(out, "quantized_conv.onnx")
    quantize_dynamic(src, dst, op_types_to_quantize=["Conv"], weight_type=QuantType.QUInt8)
    save_case(out, "quantized_conv", onnx.load(dst), {"x": rand(1, 8, 21, 19)})
    os.remove(dst)


def static_quantized_conv(out):
    """The ResNet block through onnxruntime's quantize_static, QOperator format (QLinearConv,
    com.microsoft QLinearAdd, QLinearGlobalAveragePool and QGemm, QuantizeLinear /
    DequantizeLinear around them), calibrated on four inputs."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.data = iter([{"x": rand(2, 3, 32, 32)} for _ in range(4)])

        def get_next(self):
            return next(self.data, None)

    src = os.path.join(out, "resnet_block", "model.onnx")
    dst = os.path.join(out, "static_quantized_conv.onnx")
    quantize_static(src, dst, Reader(), quant_format=QuantFormat.QOperator, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    save_case(out, "static_quantized_conv", onnx.load(dst), {"x": rand(2, 3, 32, 32)})
    os.remove(dst)


def main():
    if sys.argv[1] in ("--resnet18", "--mobilenetv2"):
        build = resnet18 if sys.argv[1] == "--resnet18" else mobilenetv2
        build(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 2)
        return
    out = sys.argv[1]
    for case in (resnet, mobilenet, decoder, conv1d, conv3d, vit_patch, pixel_shuffle, rotary_positions, recurrent, recurrent_activations, spectral, quantized_conv, static_quantized_conv):
        case(out)


if __name__ == "__main__":
    main()
