"""A prefill worker's vLLM request hands its KV to a decode worker only when the answer goes on
after the first token: a one-token answer (every step of a beam search) ends at the prefill,
and vLLM would otherwise hold its blocks for a reader until the lease ran out (on a fake
AsyncLLM: no engine is started)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from epd.server.engine.base import Sampling
from epd.server.engine.vllm_engine import VllmEngine
from epd.server.engine.vllm_options import VllmOptions
from tests.unit.engine.test_vllm_admission import LAYOUT, PROMPT, FakeLlm, output

pytest.importorskip("vllm")


class RecordingLlm(FakeLlm):
    """Answers one token at once and records each request's vLLM SamplingParams."""

    def __init__(self) -> None:
        super().__init__()
        self.params: list[Any] = []

    async def generate(
        self, prompt: dict[str, Any], params: Any, request_id: str, priority: int = 0
    ) -> AsyncIterator[Any]:
        self.params.append(params)
        answer = output(7, finished=True)
        # NOTE: vLLM's producer returns the handle of a handed-off request's blocks
        asked = (params.extra_args or {}).get("kv_transfer_params")
        answer.kv_transfer_params = {"remote_block_ids": [0]} if asked else None
        yield answer


@pytest.mark.parametrize(("max_tokens", "hands_off"), [(1, False), (4, True)])
async def test_only_an_answer_longer_than_its_first_token_hands_off_its_kv(
    max_tokens: int, hands_off: bool
) -> None:
    llm = RecordingLlm()
    engine = VllmEngine(llm, "tiny", LAYOUT, VllmOptions(kv_role="kv_producer"))
    result = await engine.prefill("p", PROMPT, [], Sampling(max_tokens=max_tokens))
    (params,) = llm.params
    assert params.max_tokens == 1
    handoff = (params.extra_args or {}).get("kv_transfer_params")
    assert (handoff == {"do_remote_decode": True}) is hands_off
    assert (result.kv_transfer_params is not None) is hands_off
