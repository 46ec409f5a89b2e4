"""The split modules' contracts (pyproject.toml, issue 43) hold their parts apart: a part that imports its whole, or
a part beside it, breaks them unedited. Each test adds one import to a copy of the packages and runs the real
``lint-imports`` there (tests/support/import_lint.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.import_lint import contract_line, copy_of_repo, lint_imports

LOAD = "runner load lines: parsed, folded, then stored or worded"
WAITS = "runner wait lines: parsed, folded, then worded"
DIRECT = "direct records: a task, its checks and record, then the tracker"
READER = "runner reader: its state, the join and folds, the log, then the loop"


def test_the_copy_as_it_stands_keeps_every_part_contract(tmp_path: Path) -> None:
    result = lint_imports(copy_of_repo(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    for contract in (LOAD, WAITS, DIRECT, READER):
        assert contract_line(result.stdout, contract).endswith("KEPT")


@pytest.mark.parametrize(
    ("part", "imported", "contract"),
    [
        ("analysis/runner_load_lines.py", "analysis.runner_load_words", LOAD),  # the parser reaching for its wording
        ("analysis/runner_load_rows.py", "analysis.runner_load_words", LOAD),  # two parts on one layer
        ("analysis/runner_wait_lines.py", "analysis.runner_wait_fold", WAITS),
        ("analysis/runner_wait_tasks.py", "analysis.runner_wait_lines", WAITS),
        ("collectors/ollama/direct_task.py", "collectors.ollama.direct_record", DIRECT),
        ("collectors/ollama/direct_confirm.py", "collectors.ollama.direct", DIRECT),  # a part importing its whole
        ("collectors/ollama/runner_join.py", "collectors.ollama.runner_loads", READER),
        ("collectors/ollama/runner_state.py", "collectors.ollama.runner_log", READER),
    ],
)
def test_a_part_importing_its_whole_or_a_sibling_breaks_its_contract(
    tmp_path: Path, part: str, imported: str, contract: str
) -> None:
    root = copy_of_repo(tmp_path)
    path = root / part
    path.write_text(path.read_text() + f"\nimport {imported}  # noqa: E402\n")
    result = lint_imports(root)
    assert result.returncode == 1, result.stdout
    assert contract_line(result.stdout, contract).endswith("BROKEN")
    assert f"{part[:-3].replace('/', '.')} -> {imported}" in result.stdout
