"""Where the app finds its data and its collector: environment variables, resolved once. No Streamlit.

``PHASEWATCH_DATA`` (data folder), ``OLLAMA_HOST``, ``PHASEWATCH_LISTEN`` and
``PHASEWATCH_DEMO`` mean what they mean to ``python -m collectors``.
``PHASEWATCH_DEMO=engine`` starts the demo on the real llama.cpp engine (Gemma 3 270M on
this CPU) instead of the simulator, when it is installed.
``PHASEWATCH_COLLECTOR=off`` stops the app from starting a collector itself
(for tests and for a collector run as a service under another user).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from collectors.api import DEFAULT_LISTEN, SettingsError, default_data_dir, ollama_base_url, parse_listen

DEMO_SUBDIR = "demo"  # demo recordings never mix with real ones
DEMO_ENGINE_SUBDIR = "demo-engine"  # nor do the real engine's demo recordings with the simulator's
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class AppSettings:
    data_dir: Path  # real recordings
    ollama_url: str
    listen: str
    start_collector: bool
    demo_at_start: bool
    problem: str | None = None  # a setting that could not be used, in one line
    demo_engine_at_start: bool = False  # PHASEWATCH_DEMO=engine: the demo runs the real llama.cpp engine

    @property
    def demo_data_dir(self) -> Path:
        return self.data_dir / DEMO_SUBDIR

    @property
    def demo_engine_data_dir(self) -> Path:
        return self.data_dir / DEMO_ENGINE_SUBDIR


def resolve_settings(env: Mapping[str, str] | None = None) -> AppSettings:
    """Read the environment; a bad value becomes ``problem`` and the default is used instead."""
    env = os.environ if env is None else env
    problem: str | None = None
    data_text = env.get("PHASEWATCH_DATA", "").strip()
    data_dir = Path(data_text).expanduser() if data_text else default_data_dir()
    try:
        ollama_url = ollama_base_url(env.get("OLLAMA_HOST"))
    except SettingsError as exc:
        problem, ollama_url = str(exc), ollama_base_url(None)
    try:
        listen = str(parse_listen(env.get("PHASEWATCH_LISTEN") or DEFAULT_LISTEN))
    except SettingsError as exc:
        problem, listen = str(exc), DEFAULT_LISTEN
    demo_text = env.get("PHASEWATCH_DEMO", "").strip().lower()
    return AppSettings(
        data_dir=data_dir,
        ollama_url=ollama_url,
        listen=listen,
        start_collector=env.get("PHASEWATCH_COLLECTOR", "auto").strip().lower() not in {"0", "off", "no", "false"},
        demo_at_start=demo_text in _TRUE or demo_text == "engine",
        problem=problem,
        demo_engine_at_start=demo_text == "engine",
    )


def client_host_line(listen: str) -> str:
    """The one line that points a client at the proxy."""
    return f"OLLAMA_HOST={listen}"
