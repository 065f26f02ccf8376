#!/usr/bin/env bash
# kiln GPU check: the CUDA backend on a real GPU, in one short run (< ~8 minutes).
#
#   scripts/gpu_check.sh prepare   # on a dev machine (cargo, the model, no GPU needed)
#   scripts/gpu_check.sh run       # on the GPU machine, from the repository root
#
# `prepare` builds the CUDA test binary (release) and a compact copy of all-MiniLM-L6-v2 into
# .gpu/ (git-ignored through .git/info/exclude), because the GPU machine may have no Rust
# toolchain and no network, and what travels there is limited to 64 MiB: the copy keeps only
# the word-embedding rows the golden sentences use (the others are zeroed, which changes no
# golden result and no timing) and is gzipped. Then run on the GPU machine, carrying .gpu:
#     run(command="bash scripts/gpu_check.sh run", carry=[".gpu"], timeout_s=360)
#
# `run` (about 4 minutes on an H200; every step runs even when one before it failed):
#   - finds the driver's NVRTC (any CUDA 12/13 toolkit or the nvidia-cuda-nvrtc wheel) and
#     ptxas; builds the test binary with cargo if cargo is there, else uses .gpu/cuda_device;
#   1/4 runs compiler/tests/cuda_device.rs with KILN_REQUIRE_GPU=1, each test in its own
#     process: tiny BERT vs the reference, MiniLM vs tests/data/minilm/golden.json
#     (cosine >= 0.99999), plan bincode round trip, artifacts through kiln-runtime's
#     PrecompiledCuda, CUDA-graph replay;
#   2/4 times buckets 1x128, 8x128, 32x128, 128x128 (GPU time of the plan's launches with CUDA
#     events, and end to end with copies);
#   2b profiles buckets 8x128 and 128x128 (KILN_PROFILE_BUCKETS) kernel by kernel
#     (profile_buckets), and again with every f32 GEMM forced to each SIMT tiling;
#   3/4 times PyTorch eager and torch.compile on the same buckets (f32, TF32 off, same mean
#     pooling + L2 normalization) and prints the table against kiln;
#   4/4 compute-sanitizer memcheck on tiny BERT where the machine allows it.
# KILN_GPU_CHECK_QUICK=1 stops after 2b. Everything it reports is also written to $OUT (when
# set) or /tmp/kiln-gpu-check; the exit status is 0 only when nothing failed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
GPU_DIR="$ROOT/.gpu"
RESULTS="${OUT:-/tmp/kiln-gpu-check}"
mkdir -p "$RESULTS"
BUCKETS="${KILN_BENCH_BUCKETS:-1x128,8x128,32x128,128x128}"
PROFILE_BUCKETS="${KILN_PROFILE_BUCKETS:-8x128,128x128}"

log() { echo "[gpu_check $(date +%H:%M:%S)] $*" >&2; }
die() { log "FAILED: $*"; exit 1; }

# The test binary cargo built for compiler/tests/cuda_device.rs.
build_test_binary() {
    local json
    json=$(cargo test --release -p kiln-compiler --test cuda_device --no-run --message-format=json 2>/dev/null) \
        || die "cargo could not build the cuda_device test"
    echo "$json" | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "cuda_device" and m.get("executable"):
        print(m["executable"])
' | tail -1
}

