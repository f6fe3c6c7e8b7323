"""Random JSON at the real OpenAI HTTP endpoint: never a 5xx, and every error a JSON error object.

The endpoint runs in a thread on its own event loop (the property test is synchronous) over a
worker that serializes each request as the gRPC hop would, then streams a short answer.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epd.server.route.openai_http import OpenAiHttp
from epd.server.route.request import ChatRequest
from epd.server.route.router import RouteChunk
from epd.v1 import generation_pb2

VALID = {
    "model": "tiny",
    "max_tokens": 4,
    "messages": [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is it?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
    ],
}


class EchoWorker:
    """A Router stand-in: serializes what the hops send of the request (its sampling, its
    strings as UTF-8), answers 'ab'."""

    model_id = "tiny"

    async def generate(
        self, request: ChatRequest, timeout_s: float | None = None
    ) -> AsyncIterator[RouteChunk]:
        request.sampling.SerializeToString()
        texts = [part.text or "" for message in request.messages for part in message.parts]
        "".join([request.model, request.request_id, *texts]).encode()
        yield RouteChunk("a", [1])
        usage = generation_pb2.Usage(prompt_tokens=3, completion_tokens=2)
        yield RouteChunk("b", [2], generation_pb2.FINISH_REASON_LENGTH, usage)


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    http = OpenAiHttp(EchoWorker())  # type: ignore[arg-type]
    yield asyncio.run_coroutine_threadsafe(http.start("127.0.0.1", 0), loop).result(10)
    asyncio.run_coroutine_threadsafe(http.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def post(port: int, payload: bytes) -> tuple[int, str, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Content-Type": "application/json"}
        connection.request("POST", "/v1/chat/completions", payload, headers)
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        connection.close()


def assert_well_answered(port: int, payload: bytes) -> None:
    """No 5xx; an error is an OpenAI error object; a success is a completion or an SSE stream."""
    status, content_type, answer = post(port, payload)
    assert status < 500, answer[:500]
    if status >= 400:
        error = json.loads(answer)["error"]
        assert error["type"] == "invalid_request_error" and error["message"], error
        assert {"param", "code"} <= error.keys()
    elif content_type.startswith("text/event-stream"):
        assert answer.endswith(b"data: [DONE]\n\n") and b'"error"' not in answer, answer[:500]
    else:
        assert json.loads(answer)["choices"][0]["message"]["content"] == "ab"


STRINGS = st.text(max_size=8) | st.sampled_from(["\ud800", "a\udfffb", "user", "text", ""])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([2**40, 2**64, 2**70, -(2**63) - 1, 10**400])
    | st.floats()
    | STRINGS
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(STRINGS, inner, max_size=4),
    max_leaves=16,
)
KEYS = [
    *VALID,
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "stream",
    "stream_options",
    "n",
    "tools",
    "max_completion_tokens",
    "user",
]


@st.composite
def mutated(draw: st.DrawFn) -> Any:
    """The valid body with one value (top level, a message, a part or a field of one) replaced."""
    body = json.loads(json.dumps(VALID))
    user = body["messages"][1]
    target = draw(
        st.sampled_from(
            [
                body,
                body["messages"],
                user,
                user["content"][0],
                user["content"][1],
                user["content"][1]["image_url"],
            ]
        )
    )
    if isinstance(target, list):
        target[draw(st.integers(0, len(target) - 1))] = draw(JSON)
    else:
        keys = [*target, *KEYS] if target is body else [*target, "extra"]
        target[draw(st.sampled_from(keys))] = draw(JSON)
    if draw(st.booleans()):
        body["stream"] = True
    return body


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(mutated(), JSON))
def test_random_json_never_gets_a_5xx(port: int, body: Any) -> None:
    assert_well_answered(port, json.dumps(body).encode())


@settings(max_examples=30, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_never_get_a_5xx(port: int, payload: bytes) -> None:
    assert_well_answered(port, payload)


def test_the_valid_body_streams_and_completes(port: int) -> None:
    assert_well_answered(port, json.dumps(VALID).encode())
    assert_well_answered(port, json.dumps({**VALID, "stream": True}).encode())


@pytest.mark.parametrize(
    "payload",
    [
        json.dumps({**VALID, "max_tokens": -1}),
        json.dumps({**VALID, "temperature": "hot"}),
        json.dumps({**VALID, "seed": 2**70}),
        json.dumps({**VALID, "stop_token_ids": [2**40]}),
        json.dumps({**VALID, "messages": [{"role": "user", "content": "\ud800"}]}),
        json.dumps({**VALID, "stream_options": ["x"]}),
    ],
)
def test_values_that_used_to_be_a_500_are_a_400(port: int, payload: str) -> None:
    status, _, answer = post(port, payload.encode())
    assert status == 400 and json.loads(answer)["error"]["param"], answer[:500]


def test_json_nested_100000_deep_is_a_400(port: int) -> None:
    """json.loads raises RecursionError on it: the HTTP front must parse without recursing."""
    status, _, answer = post(port, b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and json.loads(answer)["error"]["type"] == "invalid_request_error"
