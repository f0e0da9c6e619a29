#!/usr/bin/env bash
# Surge against llama.cpp's llama-server, through HTTP with streaming, on the same workload.
# llama.cpp is built offline from the source package of llama-cpp-python (it vendors llama.cpp),
# and run at its strongest: the shipped Q4_1 requantized to Q4_0 (Q4_1 has no fast x86 path
# here), one KV cache per slot (--no-kv-unified), continuous batching, all cores.
#
# Both are driven by `surge bench sweep --concurrency` (closed loop; 128 prompt and 128 output
# tokens, exact with SmolLM2's tokenizer), results as JSON in bench-results/llamacpp/.
#
#   bash benchmarks/bench_llamacpp.sh [concurrency levels, default "1,8,32,64,128"]
#
# SURGE_ARGS adds `surge serve` flags (e.g. "--quantization int8"), SURGE_LABEL names its result
# file (default "surge"), SKIP_LLAMACPP=1 runs Surge alone.
set -euo pipefail
cd "$(dirname "$0")/.."
LEVELS="${1:-1,8,32,64,128}"
OUT=bench-results/llamacpp
mkdir -p "$OUT"
WORK="${LLAMACPP_WORK:-/tmp/surge-llamacpp}"
PY="$PWD/.venv/bin/python"
mkdir -p "$WORK"
# The CPU's own instructions (GGML_NATIVE), except where it has AMX: there llama.cpp's AMX
# kernel (tinygemm_kernel_amx) died with SIGILL on a Xeon VM, so the build names its
# instructions instead: AVX-512 with VNNI/BF16/VBMI where the CPU has them, AMX off.
isa() { grep -m1 '^flags' /proc/cpuinfo | grep -qw "$1"; }
if isa amx_tile; then
  GGML_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  for f in avx512_vnni avx512_bf16 avx512_vbmi; do
    isa $f && GGML_FLAGS="$GGML_FLAGS -DGGML_$(echo $f | tr a-z A-Z)=ON"
  done
else
  GGML_FLAGS="-DGGML_NATIVE=ON"
fi
# A build made on another CPU (or with other flags) is made again.
if [ "$(cat "$WORK/build/surge-ggml-flags" 2>/dev/null)" != "$GGML_FLAGS $(grep -m1 'model name' /proc/cpuinfo)" ]; then
  rm -rf "$WORK/build"
fi
if [ ! -x "$WORK/build/bin/llama-server" ]; then
  [ -d "$WORK/llama_cpp_python-0.3.36" ] || {
    (cd "$WORK" && $PY -m pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d . -q)
    tar xzf "$WORK"/llama_cpp_python-0.3.36.tar.gz -C "$WORK"
  }
  SRC="$WORK/llama_cpp_python-0.3.36/vendor/llama.cpp"
  # shellcheck disable=SC2086  # GGML_FLAGS: several arguments
  cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF $GGML_FLAGS -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF > "$WORK/cmake.log"
  cmake --build "$WORK/build" --target llama-server llama-quantize -j "$(nproc)" > "$WORK/build.log"
  echo "$GGML_FLAGS $(grep -m1 'model name' /proc/cpuinfo)" > "$WORK/build/surge-ggml-flags"
fi
echo "llama.cpp build: $GGML_FLAGS" >&2
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0
GGUF="$($PY -c "from surge.models.formats.resolve import resolve_model; print(resolve_model('smollm2-135m'))")"
TOK="$WORK/tokenizer.json"
[ -f "$TOK" ] || $PY -c "from surge.models.formats.model_files import open_model; import sys; open_model(sys.argv[1]).tokenizer.backend.save(sys.argv[2])" "$GGUF" "$TOK"
MAXC="${LEVELS##*,}"
sweep() {  # url label
  $PY -m surge.cli bench sweep --url "$1" --concurrency "$LEVELS" --requests-per-client "${REQS_PER_CLIENT:-4}" \
    --input-len 128 --output-len 128 --tokenizer "$TOK" --output "$OUT/$2.json"
}
Q40="$WORK/SmolLM2-135M-Instruct.Q4_0.gguf"
[ -f "$Q40" ] || "$WORK/build/bin/llama-quantize" --allow-requantize "$GGUF" "$Q40" Q4_0 > "$WORK/quantize.log" 2>&1

PORT=18081
if [ "${SKIP_LLAMACPP:-0}" != 1 ]; then
"$WORK/build/bin/llama-server" -m "$Q40" --host 127.0.0.1 --port $PORT -np "$MAXC" --no-kv-unified \
  -c $((MAXC * 320)) -t "$(nproc)" --cont-batching > "$WORK/server.log" 2>&1 &
LPID=$!
trap 'kill $LPID 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
sweep "http://127.0.0.1:$PORT" llama.cpp
kill $LPID; wait $LPID 2>/dev/null || true
fi

PORT=18082
$PY -m surge.cli serve --model "$GGUF" --port $PORT --served-model-name default \
  --max-num-seqs "$MAXC" ${SURGE_ARGS:-} > "$WORK/surge.log" 2>&1 &
SPID=$!
trap 'kill $SPID 2>/dev/null || true' EXIT
for _ in $(seq 1200); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
sweep "http://127.0.0.1:$PORT" "${SURGE_LABEL:-surge}"
kill -TERM $SPID; wait $SPID 2>/dev/null || true
