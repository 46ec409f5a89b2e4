"""The Why page's report block wraps its long lines at spaces (issue 42: it scrolled sideways, the GPU line cut at
its edge), over the Why page's fixture store written with the collector's own StoreWriter."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.why_page import build_store, open_why


def test_the_report_block_wraps(data_dir: Path) -> None:
    build_store(data_dir, time.time())
    at = open_why()
    at.toggle(key="why_report").set_value(True).run()
    (block,) = [c for c in at.code if c.value.startswith("Phasewatch report: ")]
    assert block.proto.wrap_lines
    assert max(len(line) for line in block.value.splitlines()) > 100  # long lines there are, to wrap
