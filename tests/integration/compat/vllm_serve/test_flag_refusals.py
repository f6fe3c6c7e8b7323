"""What ``vllm serve`` refuses without its flags (auto tool choice, a request's chat template, a
request's media kwargs), epd refuses with vLLM's message."""

from __future__ import annotations

from typing import Any

import pytest

from epd.server.route.tools import AUTO_NEEDS_FLAGS, UNTRUSTED_TEMPLATE
from tests.integration.compat.vllm_serve.bodies import GREEDY, PARTS_TEMPLATE, TOOL_GREEDY
from tests.integration.compat.vllm_serve.exchange import post
from tests.integration.compat.vllm_serve.servers import FLAGLESS

pytestmark = pytest.mark.vllm


async def test_auto_without_the_flags_is_refused_as_vllm_refuses_it(
    vllm_url: str, epd_url: str
) -> None:
    """vLLM without --enable-auto-tool-choice answers 400 with this message (this vLLM has the
    flags, and answers)."""
    vllm_status, _ = await post(vllm_url, TOOL_GREEDY)
    status, answer = await post(FLAGLESS[epd_url], TOOL_GREEDY)
    assert (vllm_status, status, answer["error"]["message"]) == (200, 400, AUTO_NEEDS_FLAGS)


async def test_a_request_template_without_the_trust_flag_is_refused_as_vllm_refuses_it(
    vllm_url: str, epd_url: str
) -> None:
    """vLLM without --trust-request-chat-template answers 400 with this message (this vLLM has
    the flag, and answers)."""
    body = {**GREEDY, "chat_template": PARTS_TEMPLATE}
    vllm_status, _ = await post(vllm_url, body)
    status, answer = await post(FLAGLESS[epd_url], body)
    assert (vllm_status, status, answer["error"]["message"]) == (200, 400, UNTRUSTED_TEMPLATE)


@pytest.mark.parametrize(
    ("field", "value"),
    [("mm_processor_kwargs", {"fps": 1}), ("media_io_kwargs", {"video": {"num_frames": 16}})],
)
async def test_untrusted_media_kwargs_are_refused_as_vllm_refuses_them(
    vllm_url: str, epd_url: str, field: str, value: dict[str, Any]
) -> None:
    """Neither server runs with --trust-request-mm-kwargs: a request's own kwargs are refused
    with vLLM's message, an image request as any other."""
    body = {**GREEDY, field: value}
    vllm_status, expected = await post(vllm_url, body)
    status, answer = await post(epd_url, body)
    assert (vllm_status, status) == (400, 400), (expected, answer)
    assert answer["error"]["message"] in expected["error"]["message"]
    assert answer["error"]["param"] == field
