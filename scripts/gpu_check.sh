#!/usr/bin/env bash
# Phasewatch against a real NVIDIA GPU and the real runner (docs/gpu-check.md): builds llama-server with CUDA,
# writes a Gemma-3-shaped model with random weights, runs sim (Ollama's place) and the collector (proxy and
# Ollama's log), drives proxied and direct generations, compares the records with the runner's own timings and
# the client's truth, checks that importing the run's log adds nothing, and prints the Why page's JSON.
#
#   OUT=DIR bash scripts/gpu_check.sh              on the GPU machine, from anywhere in the checkout
#   bash scripts/gpu_check.sh prepare [DIR]         where the package registries are reachable: what a GPU
#                                                   machine without them needs, into DIR (default .gpu/)
#
# Env: MODE gpu|cpu (cpu: the same run on the CPU, to try the script), SIZE 12b|4b|27b|tiny, LLAMA_BIN (a built
# llama-server: no build), LLAMA_SRC (a llama.cpp tree), CUDA_ARCH (default: the GPU's compute capability),
# LENGTHS, PREDICT, NUMCTX, NP (slots), THREADS, D (prepared folder, default .gpu), BUILD_DEADLINE_S, DRIVE_S,
# CUDA_HOME (where CUDA's toolkit is, default /usr/local/cuda), WORK (a work folder, kept; by default a temporary
# one, removed at the end unless KEEP_WORK=1).
# Exit: 0 every check passed, 1 a check failed, 3 no NVIDIA GPU or no CUDA compiler here (nothing started).
set -u
cd "$(dirname "$0")/.."
PROJ=$PWD
PY=${PYTHON:-$PROJ/.venv/bin/python}
[ -x "$PY" ] || PY=python3
D=${D:-$PROJ/.gpu}
EXIT_NO_GPU=3
LLAMA_CPP_PYTHON=0.3.36  # the llama.cpp that scripts/build_llama_server.sh builds (its sdist vendors it)

no_gpu() {
  echo "gpu_check: $*" >&2
  echo "gpu_check: nothing was started. MODE=cpu LLAMA_BIN=.cache/llama-server/bin/llama-server SIZE=tiny runs the same checks on the CPU." >&2
  exit "$EXIT_NO_GPU"
}

llama_tree() {  # llama_tree DEST: the llama.cpp sources into DEST/lc (prepared tarball, LLAMA_SRC, or the sdist)
  if [ -n "${LLAMA_SRC:-}" ]; then cp -a "$LLAMA_SRC" "$1/lc"; return; fi
  if [ -f "$D/lc.tar.xz" ]; then tar -xJf "$D/lc.tar.xz" -C "$1"; return; fi
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: -d "$1/sd" "llama-cpp-python==$LLAMA_CPP_PYTHON" &&
    tar -xzf "$1"/sd/llama_cpp_python-*.tar.gz -C "$1" && cp -a "$1"/llama_cpp_python-*/vendor/llama.cpp "$1/lc"
}

prepare() {  # what a GPU machine without registries needs: llama.cpp's tree, Gemma 3's tokenizer, wheels
  local out=${1:-$D} t
  mkdir -p "$out" && out=$(cd "$out" && pwd)
  t=$(mktemp -d); trap 'rm -rf "$t"' RETURN
  D=/nonexistent llama_tree "$t" || { echo "gpu_check prepare: could not get llama.cpp's sources" >&2; return 1; }
  (cd "$t/lc" && rm -rf docs models tests benches media examples pocs gguf-py \
    ggml/src/ggml-{cann,metal,opencl,sycl,vulkan,musa,hip,kompute,webgpu,zdnn})
  tar -C "$t" -cf - lc | xz -T0 -6 > "$out/lc.tar.xz"
  local gguf
  gguf=$("$PY" scripts/get_gemma.py | tail -1) && "$PY" scripts/gpu_check.py vocab --from "$gguf" --out "$out/vocab.gguf"
  mkdir -p "$out/whl"
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version "${WHEEL_PY:-3.12}" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$out/whl" httptools platformdirs "gguf>=0.19,<0.20"
  du -sh "$out"
}

if [ "${1:-}" = prepare ]; then prepare "${2:-}"; exit $?; fi

