"""One source for what the pages say of Ollama: the sidebar's line and the "Ollama is not answering" panel are
drawn from the same ``OllamaState``, made from the same reading of the store (no "not polled yet" beside "not
answering since 00:34")."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from collectors.api import LaunchState, LaunchStatus
from pages.shared import data


class OllamaKind(Enum):
    UP = "up"  # its last poll answered
    DOWN = "down"  # its last poll failed
    STARTING = "starting"  # not polled yet: the collector (or the demo) is starting and will poll it
    UNWATCHED = "unwatched"  # not polled, and nothing will: the collector failed to start, or may not be started


@dataclass(frozen=True)
class OllamaState:
    kind: OllamaKind
    address: str  # the URL polled (or to be polled); the demo's upstream in words before its first poll
    version: str | None = None  # with UP
    down_since_unix_s: float | None = None  # with DOWN: the first failed poll after the last answer
    error: str | None = None  # with DOWN: the last poll's error


def ollama_state(status: data.Status, launch: LaunchState, configured_url: str) -> OllamaState:
    """What the store's last poll says of Ollama, or, before any poll, whether one is coming."""
    polled = status.ollama
    if polled is not None and polled.up:
        return OllamaState(OllamaKind.UP, polled.base_url, version=polled.version)
    if polled is not None:
        since = status.ollama_down_since_unix_s
        return OllamaState(OllamaKind.DOWN, polled.base_url, down_since_unix_s=since, error=polled.error)
    coming = launch.state in (LaunchStatus.STARTING, LaunchStatus.RUNNING)
    return OllamaState(OllamaKind.STARTING if coming else OllamaKind.UNWATCHED, configured_url)
