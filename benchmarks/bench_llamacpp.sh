#!/usr/bin/env bash
# Surge against llama.cpp's llama-server, through HTTP with streaming, on the same workload.
# llama.cpp is built offline from the source package of llama-cpp-python (it vendors llama.cpp),
# and run at its strongest: the shipped Q4_1 requantized to Q4_0 (Q4_1 has no fast x86 path
# here), one KV cache per slot (--no-kv-unified), continuous batching, all cores.
#
#   bash benchmarks/bench_llamacpp.sh [clients, default "1,64"]
set -euo pipefail
cd "$(dirname "$0")/.."
CLIENTS="${1:-1,64}"
WORK="${LLAMACPP_WORK:-/tmp/surge-llamacpp}"
PY=.venv/bin/python
mkdir -p "$WORK"
if [ ! -x "$WORK/build/bin/llama-server" ]; then
  (cd "$WORK" && $PY -m pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d . -q)
  tar xzf "$WORK"/llama_cpp_python-0.3.36.tar.gz -C "$WORK"
  SRC="$WORK/llama_cpp_python-0.3.36/vendor/llama.cpp"
  cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF > "$WORK/cmake.log"
  cmake --build "$WORK/build" --target llama-server llama-quantize -j "$(nproc)" > "$WORK/build.log"
fi
GGUF="$($PY -c "from surge.models.resolve import resolve_model; print(resolve_model('smollm2-135m'))")"
Q40="$WORK/SmolLM2-135M-Instruct.Q4_0.gguf"
[ -f "$Q40" ] || "$WORK/build/bin/llama-quantize" --allow-requantize "$GGUF" "$Q40" Q4_0 > "$WORK/quantize.log" 2>&1

PORT=18081
"$WORK/build/bin/llama-server" -m "$Q40" --host 127.0.0.1 --port $PORT -np 64 --no-kv-unified \
  -c $((64 * 256)) -t "$(nproc)" --cont-batching > "$WORK/server.log" 2>&1 &
LPID=$!
trap 'kill $LPID 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
$PY benchmarks/bench_http.py --url "http://127.0.0.1:$PORT" --clients "$CLIENTS" --label llama.cpp
kill $LPID; wait $LPID 2>/dev/null || true

PORT=18082
$PY -m surge.cli serve --model "$GGUF" --port $PORT --served-model-name default > "$WORK/surge.log" 2>&1 &
SPID=$!
trap 'kill $SPID 2>/dev/null || true' EXIT
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
$PY benchmarks/bench_http.py --url "http://127.0.0.1:$PORT" --clients "$CLIENTS" --label surge
kill -TERM $SPID; wait $SPID 2>/dev/null || true
