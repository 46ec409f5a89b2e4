"""One rule for "the same model": Ollama's model names.

A name is ``[host[:port]/][namespace/]model[:tag]`` (optionally ``scheme://`` before the host and
``@digest`` after); the parts left out take Ollama's defaults: host ``registry.ollama.ai``, namespace
``library``, tag ``latest``. The tag is what follows the last ``:`` when no ``/`` comes after it, so
``localhost:5000/llama`` has no tag (its ``:5000`` is a port) and means ``localhost:5000/llama:latest``.
Like Ollama, names compare without regard to case.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"

V = TypeVar("V")


@dataclass(frozen=True)
class ModelName:
    host: str
    namespace: str
    model: str
    tag: str

    def __str__(self) -> str:
        return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"


def parse_model_name(name: str) -> ModelName:
    """The parts of a model name, defaults filled in, lower case."""
    s = name.strip().lower()
    s = s.split("@", 1)[0]  # a digest pins the same name
    tag = ""
    if s.rfind(":") > s.rfind("/"):
        s, tag = s.rsplit(":", 1)
    parts = s.split("/")
    model = parts[-1]
    namespace = parts[-2] if len(parts) >= 2 else ""
    host = "/".join(parts[:-2]) if len(parts) >= 3 else ""
    host = host.split("://", 1)[-1]
    return ModelName(host or DEFAULT_HOST, namespace or DEFAULT_NAMESPACE, model, tag or DEFAULT_TAG)


def same_model(a: str, b: str) -> bool:
    """Whether two names (as clients, /api/ps or /api/tags spell them) mean the same model."""
    return parse_model_name(a) == parse_model_name(b)


def value_for_model(by_name: Mapping[str, V], name: str) -> V | None:
    """The value under any spelling of ``name`` (``llama3.2`` finds ``llama3.2:latest``); None where there is none."""
    wanted = parse_model_name(name)
    return next((v for k, v in by_name.items() if v is not None and parse_model_name(k) == wanted), None)


CLOUD_TAG = "cloud"


def is_cloud(name: str) -> bool:
    """Whether ``name`` is one of Ollama's cloud models (run on ollama.com, no local runner): its tag is ``cloud``
    (``glm-4.6:cloud``) or ends in ``-cloud`` (``gpt-oss:120b-cloud``)."""
    tag = parse_model_name(name).tag
    return tag == CLOUD_TAG or tag.endswith("-" + CLOUD_TAG)
