"""Where things are, for tests at any depth of the tree."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository's root (app.py, requirements.txt, ...)."""
DATA = REPO / "tests" / "data"
"""Recorded inputs the tests replay: runner logs, vendor tool output, reference rows, a landed store."""
JS = REPO / "tests" / "js"
"""Ollama's JavaScript client, installed by npm for the JS recording tests."""
