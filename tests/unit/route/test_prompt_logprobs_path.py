"""The prompt's log probabilities come from the prefill worker in every topology and reach the
route's first chunk of the answer only: E/PD (PrefillDecode's first response) and E/P/D
(PrefillResponse, before the decode worker's stream)."""

from __future__ import annotations

import pytest

from epd.common.roles import Role
from epd.v1 import generation_pb2
from tests.unit.route.fake_engines import FakeEngine
from tests.unit.route.fake_scheduler import FakeScheduler
from tests.unit.route.fakes import FakePeers, generate, text_router

POSITIONS = [
    generation_pb2.TokenLogprobs(),
    generation_pb2.TokenLogprobs(
        candidates=[generation_pb2.Logprob(token_id=2, logprob=-1.25, rank=3, token="2")]
    ),
]


@pytest.mark.parametrize(
    ("scheduler", "prefill"),
    [
        (FakeScheduler(encoders=[], prefills=[("pd0", Role.PREFILL_DECODE)]), "pd0"),
        (FakeScheduler(encoders=[], prefills=[("p0", Role.PREFILL)], decoders=["dec0"]), "p0"),
    ],
    ids=["e-pd", "e-p-d"],
)
async def test_the_prompts_logprobs_reach_the_first_chunk_alone(
    scheduler: FakeScheduler, prefill: str
) -> None:
    peers = FakePeers(scheduler, engines={prefill: FakeEngine(prompt_logprobs=POSITIONS)})
    chunks = await generate(text_router(peers), "tiny")
    assert [t for chunk in chunks for t in chunk.token_ids] == [7, 8, 9]
    assert chunks[0].prompt_logprobs == POSITIONS
    assert all(not chunk.prompt_logprobs for chunk in chunks[1:])
