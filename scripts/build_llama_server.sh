#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (the runner Ollama >= 0.30 starts for GGUF models) from the sources the
# llama-cpp-python sdist vendors, into .cache/llama-server/. Idempotent: a build whose stamp matches the
# pinned version is kept. CPU only; -DGGML_NATIVE=OFF because the native build crashes in its AMX path on
# some CPUs. Takes about 8-12 minutes on two cores the first time.
# Usage: bash scripts/build_llama_server.sh   (prints the binary's path on its last line)
set -euo pipefail
cd "$(dirname "$0")/.."
# The llama.cpp sources: those vendored in this llama-cpp-python sdist (downloaded, never installed).
VERSION=0.3.36
PREFIX="$PWD/.cache/llama-server"
BIN="$PREFIX/bin/llama-server"
STAMP="$PREFIX/version"
if [ -x "$BIN" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$VERSION" ]; then
  echo "$BIN"
  exit 0
fi
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
for tool in cmake ninja; do
  command -v "$tool" >/dev/null || "$PY" -m pip install -q --disable-pip-version-check "$tool"
done
export PATH="$(dirname "$PY"):$PATH"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "Building llama-server from llama-cpp-python $VERSION's llama.cpp (once, several minutes)..." >&2
"$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: -d "$WORK" "llama-cpp-python==$VERSION" >&2
tar -xzf "$WORK"/llama_cpp_python-*.tar.gz -C "$WORK"
SRC="$(echo "$WORK"/llama_cpp_python-*/vendor/llama.cpp)"
cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$WORK/build" --target llama-server -j "$(nproc)" >&2
mkdir -p "$PREFIX/bin"
install -m 755 "$WORK/build/bin/llama-server" "$BIN"
echo "$VERSION" > "$STAMP"
echo "$BIN"
