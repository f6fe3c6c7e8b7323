"""docs/route.md's table of vLLM's OpenAI request fields is what scripts/gen_route_fields.py reads
off the code: a field the route starts to answer (or stops refusing) lands in the docs with it."""

from __future__ import annotations

import pytest

from tests.unit.scripts.loader import load

pytest.importorskip("vllm")


def test_the_field_table_is_the_codes() -> None:
    fields = load("gen_route_fields")
    text = fields.DOC.read_text()
    assert fields.rewritten(text) == text, "stale: run scripts/gen_route_fields.py"


def test_every_field_of_vllms_requests_has_a_row_and_refusals_say_how() -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    rows = {row[0].strip("`"): row[1:] for row in load("gen_route_fields").rows()}
    assert set(rows) == set(ChatCompletionRequest.model_fields) | set(
        CompletionRequest.model_fields
    )
    assert rows["skip_special_tokens"] == (
        "yes",
        "yes",
        "400 `UNSUPPORTED_PARAMETER`, param `skip_special_tokens`",
    )
    assert rows["prompt_logprobs"] == rows["logprob_token_ids"] == ("yes", "yes", "yes")
    assert rows["suffix"][:2] == ("", "400 `UNSUPPORTED_PARAMETER` unless default")