MODE=${MODE:-gpu}
if [ "$MODE" = gpu ]; then
  command -v nvidia-smi >/dev/null 2>&1 ||
    no_gpu "no NVIDIA GPU here: nvidia-smi is not on PATH (NVIDIA's driver installs it)."
  GPUS=$(nvidia-smi -L 2>&1)
  echo "$GPUS" | grep -q '^GPU [0-9]' || no_gpu "nvidia-smi lists no GPU: $(echo "$GPUS" | head -1)"
  if [ -z "${LLAMA_BIN:-}" ]; then
    [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] && PATH=$PATH:${CUDA_HOME:-/usr/local/cuda}/bin
    command -v nvcc >/dev/null 2>&1 ||
      no_gpu "CUDA's compiler (nvcc) is not installed, so llama-server cannot be built with CUDA: install the CUDA toolkit, or give a CUDA build of llama-server with LLAMA_BIN=PATH."
  fi
fi
OUT=${OUT:?gpu_check: set OUT to a folder for the results}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
S=$OUT/summary.txt; : > "$S"
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$S"; }
W=${WORK:-}
[ -n "$W" ] || { W=$(mktemp -d /tmp/gpu_check.XXXXXX); OWN_WORK=1; }  # ours: removed at the end (the model is GBs)
mkdir -p "$W"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  [ -n "${OWN_WORK:-}" ] && [ -z "${KEEP_WORK:-}" ] && { sleep 1; rm -rf "$W"; }
}
trap cleanup EXIT
SIZE=${SIZE:-12b}; THREADS=${THREADS:-8}; LENGTHS=${LENGTHS:-256,1024,4096,16384}; PREDICT=${PREDICT:-256}
NUMCTX=${NUMCTX:-20480}; NP=${NP:-2}; SIM_PORT=${SIM_PORT:-18434}; PROXY_PORT=${PROXY_PORT:-18435}
FAILED=0
say "gpu_check mode=$MODE size=$SIZE work=$W"
if [ "$MODE" = gpu ]; then
  { nvidia-smi -L; nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm,clocks.max.mem,driver_version,compute_cap --format=csv
    nvcc --version 2>/dev/null | tail -2; } >> "$S" 2>&1
fi
{ nproc; free -g | head -2; } >> "$S" 2>&1
if [ -d "$D/whl" ]; then  # a machine without registries: the wheels prepare fetched
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$W/site" "$D"/whl/*.whl >> "$S" 2>&1 || say "installing the prepared wheels failed"
  export PYTHONPATH="$W/site:$PROJ"
else
  export PYTHONPATH="$PROJ"
fi

BPID=
if [ -z "${LLAMA_BIN:-}" ]; then
  ARCH=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')}
  llama_tree "$W" >> "$S" 2>&1 || { say "no llama.cpp sources: run 'bash scripts/gpu_check.sh prepare' where the registries are reachable"; exit 1; }
  ( cmake -S "$W/lc" -B "$W/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="${ARCH:-90}" -DGGML_CUDA_FA=${CUDA_FA:-OFF} -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF \
      -DLLAMA_BUILD_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF &&
    cmake --build "$W/build" --target llama-server -j "$(nproc)" ) > "$W/build.log" 2>&1 &
  BPID=$!; PIDS+=("$BPID")
  LLAMA_BIN=$W/build/bin/llama-server
  say "llama-server build started (CUDA arch ${ARCH:-90})"
fi
if [ "$MODE" = gpu ]; then
  timeout 60 "$PY" -m collectors.gpu > "$OUT/collectors_gpu.txt" 2>&1
  say "collectors.gpu exit $?"
fi
VOCAB=${VOCAB:-}
[ -z "$VOCAB" ] && [ -f "$D/vocab.gguf" ] && VOCAB=$D/vocab.gguf
[ -z "$VOCAB" ] && VOCAB=$("$PY" scripts/get_gemma.py 2>>"$S" | tail -1)
"$PY" scripts/gpu_check.py model --vocab "$VOCAB" --out "$W/model.gguf" --size "$SIZE" >> "$S" 2>&1 || { say "writing the model failed"; exit 1; }
say "model written: $(stat -c%s "$W/model.gguf") bytes"
if [ -n "$BPID" ]; then
  while kill -0 "$BPID" 2>/dev/null; do
    if [ $(( $(date +%s) - T0 )) -gt "${BUILD_DEADLINE_S:-900}" ]; then say "build past its deadline: stopped"; kill "$BPID"; break; fi
    sleep 3
  done
  tail -c 6000 "$W/build.log" > "$OUT/build_tail.txt"
