"""/v1/completions bodies -> requests (vLLM's CompletionRequest, one prompt, echo) and vLLM's
completion logprobs (offsets, num_top + 1 candidates)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from epd.common.errors import InvalidArgument
from epd.server.route import openai_completions as completions
from epd.v1 import generation_pb2 as g

BODY = {"model": "tiny", "prompt": "The sea is", "max_tokens": 4}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_a_text_prompt_is_tokenised_without_a_template_and_echoed_when_asked(
    tokenizer: Any,
) -> None:
    request, prompt = completions.to_completion_request(BODY, "tiny", tokenizer)
    assert request.prompt_token_ids == tokenizer("The sea is")["input_ids"]
    assert request.messages == [] and prompt.echo is None
    _, echoed = completions.to_completion_request({**BODY, "echo": True}, "tiny", tokenizer)
    assert echoed.echo == "The sea is"
    request, _ = completions.to_completion_request({**BODY, "max_tokens": None}, "tiny", tokenizer)
    assert request.sampling.max_tokens == 16


def test_token_ids_go_as_they_are(tokenizer: Any) -> None:
    body = {**BODY, "prompt": [5, 6, 7], "echo": True}
    request, prompt = completions.to_completion_request(body, "tiny", tokenizer)
    assert request.prompt_token_ids == [5, 6, 7]
    assert prompt.echo == tokenizer.decode([5, 6, 7])


@pytest.mark.parametrize(
    ("fields", "param", "reason"),
    [
        ({"prompt": ["a", "b"]}, "prompt", "UNSUPPORTED_PARAMETER"),
        ({"prompt": [5, 10**6]}, "prompt", "BAD_REQUEST"),
        ({"echo": True, "logprobs": 1}, "echo", "UNSUPPORTED_PARAMETER"),
        ({"suffix": "!"}, "suffix", "UNSUPPORTED_PARAMETER"),
        ({"max_tokens": -1}, "max_tokens", "BAD_REQUEST"),
    ],
)
def test_what_epd_or_vllm_refuses_is_refused_by_name(
    tokenizer: Any, fields: dict[str, Any], param: str, reason: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        completions.to_completion_request({**BODY, **fields}, "tiny", tokenizer)
    assert (caught.value.reason, caught.value.metadata["param"]) == (reason, param)


def test_completion_logprobs_are_vllms_with_offsets_and_one_more_candidate() -> None:
    positions = [
        g.TokenLogprobs(
            candidates=[
                g.Logprob(token_id=1, logprob=-0.5, rank=2, token="ab"),
                g.Logprob(token_id=2, logprob=-0.1, rank=1, token="c"),
                g.Logprob(token_id=3, logprob=-2.0, rank=3, token="d"),
            ]
        ),
        g.TokenLogprobs(candidates=[g.Logprob(token_id=4, logprob=-0.2, rank=1)]),
    ]
    body = completions.completion_logprobs_json(positions, 1, lambda t: f"<{t}>", 10)
    assert body["tokens"] == ["ab", "<4>"]
    assert body["text_offset"] == [10, 12]
    assert body["token_logprobs"] == [-0.5, pytest.approx(-0.2)]
    assert body["top_logprobs"][0] == {"ab": -0.5, "c": pytest.approx(-0.1)}
