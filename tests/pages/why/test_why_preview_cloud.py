"""Why's preview (before any request) offers no cloud model (issue 41: run on ollama.com, no ceiling of this machine):
a pulled cloud model is listed by Ollama with a manifest's size, which would read as a model of a few hundred bytes
that fits any GPU. It is left out, and the page says so and why."""

from __future__ import annotations

import time
from pathlib import Path

from analysis.records import InstalledModel
from bench.pages_fixture import gpu_sample, status_rows
from pages.why.view import preview_choices
from sim.catalog import BY_NAME
from store.ops import PutGpuSamples, PutInstalledModels, PutLoadedModels
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.why_page import open_why

CLOUD = "gpt-oss:120b-cloud"
LOCAL = "llama3.2:latest"


def _store(data_dir: Path, now: float) -> None:
    local = BY_NAME[LOCAL]
    models = [
        InstalledModel(now, CLOUD, CLOUD, "c" * 64, 384, None, None, None, now, ("completion",)),  # its manifest's size
        InstalledModel(
            now, LOCAL, LOCAL, local.digest, local.size_bytes, local.parameter_size, local.quantization, "llama", now - 10
        ),
    ]
    w = StoreWriter(db_path(data_dir))
    try:
        w.write(PutGpuSamples([gpu_sample(now - i, 2.0) for i in range(5)]))  # an RTX 4090: 24 GiB
        w.write(PutInstalledModels(models))
        w.write(PutLoadedModels(now - 1, []))
        status_rows(w, now, data_dir)
    finally:
        w.close()


def test_a_cloud_model_is_not_offered_for_a_preview_on_this_gpu(data_dir: Path) -> None:
    now = time.time()
    _store(data_dir, now)
    choices = preview_choices(db_path(data_dir), None, now)
    assert choices is not None
    assert [m.name for m in choices.offered] == [LOCAL] and choices.cloud == [CLOUD]
    assert choices.default == LOCAL  # not the "model" of 384 bytes that fits anything
    at = open_why()
    assert [o.split(" · ")[0] for o in at.selectbox(key="why_preview_model").options] == [LOCAL]
    captions = " ".join(c.value.replace("\\", "") for c in at.caption)
    assert f"Left out: {CLOUD} (cloud: runs on ollama.com, so no ceiling of this GPU applies)" in captions
    assert not at.exception