fi
[ -x "$LLAMA_BIN" ] || { say "no llama-server at $LLAMA_BIN (build_tail.txt)"; exit 1; }
say "llama-server: $LLAMA_BIN"

if [ "$MODE" = gpu ]; then nvidia-smi dmon -s pucm -d 1 > "$OUT/dmon.txt" 2>&1 & PIDS+=($!); fi
mkdir -p "$W/data"; chmod 700 "$W/data"
PHASEWATCH_LLAMA_SERVER="$LLAMA_BIN" "$PY" -m sim --port "$SIM_PORT" --engine llama-server --gguf "$W/model.gguf" \
  --model-name "gemma3:$SIZE-random" --threads "$THREADS" --num-parallel "$NP" --log-file "$W/ollama.log" > "$W/sim.out" 2>&1 &
PIDS+=($!)
"$PY" -m collectors --ollama "http://127.0.0.1:$SIM_PORT" --listen "127.0.0.1:$PROXY_PORT" --data "$W/data" \
  --ollama-log "$W/ollama.log" > "$W/collector.out" 2>&1 &
PIDS+=($!)
for port in "$SIM_PORT" "$PROXY_PORT"; do
  for _ in $(seq 300); do curl -s -o /dev/null "http://127.0.0.1:$port/api/version" && break; sleep 0.2; done
done
say "sim and collector up"
timeout "${DRIVE_S:-600}" "$PY" scripts/gpu_check.py drive "http://127.0.0.1:$PROXY_PORT" "http://127.0.0.1:$SIM_PORT" "$OUT/drive.json" \
  --lengths "$LENGTHS" --predict "$PREDICT" --num-ctx "$NUMCTX" >> "$S" 2>&1
say "drive exit $?"
sleep 6  # the direct generations' grace (collectors/ollama/direct.py) before the collector stops
timeout 60 "$PY" -m collectors --stop --data "$W/data" >> "$S" 2>&1
say "collector stopped"
timeout 120 "$PY" -m store export --data "$W/data" --format jsonl > "$OUT/records.jsonl" 2>> "$S"
cp "$W/data/phasewatch.sqlite3" "$OUT/store.db" 2>/dev/null
gzip -c "$W/ollama.log" > "$OUT/ollama.log.gz"

say "records against the runner's timings and the client's truth:"
"$PY" scripts/gpu_check.py compare --data "$W/data" --log "$W/ollama.log" --truth "$OUT/drive.json" > "$OUT/compare.json" 2>> "$S"
RC=$?
"$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); print({k: v for k, v in r.items() if k != "client"})' "$OUT/compare.json" | tee -a "$S"
[ "$RC" = 0 ] || { FAILED=1; say "FAILED: a runner generation not recorded exactly once (compare.json)"; }

mkdir -p "$W/import-check" && cp "$W/data/phasewatch.sqlite3" "$W/import-check/" && chmod 700 "$W/import-check"
IMPORTED=$("$PY" -m collectors.import_log --quiet --data "$W/import-check" "$W/ollama.log" 2>&1)
say "import-log of this run's log into a copy of its store: $IMPORTED"
echo "$IMPORTED" | grep -q '; 0 recorded;' || { FAILED=1; say "FAILED: the import recorded a generation the store had"; }

say "the Why page's story (python -m pages.why --data DIR --json):"
if "$PY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("pages.why.__main__") is None)' 2>/dev/null; then
  timeout 120 "$PY" -m pages.why --data "$W/data" --window-s 86400 --json > "$OUT/why.json" 2>> "$S" && cat "$OUT/why.json" ||
    say "pages.why --json failed (its error is in summary.txt)"
else
  say "pages.why --json is not in this checkout (no pages/why/__main__.py): no Why JSON printed"
fi
{ echo "--- sim.out tail"; tail -c 3000 "$W/sim.out"; echo "--- collector.out tail"; tail -c 3000 "$W/collector.out"; } >> "$S"
say "end: $([ "$FAILED" = 0 ] && echo 'every check passed' || echo 'a check failed'); results in $OUT"
exit "$FAILED"
