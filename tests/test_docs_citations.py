"""Every Markdown file the project cites exists in the repository, and so does every section it cites.

A citation is any ``name.md`` in code, comments, docstrings, data files and READMEs, resolved
against the citing file's folder, then the repository root. Sections are cited as ``§N`` right
after the file name (``docs/physics.md §3``, ``§2, §3 and §5``, ``§2 to §4``) and must be a
heading ``## N. ...`` of that file. A file of another repository is written with the repository
in front, ``owner/name:path.md`` (``ollama/ollama:docs/api.md``), and is not ours to check.
Generated outputs are checked too: the sources that the ceilings carry into the roofline JSON
and the Why page's chart labels.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from analysis.ceilings import compute_ceilings, starting_efficiencies
from analysis.hardware import spec_by_key

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("analysis", "collectors", "store", "sim", "pages", "bench", "scripts", "tests", "app.py", "README.md")
SUFFIXES = {".py", ".md", ".json", ".sh", ".toml", ".txt", ".cfg", ".ini"}
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "node_modules"}  # node_modules: tests/js's packages

CITATION = re.compile(r"(?<![\w./:-])([\w./-]+\.md)\b((?:\s*(?:,|and|to|–|-)?\s*§\d+)*)")
SECTION = re.compile(r"(to|–|-)?\s*§(\d+)")
HEADING = re.compile(r"^##\s+(\d+)\.\s", re.MULTILINE)


def scanned_files() -> Iterator[Path]:
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            yield path
            continue
        for f in sorted(path.rglob("*")):
            if f.is_file() and f.suffix in SUFFIXES and not SKIPPED_DIRS & set(f.parts) and f != Path(__file__).resolve():
                yield f


def cited_sections(text: str) -> list[int]:
    """``" §2, §3 and §5"`` -> [2, 3, 5]; ``" §2 to §4"`` -> [2, 3, 4]."""
    out: list[int] = []
    for m in SECTION.finditer(text):
        n = int(m.group(2))
        if m.group(1) and out:
            out += range(out[-1] + 1, n)
        out.append(n)
    return out


def citations(text: str) -> list[tuple[str, list[int]]]:
    return [(m.group(1), cited_sections(m.group(2))) for m in CITATION.finditer(text)]


def resolve(cited: str, citing: Path) -> Path | None:
    for base in (citing.parent, ROOT):
        path = (base / cited).resolve()
        if path.is_file() and ROOT in path.parents:
            return path
    return None


def sections_of(doc: Path) -> set[int]:
    return {int(n) for n in HEADING.findall(doc.read_text())}


def problems_in(text: str, citing: Path) -> list[str]:
    out = []
    for cited, sections in citations(text):
        doc = resolve(cited, citing)
        if doc is None:
            out.append(f"{citing.relative_to(ROOT)} cites {cited}, which the repository does not have")
            continue
        missing = sorted(set(sections) - sections_of(doc))
        if missing:
            out.append(f"{citing.relative_to(ROOT)} cites {cited} §{missing}, which has no such section")
    return out


def test_the_parser_reads_the_citation_forms_in_use() -> None:
    assert citations("(docs/physics.md §2, §3 and §5)") == [("docs/physics.md", [2, 3, 5])]
    assert citations("against docs/ollama-api.md §3 to §9.") == [("docs/ollama-api.md", [3, 4, 5, 6, 7, 8, 9])]
    assert citations("see sim/README.md; fmt.md_escape(x)") == [("sim/README.md", [])]
    assert citations("Ollama's ollama/ollama:docs/api.md examples") == []
    assert citations("[physics.md §1](physics.md)") == [("physics.md", [1]), ("physics.md", [])]
    # What the check catches: a file the project lacks, a section its file lacks.
    assert problems_in("timing (physics.md §1)", ROOT / "analysis" / "x.py") != []
    assert problems_in("timing (docs/physics.md §99)", ROOT / "analysis" / "x.py") != []
    assert problems_in("timing (docs/physics.md §1)", ROOT / "analysis" / "x.py") == []


def test_every_cited_markdown_file_and_section_exists() -> None:
    files = list(scanned_files())
    assert len(files) > 100  # the walk really saw the project
    problems = [p for f in files for p in problems_in(f.read_text(errors="replace"), f)]
    assert problems == []


@pytest.mark.parametrize("doc", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_links_between_docs_resolve(doc: Path) -> None:
    links = re.findall(r"\]\(([^)#\s]+\.md)\)", doc.read_text())
    assert all(resolve(link, doc) for link in links), links
    assert problems_in(" ".join(f"{m.group(0)}" for m in re.finditer(r"[\w-]+\.md(?:\s*§\d+)+", doc.read_text())), doc) == []


def test_generated_outputs_cite_files_that_exist() -> None:
    spec = spec_by_key("rtx-4090")
    c = compute_ceilings(
        bandwidth_bytes_s=spec.bandwidth_bytes_s,
        peak_flops=spec.fp16_flops,
        weights_bytes=4.92e9,
        params=8.03e9,
        layers=32,
        hidden=4096,
        kv_bytes_per_tok=131072,
        context_tokens=512,
        prompt_tokens=512,
        efficiencies=starting_efficiencies(spec, "Q4_K_M"),
    )
    sources = [c.efficiencies.source_bw, c.efficiencies.source_compute]
    assert all(citations(s) for s in sources), sources  # they do cite something
    assert [p for s in sources for p in problems_in(s, ROOT / "analysis" / "ceilings.py")] == []
