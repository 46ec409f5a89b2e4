"""The complexity gate: no function over the threshold unless scripts/complexity_allowed.txt names it, with a reason.

Radon's cyclomatic complexity counts each `and`/`or`, inline `if` and comprehension `if`, which ruff's C901 does
not. Nested functions (closures) are measured on their own, as radon does, and gated too.

A listed function fails the gate when it grows past the ceiling written beside it, and a listed function that is
back under the threshold (or gone) fails it too until its line is deleted, so the list only shrinks.
To tighten: lower --max in scripts/test.sh, or delete lines from the list.

Usage: python scripts/complexity.py [--max 20] [--allowed scripts/complexity_allowed.txt] [PATH ...]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from radon.complexity import cc_visit
from radon.visitors import Class, Function

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ["analysis", "collectors", "store", "sim", "pages", "app.py"]
ALLOWED = REPO / "scripts" / "complexity_allowed.txt"


@dataclass(frozen=True)
class Measured:
    key: str  # "path::Class.method" or "path::outer.inner": stable across line moves
    lineno: int
    complexity: int


@dataclass(frozen=True)
class Allowance:
    ceiling: int
    reason: str


def _functions(blocks: list[Function | Class], prefix: str) -> Iterator[tuple[str, Function]]:
    for block in blocks:
        if isinstance(block, Class):
            yield from _functions([*block.methods, *block.inner_classes], f"{prefix}{block.name}.")
        else:
            yield f"{prefix}{block.name}", block
            yield from _functions(block.closures, f"{prefix}{block.name}.")


def measure(paths: list[Path], root: Path) -> list[Measured]:
    """Every function, method and closure under paths, with its radon complexity."""
    files = sorted(f for p in paths for f in ([p] if p.is_file() else p.rglob("*.py")))
    measured = []
    for file in files:
        # Top-level only: methods are reached through their class, so none is counted twice.
        blocks = [b for b in cc_visit(file.read_text()) if isinstance(b, Class) or not b.is_method]
        for name, function in _functions(blocks, ""):
            key = f"{file.relative_to(root).as_posix()}::{name}"
            measured.append(Measured(key, function.lineno, function.complexity))
    return measured


def read_allowed(text: str) -> dict[str, Allowance]:
    """Lines `path::name  CEILING  reason`; `#` starts a comment line. A line without a reason is an error."""
    allowed = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(maxsplit=2)
        if len(parts) < 3 or not parts[1].isdigit():
            raise ValueError(f"complexity_allowed.txt:{number}: want `path::name  CEILING  reason`, got {raw!r}")
        allowed[parts[0]] = Allowance(int(parts[1]), parts[2])
    return allowed


def judge(measured: list[Measured], allowed: dict[str, Allowance], max_complexity: int) -> list[str]:
    """The gate's complaints, one line each; empty when it passes."""
    complaints = []
    seen = {m.key: m for m in measured}
    for m in measured:
        allowance = allowed.get(m.key)
        if m.complexity <= max_complexity:
            continue
        if allowance is None:
            complaints.append(
                f"{m.key} (line {m.lineno}): complexity {m.complexity} > {max_complexity}: split it into named"
                " steps, or list it in scripts/complexity_allowed.txt with the reason it must stay"
            )
        elif m.complexity > allowance.ceiling:
            complaints.append(f"{m.key} (line {m.lineno}): complexity {m.complexity}, its ceiling is {allowance.ceiling}")
    for key in allowed:
        now = seen.get(key)
        if now is None:
            complaints.append(f"{key}: listed in scripts/complexity_allowed.txt but not found: delete its line")
        elif now.complexity <= max_complexity:
            complaints.append(
                f"{key}: complexity {now.complexity} is within {max_complexity} now: delete its line"
                " from scripts/complexity_allowed.txt"
            )
    return complaints


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max", type=int, default=20, dest="max_complexity", help="highest complexity allowed")
    parser.add_argument("--allowed", type=Path, default=ALLOWED, help="the allow-list (path::name CEILING reason)")
    parser.add_argument("--root", type=Path, default=REPO, help="paths in the allow-list are relative to this")
    parser.add_argument("paths", nargs="*", type=Path, help="files and folders (default: the product)")
    args = parser.parse_args(argv)
    paths = args.paths or [args.root / p for p in PRODUCT]
    measured = measure(paths, args.root)
    allowed = read_allowed(args.allowed.read_text()) if args.allowed.exists() else {}
    complaints = judge(measured, allowed, args.max_complexity)
    over = sum(m.complexity > args.max_complexity for m in measured)
    for line in complaints:
        print(line, file=sys.stderr)
    print(
        f"complexity gate: {len(measured)} functions, {over} over {args.max_complexity}"
        f" ({len(allowed)} allowed by name), {len(complaints)} problem(s)"
    )
    return 1 if complaints else 0


if __name__ == "__main__":
    sys.exit(main())
