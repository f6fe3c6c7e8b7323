"""The stack's answers: two images through the SDK and through the ``openai`` client equal the
monolithic reference token for token; the SDK's request makes one span tree across every
service."""

from __future__ import annotations

from pathlib import Path

import pytest

from epd.client import EpdClient, user
from epd.common.telemetry import FIRST_TOKEN_EVENT
from epd.server.engine.reference import ReferenceEngine
from tests.integration.e2e.launcher import Stack
from tests.integration.e2e.stack_e2e.checks import QUESTION, reference_tokens, span_tree
from tests.pictures import data_url, picture, png

pytestmark = pytest.mark.vllm


def test_two_images_through_the_sdk_equal_the_reference(stack: Stack, tiny_model_dir: Path) -> None:
    images = [picture(1, 96, 64), picture(2, 60, 90)]
    with EpdClient(stack.route, timeout_s=240) as client:
        answer = client.generate(
            [user(QUESTION, images=[png(i) for i in images])],
            max_tokens=6,
            ignore_eos=True,
            request_id="e2e-two-images",
        )
        assert client.list_models() == ["tiny"]
    assert answer.token_ids == reference_tokens(tiny_model_dir, images, 6)
    assert answer.finish_reason == "length" and answer.usage.completion_tokens == 6


def test_one_request_makes_one_span_tree_across_every_service(stack: Stack) -> None:
    tree = span_tree(stack, "e2e-two-images")
    (root,) = [s for s in tree if s["name"] == "/epd.v1.RouteService/Generate"]
    by_id = {s["context"]["span_id"]: s for s in tree}
    servers = [s for s in tree if s["kind"] == "SpanKind.SERVER" and s is not root]
    for span in servers:  # every server span hangs off a route client span under the root
        assert span["parent_id"] in by_id, f"no client span for {span['name']}"
        client = by_id[span["parent_id"]]
        assert client["resource"]["attributes"]["service.name"] == "epd-route"
        assert client["parent_id"] == root["context"]["span_id"]
    services = {s["resource"]["attributes"]["service.name"] for s in servers}
    assert services == {"epd-scheduler", "epd-encode", "epd-prefill", "epd-decode"}
    names = {s["name"].rsplit("/", 1)[1] for s in servers}
    assert {"Place", "Encode", "Prefill", "Decode", "Release"} <= names
    assert not names & {"AssignEncoders", "ChoosePrefill", "ChooseDecode"}, "one scheduler call"
    assert root["attributes"]["epd.images"] == 2 and root["attributes"]["epd.decode_id"]
    assert [event["name"] for event in root["events"]] == [FIRST_TOKEN_EVENT]


def test_openai_client_with_two_images_equals_the_reference(
    stack: Stack, tiny_model_dir: Path
) -> None:
    import openai

    images = [picture(11, 80, 64), picture(12, 64, 80)]
    client = openai.OpenAI(base_url=stack.endpoints["http"], api_key="-", timeout=240)
    content = [
        *({"type": "image_url", "image_url": {"url": data_url(i)}} for i in images),
        {"type": "text", "text": QUESTION},
    ]
    completion = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": content}],
        max_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    expected = ReferenceEngine(tiny_model_dir).processor.tokenizer.decode(
        reference_tokens(tiny_model_dir, images, 6), skip_special_tokens=True
    )
    assert completion.choices[0].message.content == expected
    assert completion.usage is not None and completion.usage.completion_tokens == 6