prepare() {
    local model="${KILN_MODEL_DIR:-$ROOT/models/all-MiniLM-L6-v2}"
    [ -f "$model/model.safetensors" ] || die "no model in $model (run: cargo run -- fetch-model minilm)"
    mkdir -p "$GPU_DIR/minilm"
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    log "building the CUDA test binary (release)"
    local bin
    bin=$(build_test_binary)
    [ -n "$bin" ] && [ -x "$bin" ] || die "test binary not found"
    cp "$bin" "$GPU_DIR/cuda_device"
    strip "$GPU_DIR/cuda_device" 2>/dev/null || true
    log "compacting the model (word-embedding rows the golden sentences use) into $GPU_DIR/minilm"
    cp "$model/config.json" "$GPU_DIR/minilm/"
    python3 - "$model/model.safetensors" "$ROOT/tests/data/minilm/golden.json" "$GPU_DIR/minilm/model.safetensors.gz" <<'PY' || die "model compaction failed"
import gzip, json, struct, sys
src, golden, dst = sys.argv[1:4]
g = json.load(open(golden))
keep = set()
for s in g["sentences"]:
    keep.update(s["ids"])
for row in g["padded_batch"]["ids"]:
    keep.update(row)
data = bytearray(open(src, "rb").read())
(n,) = struct.unpack("<Q", data[:8])
header = json.loads(data[8:8 + n])
base = 8 + n
name = next(k for k in header if k.endswith("embeddings.word_embeddings.weight"))
t = header[name]
assert t["dtype"] == "F32", t["dtype"]
rows, cols = t["shape"]
start, end = t["data_offsets"]
row_bytes = cols * 4
zero = bytes(row_bytes)
for r in range(rows):
    if r not in keep:
        o = base + start + r * row_bytes
        data[o:o + row_bytes] = zero
with gzip.open(dst, "wb", compresslevel=6) as f:
    f.write(data)
print(f"kept {len(keep)} of {rows} word-embedding rows", file=sys.stderr)
PY
    du -sh "$GPU_DIR"/* "$GPU_DIR/minilm"/* >&2
    local total
    total=$(du -sm "$GPU_DIR" | cut -f1)
    log ".gpu holds ${total} MiB (the working tree that travels must stay under 64 MiB)"
    log "now, on the GPU machine: bash scripts/gpu_check.sh run   (carry .gpu)"
}

# Puts NVRTC (as libnvrtc.so, a name cudarc looks for) and ptxas on the search paths.
setup_cuda_tools() {
    local cands=() d f
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64 \
             /usr/local/cuda-*/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu "$ROOT/.cuda/nvidia/cuda_nvrtc/lib"; do
        for f in "$d"/libnvrtc.so*; do [ -e "$f" ] && cands+=("$f"); done
    done
    if [ ${#cands[@]} -eq 0 ]; then
        local site
        site=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)
        for d in $site; do
            for f in "$d"/nvidia/*/lib/libnvrtc.so* "$d"/nvidia/cu13/lib/libnvrtc.so*; do [ -e "$f" ] && cands+=("$f"); done
        done
    fi
    local lib=""
    for f in "${cands[@]}"; do
        case "$f" in *builtins*|*alt*) continue ;; esac
        lib="$f"
        break
    done
    [ -n "$lib" ] || die "no libnvrtc.so found on this machine"
    mkdir -p /tmp/kiln-nvrtc
    ln -sf "$lib" /tmp/kiln-nvrtc/libnvrtc.so
    export LD_LIBRARY_PATH="/tmp/kiln-nvrtc:$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    for d in /usr/local/cuda/bin /usr/local/cuda-*/bin "$ROOT/.cuda/nvidia/cuda_nvcc/bin"; do
        if [ -x "$d/ptxas" ]; then export PATH="$d:$PATH"; break; fi
    done
    log "NVRTC: $lib; ptxas: $(command -v ptxas || echo 'none (plans carry PTX only)')"
}

run_check() {
    local t0=$SECONDS
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee "$RESULTS/gpu.txt" >&2
    setup_cuda_tools
    local bin=""
    if command -v cargo >/dev/null 2>&1; then
        log "cargo found: building the CUDA test binary here"
        bin=$(build_test_binary)
    fi
    if [ -z "$bin" ]; then
        bin="$GPU_DIR/cuda_device"
        [ -x "$bin" ] || die "no cargo here and no prepared $bin (run 'scripts/gpu_check.sh prepare' on a dev machine and carry .gpu)"
    fi
    local model="${KILN_MODEL_DIR:-}"
    if [ -z "$model" ]; then
        if [ -f "$GPU_DIR/minilm/model.safetensors.gz" ]; then
            model=/tmp/kiln-minilm
            mkdir -p "$model"
            cp "$GPU_DIR/minilm/config.json" "$model/"
            gunzip -c "$GPU_DIR/minilm/model.safetensors.gz" > "$model/model.safetensors" || die "model unpack failed"
        else
            model="$ROOT/models/all-MiniLM-L6-v2"
        fi
    fi
    export KILN_MODEL_DIR="$model" KILN_GOLDEN="$ROOT/tests/data/minilm/golden.json" KILN_REQUIRE_GPU=1
    export KILN_REQUIRE_NVRTC=1 RUST_BACKTRACE=1

    # Each test in its own process: a sticky CUDA error (an illegal address) poisons the
    # process's context, and one failing test must not hide the others or the timings.
    log "step 1/4: correctness on the GPU, one process per test"
    local failed=0 name
    : > "$RESULTS/tests.log"
    for name in no_driver_is_a_one_line_error tiny_bert_on_gpu_matches_reference minilm_on_gpu_matches_golden \
                plan_serializes_and_reloads artifact_runs_through_precompiled_cuda; do
        timeout 150 "$bin" --exact "$name" --test-threads=1 --nocapture >> "$RESULTS/tests.log" 2>&1
        rc=$?
        if [ "$rc" -eq 0 ]; then log "  ok   $name"; else log "  FAIL $name (rc $rc)"; failed=$((failed + 1)); fi
    done
    grep -E "^GPU:|worst cosine|CUDA graph|serialized plan|PrecompiledCuda|panicked|error" "$RESULTS/tests.log" | head -40 >&2
    [ "$failed" -eq 0 ] || log "$failed GPU test(s) failed; see tests.log (going on to the timings)"

    log "step 2/4: kiln timings for $BUCKETS"
    KILN_BENCH_BUCKETS="$BUCKETS" timeout 150 "$bin" --ignored --exact bench_buckets --test-threads=1 --nocapture \
        > "$RESULTS/kiln_bench.txt" 2> "$RESULTS/kiln_bench.err"
    rc=$?
    grep -o '{"bucket".*}' "$RESULTS/kiln_bench.txt" > "$RESULTS/kiln_bench.jsonl"
    [ "$rc" -eq 0 ] || { tail -20 "$RESULTS/kiln_bench.err" >&2; log "kiln benchmark failed (rc $rc)"; failed=$((failed + 1)); }
    cat "$RESULTS/kiln_bench.jsonl" >&2

    log "step 2b: where the time goes, per kernel variant, and each GEMM tiling ($PROFILE_BUCKETS)"
    KILN_BENCH_BUCKETS="$PROFILE_BUCKETS" timeout 200 "$bin" --ignored --exact profile_buckets --test-threads=1 --nocapture \
        > "$RESULTS/profile.txt" 2> "$RESULTS/profile.err"
    rc=$?
    grep -v '^test \|^running\|^$' "$RESULTS/profile.txt" >&2
    [ "$rc" -eq 0 ] || { tail -20 "$RESULTS/profile.err" >&2; log "profile failed (rc $rc)"; failed=$((failed + 1)); }

    if [ "${KILN_GPU_CHECK_QUICK:-0}" = 1 ]; then
        log "KILN_GPU_CHECK_QUICK=1: no PyTorch comparison, no memcheck; done in $((SECONDS - t0)) s, $failed failure(s)"
        [ "$failed" -eq 0 ]
        return
    fi

    log "step 3/4: PyTorch eager and torch.compile on the same buckets"
    PYTHONUNBUFFERED=1 timeout 200 python3 - "$model" "$BUCKETS" "$RESULTS/kiln_bench.jsonl" "$RESULTS/torch_bench.jsonl" <<'PY'
import json, sys, time
model_dir, buckets, kiln_path, out_path = sys.argv[1:5]
try:
    import torch
    from transformers import BertConfig, BertModel
    from safetensors.torch import load_file
except Exception as e:  # noqa: BLE001
    print(f"SKIPPED PyTorch comparison: {e}", file=sys.stderr)
    sys.exit(0)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
cfg = BertConfig.from_json_file(f"{model_dir}/config.json")
model = BertModel(cfg, add_pooling_layer=False).cuda().eval()
missing, unexpected = model.load_state_dict(load_file(f"{model_dir}/model.safetensors"), strict=False)
print(f"torch {torch.__version__}, attention {getattr(cfg, '_attn_implementation', '?')}, missing {missing}", file=sys.stderr)

def embed(ids, mask):
    h = model(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask.unsqueeze(-1).to(h.dtype)
    e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(e, dim=-1)

def timed(fn, ids, mask, iters):
    with torch.inference_mode():
        for _ in range(3):
            fn(ids, mask)
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn(ids, mask)
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / iters

rows = []
start = time.time()
compiled = torch.compile(embed, dynamic=False)
out = open(out_path, "w")
for b in buckets.split(","):
    bs, seq = (int(x) for x in b.split("x"))
    ids = torch.randint(0, cfg.vocab_size, (bs, seq), device="cuda")
    mask = torch.ones_like(ids)
    iters = 20 if bs * seq >= 4096 else 100
    eager = timed(embed, ids, mask, iters)
    comp, compile_s = float("nan"), 0.0
    if time.time() - start < 120:  # torch.compile recompiles per shape; keep within the device time
        t = time.time()
        with torch.inference_mode():
            compiled(ids, mask)
        compile_s = time.time() - t
        comp = timed(compiled, ids, mask, iters)
    row = {"bucket": b, "torch_eager_ms": round(eager, 4), "torch_compile_ms": round(comp, 4), "compile_s": round(compile_s, 1)}
    rows.append(row)
    print(json.dumps(row), file=sys.stderr)
    out.write(json.dumps(row) + "\n")
    out.flush()
kiln = {}
for line in open(kiln_path):
    r = json.loads(line)
    kiln[r["bucket"]] = r
print()
print(f"{'bucket':>9} | {'kiln GPU ms':>11} | {'kiln e2e ms':>11} | {'torch eager':>11} | {'torch.compile':>13} | {'vs eager':>8} | {'vs compile':>10}")
print("-" * 92)
for r in rows:
    k = kiln.get(r["bucket"], {})
    g = k.get("kiln_gpu_ms", float("nan"))
    e = k.get("kiln_e2e_ms", float("nan"))
    print(f"{r['bucket']:>9} | {g:>11.3f} | {e:>11.3f} | {r['torch_eager_ms']:>11.3f} | {r['torch_compile_ms']:>13.3f} | "
          f"{r['torch_eager_ms'] / e:>7.2f}x | {r['torch_compile_ms'] / e:>9.2f}x")
print("(speedups use kiln's end-to-end time, host copies included; torch times are GPU-event times of the forward pass)")
PY
    # compute-sanitizer works on Firecracker machines, not on gVisor ones (KINDS.md): try it
    # on the small model where time is left.
    if [ $((SECONDS - t0)) -lt 380 ] && command -v compute-sanitizer >/dev/null 2>&1; then
        log "step 4/4: compute-sanitizer memcheck on tiny BERT"
        timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 "$bin" --exact tiny_bert_on_gpu_matches_reference \
            --test-threads=1 > "$RESULTS/memcheck.log" 2>&1
        log "memcheck rc $? ($(grep -c 'Invalid' "$RESULTS/memcheck.log") invalid accesses); $(tail -2 "$RESULTS/memcheck.log" | tr '\n' ' ')"
    fi
    log "done in $((SECONDS - t0)) s, $failed failure(s); results in $RESULTS"
    [ "$failed" -eq 0 ]
}

case "${1:-}" in
    prepare) prepare ;;
    run) run_check ;;
    *) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
