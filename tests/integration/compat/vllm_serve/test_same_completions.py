"""``/v1/completions`` bodies sent to ``vllm serve`` and to epd: the same answers (text, logprobs,
prompt logprobs, usage), the same refusals, the same token ids."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.compat.vllm_serve.bodies import LONG_PROMPT, PROMPT, SPECIALS
from tests.integration.compat.vllm_serve.exchange import assert_same_prompt_logprobs, post, streamed

pytestmark = pytest.mark.vllm


# (name, body): /v1/completions answers alike.
SAME_COMPLETION: list[tuple[str, dict[str, Any]]] = [
    ("text", PROMPT),
    ("token_ids", {**PROMPT, "prompt": [100, 200, 300, 50]}),
    ("one_prompt_in_a_list", {**PROMPT, "prompt": ["The sea is"]}),
    ("echo", {**PROMPT, "echo": True}),
    (
        "ignored_fields",
        {
            **PROMPT,
            "session_id": "s-1",
            "return_token_offsets": True,
            "kv_transfer_params": {"do_remote_decode": True},
        },
    ),
    ("logprobs", {**PROMPT, "logprobs": 2}),
    ("default_max_tokens", {**PROMPT, "max_tokens": None, "ignore_eos": True}),
    ("n_seeded", {**PROMPT, "n": 2, "temperature": 1.0, "seed": 8}),
    ("stop", {**PROMPT, "max_tokens": 16, "stop": ["e"]}),
    ("json", {**PROMPT, "response_format": {"type": "json_object"}}),
    ("prompt_list", {**PROMPT, "prompt": ["The sea is", "A cat"]}),
    (
        "token_prompts_n",
        {**PROMPT, "prompt": [[100, 200], [300, 50, 7]], "n": 2, "temperature": 1.0, "seed": 3},
    ),
    ("echo_logprobs", {**PROMPT, "echo": True, "logprobs": 2}),
    ("echo_only", {**PROMPT, "echo": True, "logprobs": 1, "max_tokens": 0}),
    ("prompt_logprobs", {**PROMPT, "prompt_logprobs": 3}),
    ("tokens_as_ids", {**PROMPT, "logprobs": 1, "return_tokens_as_token_ids": True}),
    ("logprob_token_ids", {**PROMPT, "logprobs": 1, "logprob_token_ids": [60, 61, 62]}),
    ("echo_logprob_token_ids", {**PROMPT, "echo": True, "logprobs": 2, "logprob_token_ids": [60]}),
    ("special_tokens", {**PROMPT, "skip_special_tokens": False, "logit_bias": SPECIALS}),
    ("truncate_prompt_tokens", {**PROMPT, "prompt": LONG_PROMPT, "truncate_prompt_tokens": 4}),
    (
        "truncate_prompt_tokens_right",
        {**PROMPT, "prompt": LONG_PROMPT, "truncate_prompt_tokens": 4, "truncation_side": "right"},
    ),
    ("truncate_prompt_tokens_context", {**PROMPT, "truncate_prompt_tokens": -1}),
    (
        "echo_truncated",
        {**PROMPT, "prompt": LONG_PROMPT, "truncate_prompt_tokens": 3, "echo": True, "logprobs": 1},
    ),
    ("beam_search", {**PROMPT, "use_beam_search": True, "n": 3}),
    (
        "beam_search_prompts",
        {**PROMPT, "prompt": ["The sea is", "A cat"], "use_beam_search": True, "n": 2}
        | {"length_penalty": 1.5, "max_tokens": 12},
    ),
    ("beam_search_echo", {**PROMPT, "use_beam_search": True, "n": 2, "echo": True}),
    ("beam_search_logprobs", {**PROMPT, "use_beam_search": True, "n": 3, "logprobs": 2}),
    (
        "beam_search_truncated",
        {**PROMPT, "prompt": LONG_PROMPT, "truncate_prompt_tokens": 4, "use_beam_search": True},
    ),
]


@pytest.mark.parametrize(("name", "body"), SAME_COMPLETION, ids=[c[0] for c in SAME_COMPLETION])
async def test_the_same_completion_body_gets_the_same_answer(
    vllm_url: str, epd_url: str, name: str, body: dict[str, Any]
) -> None:
    vllm_status, expected = await post(vllm_url, body, "completions")
    status, answer = await post(epd_url, body, "completions")
    assert (status, vllm_status) == (200, 200), (answer, expected)

    def shown(reply: dict[str, Any]) -> list[tuple[Any, ...]]:
        choices = sorted(reply["choices"], key=lambda c: c["index"])
        return [
            (
                c["text"],
                c["finish_reason"],
                c["logprobs"] and (c["logprobs"]["tokens"], c["logprobs"]["text_offset"]),
                c["logprobs"] and [t and sorted(t) for t in c["logprobs"]["top_logprobs"]],
            )
            for c in choices
        ]

    assert shown(answer) == shown(expected)
    assert_same_prompt_logprobs(answer, expected)
    values = [
        [v for c in r["choices"] for v in (c["logprobs"] or {}).get("token_logprobs", [])]
        for r in (answer, expected)
    ]
    assert values[0] == pytest.approx(values[1], abs=1e-3)
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert answer["usage"][key] == expected["usage"][key], key


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("no_prompt", {**PROMPT, "prompt": None}),
        ("negative_max_tokens", {**PROMPT, "max_tokens": -1}),
        ("suffix", {**PROMPT, "suffix": "!"}),
        ("prompt_embeds", {**PROMPT, "prompt": None, "prompt_embeds": "AAAA"}),
        ("logprobs_beyond_the_limit", {**PROMPT, "logprobs": 100}),
        ("token_beyond_the_vocabulary", {**PROMPT, "prompt": [100, 9396]}),
        ("truncate_beyond_the_context", {**PROMPT, "truncate_prompt_tokens": 100000}),
        ("truncate_to_nothing", {**PROMPT, "truncate_prompt_tokens": 0}),
        ("logprob_token_ids_without_logprobs", {**PROMPT, "logprob_token_ids": [60]}),
        (
            "echo_only_logprob_token_ids",
            {**PROMPT, "echo": True, "max_tokens": 0, "logprobs": 1, "logprob_token_ids": [60]},
        ),
        (
            "logprob_token_ids_beyond_the_vocabulary",
            {**PROMPT, "logprobs": 1, "logprob_token_ids": [9396]},
        ),
        ("beam_search_streamed", {**PROMPT, "use_beam_search": True, "stream": True}),
        (
            "beam_search_echo_logprobs",
            {**PROMPT, "use_beam_search": True, "echo": True, "logprobs": 1},
        ),
    ],
)
async def test_the_same_bad_completion_body_gets_the_same_refusal(
    vllm_url: str, epd_url: str, name: str, body: dict[str, Any]
) -> None:
    vllm_status, expected = await post(vllm_url, body, "completions")
    status, answer = await post(epd_url, body, "completions")
    assert (status, vllm_status) == (400, 400), (answer, expected)


def completion_ids(chunks: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each choice's text, prompt token ids, generated ids and logprob tokens with their offsets,
    joined over a stream's chunks (or from a whole answer, its one 'chunk')."""
    joined: dict[int, list[Any]] = {}
    for chunk in chunks:
        for c in chunk["choices"]:
            entry = joined.setdefault(c["index"], ["", [], [], [], []])
            entry[0] += c["text"]
            entry[1] += [c["prompt_token_ids"]] if c.get("prompt_token_ids") else []
            entry[2] += c.get("token_ids") or []
            entry[3] += (c["logprobs"] or {}).get("tokens", [])
            entry[4] += (c["logprobs"] or {}).get("text_offset", [])
    return [(index, *entry) for index, entry in sorted(joined.items())]


