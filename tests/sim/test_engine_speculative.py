"""Speculative decoding on the real runner (issue 41): ``python -m sim --engine llama-server --draft-gguf PATH`` starts
llama-server with a draft model, as a model that ships one runs. The collector's discovery reads the draft and the
speculative settings from the child's own command line, and the child's timing block says what it accepted, in the
form ``analysis.speculative`` reads."""

from __future__ import annotations

import ollama
import pytest

from analysis.speculative import Speculation, acceptance_of_text, tokens_per_step
from collectors.ollama.discovery import runner_from_argv
from tests.support.engine_process import GREEDY, MODEL, engine_state, require_llama_server, start_server_engine

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(300)]

DRAFT_MAX = 4


def test_a_drafting_runners_settings_and_acceptance() -> None:
    _, gguf = require_llama_server()
    # The model as its own draft: the smallest pair there is here, and one that accepts most of what it drafts.
    with start_server_engine("--draft-gguf", str(gguf), "--draft-max", str(DRAFT_MAX)) as sim:
        reply = ollama.Client(host=sim.base_url).generate(
            model=MODEL, prompt="Count: one, two, three, four,", options={**GREEDY, "num_predict": 16}
        )
        assert reply.eval_count and reply.eval_count > 1
        child = engine_state(sim)["runner"]
        runner = runner_from_argv(child["pid"], "llama-server", child["argv"])
        assert runner is not None
        assert runner.speculation == Speculation(str(gguf), ("draft-simple",), DRAFT_MAX, None)
        said = [a for line in sim.log().splitlines() if (a := acceptance_of_text(line)) is not None]
        assert len(said) == 1, said
        (one,) = said
        assert 0 < one.accepted_tokens <= one.drafted_tokens
        per_step = tokens_per_step(runner.speculation, one)
        assert per_step is not None and per_step.measured
        assert 1.0 <= per_step.tokens <= 1 + DRAFT_MAX, "a step yields its own token and at most the drafted ones"
