"""The complexity gate (scripts/complexity.py): it sees `and`/`or`, closures and methods, and its list only shrinks."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.complexity import main

# 21 operands joined by `or`: radon counts 20 decisions, so complexity 21, with no `if` in sight (ruff's C901: 1).
WIDE_OR = " or ".join(f"x == {n}" for n in range(21))


def _tree(tmp_path: Path, source: str) -> Path:
    (tmp_path / "mod.py").write_text(source)
    return tmp_path


def _gate(tmp_path: Path, allowed: str, max_complexity: int = 20) -> int:
    allow_file = tmp_path / "allowed.txt"
    allow_file.write_text(allowed)
    return main(["--max", str(max_complexity), "--allowed", str(allow_file), "--root", str(tmp_path), str(tmp_path)])


def test_a_chain_of_or_over_the_threshold_fails_unless_listed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _tree(tmp_path, f"def wide(x):\n    return {WIDE_OR}\n")
    assert _gate(tmp_path, "") == 1
    assert "mod.py::wide (line 1): complexity 21 > 20" in capsys.readouterr().err
    assert _gate(tmp_path, "mod.py::wide  21  parses a wire format\n") == 0
    assert _gate(tmp_path, "", max_complexity=21) == 0


def test_methods_and_closures_are_gated_by_their_qualified_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = f"class Box:\n    def method(self, x):\n        def inner(x):\n            return {WIDE_OR}\n        return inner\n"
    _tree(tmp_path, source)
    assert _gate(tmp_path, "") == 1
    assert "mod.py::Box.method.inner" in capsys.readouterr().err
    assert _gate(tmp_path, "mod.py::Box.method.inner  21  why it stays\n") == 0


def test_a_listed_function_may_not_grow_and_its_line_must_go_once_it_is_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _tree(tmp_path, f"def wide(x):\n    return {WIDE_OR}\n")
    assert _gate(tmp_path, "mod.py::wide  20  listed when it was 20\n", max_complexity=15) == 1
    assert "complexity 21, its ceiling is 20" in capsys.readouterr().err
    _tree(tmp_path, "def wide(x):\n    return x == 1\n")
    assert _gate(tmp_path, "mod.py::wide  21  split since\n") == 1
    assert "delete its line" in capsys.readouterr().err
    assert _gate(tmp_path, "mod.py::gone  21  renamed since\n") == 1
    assert "not found" in capsys.readouterr().err


def test_a_line_without_a_reason_is_refused(tmp_path: Path) -> None:
    _tree(tmp_path, "def small():\n    return 1\n")
    with pytest.raises(ValueError, match="reason"):
        _gate(tmp_path, "mod.py::small  21\n")


def test_the_product_passes_the_gate_with_its_allow_list() -> None:
    assert main([]) == 0