@pytest.mark.parametrize(
    "body",
    [
        {**PROMPT, "return_token_ids": True},
        {**PROMPT, "return_token_ids": True, "echo": True, "logprobs": 1},
        {**PROMPT, "return_token_ids": True, "echo": True, "max_tokens": 0, "logprobs": 0},
        {**PROMPT, "prompt": ["The sea is", "A cat"], "n": 2, "temperature": 1, "seed": 3}
        | {"return_token_ids": True},
        {**PROMPT, "prompt": LONG_PROMPT, "truncate_prompt_tokens": 3, "return_token_ids": True},
    ],
    ids=["plain", "echo", "echo_only", "prompts_n", "truncated"],
)
async def test_completion_token_ids_are_vllms(
    vllm_url: str, epd_url: str, body: dict[str, Any]
) -> None:
    """vLLM's return_token_ids on /v1/completions, mixed with echo as vLLM mixes them (no echoed
    text, the prompt's logprobs all the same), whole and streamed."""
    answers = [await post(url, body, "completions") for url in (vllm_url, epd_url)]
    assert [status for status, _ in answers] == [200, 200], answers
    assert completion_ids([answers[1][1]]) == completion_ids([answers[0][1]])
    stream = {**body, "stream": True}
    chunks = [await streamed(url, stream, "completions") for url in (vllm_url, epd_url)]
    assert completion_ids(chunks[1]) == completion_ids(chunks[0])
