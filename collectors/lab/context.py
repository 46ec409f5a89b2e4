"""What an experiment body gets: the client, the model, prompts, and a place to put points."""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from analysis.model_names import same_model
from collectors.lab.client import LabClient, Probe
from collectors.lab.prompts import TokenEstimator, prompt_of
from collectors.lab.results import ExperimentResult

DEFAULT_CONTEXT_TOKENS = 2048  # Ollama's historical default, used when the server tells nothing


@dataclass
class LabContext:
    client: LabClient
    model: str
    result: ExperimentResult
    rng: random.Random
    num_ctx: int | None = None  # passed to every request when the user chose one
    estimator: TokenEstimator = field(default_factory=TokenEstimator)
    on_update: Callable[[ExperimentResult], None] | None = None
    context_tokens: int | None = None  # the context each request gets, once known

    # -- progress and points ------------------------------------------------------------------
    def notify(self) -> None:
        if self.on_update is not None:
            self.on_update(self.result)

    def set_total(self, total: int) -> None:
        self.result.progress.total = total
        self.notify()

    def step(self, message: str) -> None:
        self.result.progress.done += 1
        self.result.progress.message = message
        self.notify()

    def say(self, message: str) -> None:
        self.result.progress.message = message
        self.notify()

    def add_point(self, point: dict[str, Any]) -> None:
        self.result.points.append(point)
        self.notify()

    # -- requests ---------------------------------------------------------------------------
    def options(self, num_predict: int) -> dict[str, Any]:
        opts: dict[str, Any] = {"num_predict": num_predict}
        if self.num_ctx is not None:
            opts["num_ctx"] = self.num_ctx
        return opts

    async def generate(
        self, prompt: str, num_predict: int, *, probe: Probe | None = None, on_token: Callable[[Probe], None] | None = None
    ) -> Probe:
        # raw: no chat template, so the server counts the words we sent and nothing else.
        body = {"model": self.model, "prompt": prompt, "raw": True, "options": self.options(num_predict)}
        return await self.client.stream("/api/generate", body, probe=probe, on_token=on_token)

    async def chat(
        self,
        messages: list[dict[str, str]],
        num_predict: int,
        *,
        probe: Probe | None = None,
        on_token: Callable[[Probe], None] | None = None,
    ) -> Probe:
        body = {"model": self.model, "messages": messages, "options": self.options(num_predict)}
        return await self.client.stream("/api/chat", body, probe=probe, on_token=on_token)

    def fresh_prompt(self, n_tokens: int) -> tuple[str, int]:
        """Random words led by a tag no earlier prompt had, so no slot's prompt cache shares even a prefix.

        The tag is not drawn from the seeded generator: two runs with the same seed must not hit
        each other's cache either.
        """
        text, words = prompt_of(max(1, n_tokens - 3), self.rng, self.estimator)
        return f"{secrets.token_hex(4)}: {text}", words + 2

    async def warm_up(self) -> Probe:
        """Load the model (outside any measured point) and learn the words-per-token ratio."""
        self.say("loading the model")
        prompt, words = self.fresh_prompt(64)
        probe = await self.generate(prompt, 1)
        self.estimator.learn(words, probe.prompt_tokens)
        await self.learn_context()
        return probe

    async def learn_context(self) -> int:
        """The context one request gets: the user's num_ctx, else what /api/ps says is loaded."""
        if self.num_ctx is not None:
            self.context_tokens = self.num_ctx
        else:
            loaded = [m for m in await self.client.ps() if same_model(str(m.get("name") or m.get("model")), self.model)]
            ctx = loaded[0].get("context_length") if loaded else None
            if not ctx:
                ctx = self.result.model_facts.get("context_length")
            self.context_tokens = int(ctx) if ctx else DEFAULT_CONTEXT_TOKENS
            if loaded:
                self.result.model_facts["loaded_context_length"] = loaded[0].get("context_length")
                self.result.model_facts["size_vram_bytes"] = loaded[0].get("size_vram")
                self.result.model_facts["loaded_size_bytes"] = loaded[0].get("size")
        self.result.summary["context_tokens"] = self.context_tokens
        return self.context_tokens

    def prompt_cap(self, reserve_tokens: int) -> int:
        """Largest prompt (in tokens) that fits the context with room for the reply and estimate error."""
        ctx = self.context_tokens or DEFAULT_CONTEXT_TOKENS
        return int((ctx - reserve_tokens) * 0.9)
