"""Workers killed under load (this module runs last in the package, its name sorting last): an
encoder and a decode worker SIGKILLed, then the other decode worker SIGTERMed, cost no request
(their streams resume through the other decode worker, token for token); a decode worker whose
prefill worker died before it read the KV fails its stream UNAVAILABLE KV_LOAD_FAILED (never a
short answer)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from epd.common.channels import create_channel
from epd.common.clients import DecodeClient, PrefillClient
from epd.common.errors import Unavailable
from epd.server.engine.base import KV_LOAD_FAILED
from epd.v1 import decode_service_pb2 as decode_pb
from epd.v1 import generation_pb2
from epd.v1 import prefill_service_pb2 as prefill_pb
from tests.integration.e2e.launcher import Stack
from tests.integration.e2e.stack_e2e.checks import reference_tokens
from tests.integration.e2e.stack_e2e.faults import KILLED, load, wait_until_restarted
from tests.pictures import picture

pytestmark = pytest.mark.vllm


def test_decode_workers_killed_and_drained_under_load_fail_no_request(
    stack: Stack, tiny_model_dir: Path
) -> None:
    """Runs after every other module of the package. Under load, encode0 and the first decode
    worker are SIGKILLed (their streams resume through the other decode worker); once the
    launcher has both decode workers serving again, the second is SIGTERMed under load (its
    streams finish or resume). Every answer equals its reference, those resumed mid-stream too."""
    max_tokens = 24
    images = [picture(100 + i) for i in range(12)]

    def kill_encode0_and_decode0() -> None:
        os.kill(stack.pids["encode0"], signal.SIGKILL)
        os.kill(stack.pids["decode"], signal.SIGKILL)
        KILLED.update({"encode0", "decode"})

    answers = asyncio.run(load(stack, images, max_tokens, kill_encode0_and_decode0))
    asyncio.run(wait_until_restarted(stack, "decode", "decode0", 240))
    more = [picture(200 + i) for i in range(12)]
    answers += asyncio.run(
        load(stack, more, max_tokens, lambda: os.kill(stack.pids["decode1"], signal.SIGTERM))
    )
    for image, answer in zip(images + more, answers, strict=True):
        assert answer == reference_tokens(tiny_model_dir, [image], max_tokens)


def test_a_decode_worker_whose_prefill_worker_died_before_its_kv_was_read_fails_unavailable(
    stack: Stack,
) -> None:
    """Runs after the decode kills. The prefill worker (and its engine) is SIGKILLed after its
    Prefill returned, before a decode worker read the KV: the Decode stream fails UNAVAILABLE
    KV_LOAD_FAILED (which the route resumes on another prefill worker), never a short answer."""
    prompt = generation_pb2.Prompt(token_ids=list(range(100, 140)))
    sampling = generation_pb2.SamplingParams(max_tokens=8, ignore_eos=True)

    async def prefill_kill_decode() -> list[int]:
        async with (
            create_channel(stack.endpoints["prefill"]) as p_channel,
            create_channel(stack.endpoints["decode"]) as d_channel,
        ):
            first = await PrefillClient(p_channel, "prefill").Prefill(
                prefill_pb.PrefillRequest(request_id="lost-kv", prompt=prompt, sampling=sampling),
                timeout=60,
            )
            os.killpg(stack.pids["prefill"], signal.SIGKILL)
            KILLED.add("prefill")
            decode = DecodeClient(d_channel, "decode").Decode(
                decode_pb.DecodeRequest(
                    request_id="lost-kv",
                    prompt_token_ids=prompt.token_ids,
                    sampling=sampling,
                    first_token_id=first.first_token_id,
                    kv_handle=first.kv_handle,
                ),
                timeout=120,
            )
            return [t async for response in decode for t in response.token_ids]

    with pytest.raises(Unavailable) as caught:
        asyncio.run(prefill_kill_decode())
    assert caught.value.reason == KV_LOAD_FAILED
