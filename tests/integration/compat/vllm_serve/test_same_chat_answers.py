"""Chat-completions bodies sent to ``vllm serve`` and to epd: the same status, and for greedy or
seeded bodies the same choices, logprobs and usage; the same refusals. What epd does not
implement yet is listed (``NOT_YET``) and must be refused by name, never answered differently.
A beam search's image is encoded once."""

from __future__ import annotations

import base64
import io
from typing import Any

import pytest

from tests.integration.compat.vllm_serve.bodies import (
    BEAMS,
    CALLED,
    CHAT,
    ECHOED_CALL,
    GREEDY,
    NAMED,
    PARTS_TEMPLATE,
    SPECIALS,
    STRING_TEMPLATE,
    TEXT,
    TOOL_GREEDY,
)
from tests.integration.compat.vllm_serve.exchange import (
    assert_same_prompt_logprobs,
    choices,
    logprob_values,
    post,
)
from tests.integration.compat.vllm_serve.servers import ENCODERS
from tests.pictures import picture

pytestmark = pytest.mark.vllm


# (name, body): both answer 200 with the same choices.
SAME_ANSWER: list[tuple[str, dict[str, Any]]] = [
    ("text", {**GREEDY, "messages": TEXT}),
    ("image", GREEDY),
    ("max_completion_tokens", {**GREEDY, "max_tokens": None, "max_completion_tokens": 6}),
    ("ignore_eos", {**GREEDY, "ignore_eos": True}),
    ("stop_token_ids", {**GREEDY, "stop_token_ids": [60, 61, 62]}),
    (
        "ignored_fields",
        {
            **GREEDY,
            "return_token_offsets": True,
            "mm_payload": "none",
            "routed_experts_prompt_start": 2,
            "watermarking": True,
            "session_id": "conversation-7",
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
            "ec_transfer_params": {"do_remote_encode": True},
        },
    ),
    ("presence_penalty", {**GREEDY, "presence_penalty": 1.5, "frequency_penalty": 0.5}),
    ("repetition_penalty", {**GREEDY, "repetition_penalty": 1.3}),
    ("logit_bias", {**GREEDY, "logit_bias": {"60": 5.0, "61": -100}}),
    ("allowed_token_ids", {**GREEDY, "allowed_token_ids": [60, 61, 62, 63]}),
    ("bad_words", {**GREEDY, "bad_words": ["a", "the"]}),
    ("min_tokens", {**GREEDY, "min_tokens": 5, "stop_token_ids": [60]}),
    ("seeded", {**GREEDY, "temperature": 1.0, "seed": 17}),
    ("seeded_min_p", {**GREEDY, "temperature": 0.8, "top_p": 0.9, "min_p": 0.05, "seed": 3}),
    ("n", {**GREEDY, "temperature": 1.0, "seed": 5, "n": 3}),
    ("logprobs", {**GREEDY, "logprobs": True, "top_logprobs": 3}),
    ("logprob_token_ids", {**GREEDY, "logprobs": True, "logprob_token_ids": [60, 61, 388]}),
    (
        "logprob_token_ids_over_top_logprobs",
        {**GREEDY, "logprobs": True, "top_logprobs": 1, "logprob_token_ids": [62, 60]},
    ),
    ("regex", {**GREEDY, "structured_outputs": {"regex": "(yes|no)[a-z]{0,4}"}}),
    ("choice", {**GREEDY, "structured_outputs": {"choice": ["red", "green", "blue"]}}),
    ("json_object", {**GREEDY, "response_format": {"type": "json_object"}}),
    (
        "json_schema",
        {
            **GREEDY,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "verdict",
                    "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
                },
            },
        },
    ),
    ("unknown_field", {**GREEDY, "temprature": 0.5, "metadata": {"k": "v"}}),
    ("no_generation_prompt", {**GREEDY, "messages": CHAT, "add_generation_prompt": False}),
    (
        "continue_final_message",
        {
            **GREEDY,
            "messages": CHAT,
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    ),
    ("chat_template_kwargs", {**GREEDY, "chat_template_kwargs": {"enable_thinking": False}}),
    ("user_and_ids", {**GREEDY, "user": "u1", "request_id": "r-1", "parallel_tool_calls": True}),
    ("prompt_logprobs", {**GREEDY, "prompt_logprobs": 2}),
    ("echo", {**GREEDY, "messages": CHAT, "echo": True, "add_generation_prompt": False}),
    ("echo_logprobs", {**GREEDY, "messages": CHAT, "echo": True, "logprobs": True}),
    ("special_tokens", {**GREEDY, "skip_special_tokens": False, "logit_bias": SPECIALS}),
    (
        "no_spaces_between_special_tokens",
        {
            **GREEDY,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "logit_bias": SPECIALS,
        },
    ),
    (
        "tokens_as_ids",
        {**GREEDY, "logprobs": True, "top_logprobs": 2, "return_tokens_as_token_ids": True},
    ),
    ("priority_and_cache_salt", {**GREEDY, "priority": 0, "cache_salt": "tenant-a"}),
    (
        "repetition_detection",
        {
            **GREEDY,
            "max_tokens": 40,
            "repetition_detection": {"max_pattern_size": 4, "min_count": 2},
        },
    ),
    ("vllm_xargs", {**GREEDY, "vllm_xargs": {"mode": "fast", "weights": [1, 2.5]}}),
    # NOTE: -1 is vLLM's "no budget", taken without a reasoning parser too
    ("thinking_token_budget_unbounded", {**GREEDY, "thinking_token_budget": -1}),
    ("tool_choice_required", {**TOOL_GREEDY, "tool_choice": "required"}),
    ("tool_choice_named", {**TOOL_GREEDY, "tool_choice": NAMED}),
    ("tool_choice_none", {**TOOL_GREEDY, "tool_choice": "none"}),
    ("tool_choice_auto", TOOL_GREEDY),
    ("one_tool_call", {**TOOL_GREEDY, "tool_choice": "required", "parallel_tool_calls": False}),
    ("tool_result_in_history", {**TOOL_GREEDY, "messages": CALLED}),
    (
        "echo_with_a_tool_parser",
        {
            **TOOL_GREEDY,
            "messages": [*TEXT, {"role": "assistant", "content": ECHOED_CALL}],
            "echo": True,
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    ),
    ("request_chat_template", {**GREEDY, "chat_template": PARTS_TEMPLATE}),
    (
        "request_chat_template_string",
        {**GREEDY, "messages": TEXT, "chat_template": STRING_TEMPLATE},
    ),
    (
        "chat_template_as_template_argument",
        {**GREEDY, "chat_template_kwargs": {"chat_template": PARTS_TEMPLATE}},
    ),
    ("truncate_prompt_tokens", {**GREEDY, "messages": TEXT, "truncate_prompt_tokens": 5}),
    (
        "truncate_prompt_tokens_left",
        {**GREEDY, "messages": TEXT, "truncate_prompt_tokens": 6, "truncation_side": "left"},
    ),
    ("truncate_prompt_tokens_context", {**GREEDY, "truncate_prompt_tokens": -1}),
    ("add_special_tokens", {**GREEDY, "add_special_tokens": True}),
    ("empty_media_kwargs", {**GREEDY, "mm_processor_kwargs": {}, "media_io_kwargs": {}}),
    ("stream_interval_whole", {**GREEDY, "stream_interval": 4}),
    ("beam_search", {**GREEDY, "messages": TEXT, "use_beam_search": True, "n": 3}),
    ("beam_search_image", {**BEAMS, "n": 2}),
    ("beam_search_length_penalty", {**BEAMS, "length_penalty": 0.4, "max_tokens": 12}),
    ("beam_search_kept_eos", {**BEAMS, "include_stop_str_in_output": True, "max_tokens": 12}),
    ("beam_search_ignore_eos", {**BEAMS, "messages": TEXT, "ignore_eos": True}),
    # NOTE: vLLM shows each beam token's logprob beside its step's first candidates
    ("beam_search_logprobs", {**BEAMS, "logprobs": True, "top_logprobs": 3}),
    # NOTE: the prompt is cut before each step's beam tokens follow it
    ("beam_search_truncated", {**BEAMS, "messages": TEXT, "truncate_prompt_tokens": 5}),
]
# (name, body): both refuse with 400.
SAME_REFUSAL: list[tuple[str, dict[str, Any]]] = [
    ("no_messages", {**GREEDY, "messages": []}),
    ("negative_temperature", {**GREEDY, "temperature": -1}),
    ("top_p_zero", {**GREEDY, "top_p": 0}),
    ("max_tokens_negative", {**GREEDY, "max_tokens": -1}),
    ("n_zero", {**GREEDY, "n": 0}),
    ("min_tokens_beyond_max", {**GREEDY, "min_tokens": 20}),
    ("top_logprobs_without_logprobs", {**GREEDY, "top_logprobs": 2}),
    ("logprob_token_ids_without_logprobs", {**GREEDY, "logprob_token_ids": [60]}),
    (
        "logprob_token_ids_beyond_the_vocabulary",
        {**GREEDY, "logprobs": True, "logprob_token_ids": [60, 9396]},
    ),
    (
        "logprob_token_ids_too_many",
        {**GREEDY, "logprobs": True, "logprob_token_ids": list(range(129))},
    ),
    ("seed_beyond_int64", {**GREEDY, "seed": 2**70}),
    ("bad_response_format", {**GREEDY, "response_format": {"type": "xml"}}),
    ("two_constraints", {**GREEDY, "structured_outputs": {"regex": "a", "choice": ["a"]}}),
    ("wrong_type", {**GREEDY, "max_tokens": "many"}),
    ("stream_interval_zero", {**GREEDY, "stream": True, "stream_interval": 0}),
    ("prompt_logprobs_negative", {**GREEDY, "prompt_logprobs": -2}),
    ("prompt_logprobs_streamed", {**GREEDY, "prompt_logprobs": 1, "stream": True}),
    ("prompt_logprobs_beyond_the_limit", {**GREEDY, "prompt_logprobs": 100}),
    ("empty_cache_salt", {**GREEDY, "cache_salt": ""}),
    # NOTE: neither engine has a reasoning parser here (test_reasoning_compat.py has one)
    ("thinking_token_budget_without_a_parser", {**GREEDY, "thinking_token_budget": 4}),
    ("thinking_token_budget_negative", {**GREEDY, "thinking_token_budget": -2}),
    (
        "repetition_detection_once",
        {**GREEDY, "repetition_detection": {"max_pattern_size": 4, "min_count": 1}},
    ),
    ("vllm_xargs_not_an_object", {**GREEDY, "vllm_xargs": [1]}),
    (
        "generation_prompt_and_continuation",
        {**GREEDY, "messages": CHAT, "continue_final_message": True},
    ),
    ("unknown_tool", {**TOOL_GREEDY, "tool_choice": {**NAMED, "function": {"name": "nope"}}}),
    ("tool_choice_without_tools", {**GREEDY, "tool_choice": "required"}),
    ("empty_tools", {**GREEDY, "tools": []}),
    ("bad_tool_choice", {**TOOL_GREEDY, "tool_choice": "sometimes"}),
    ("truncate_beyond_the_context", {**GREEDY, "truncate_prompt_tokens": 5000}),
    ("request_chat_template_unclosed", {**GREEDY, "chat_template": "{% for m in messages %}"}),
    (
        "request_chat_template_raises",
        {**GREEDY, "chat_template": "{{ raise_exception('no chat here') }}"},
    ),
    ("beam_search_logprob_token_ids", {**BEAMS, "logprobs": True, "logprob_token_ids": [60]}),
    ("beam_search_not_a_bool", {**GREEDY, "use_beam_search": "maybe"}),
    ("length_penalty_not_a_number", {**BEAMS, "length_penalty": "long"}),
    ("beam_search_n_zero", {**BEAMS, "n": 0}),
    # NOTE: 2n candidates a step: beyond the engines' 20 logprobs
    ("beam_search_too_wide", {**BEAMS, "n": 11}),
]
# (name, body, field): vLLM answers; epd refuses naming the field, until it implements it.
NOT_YET: list[tuple[str, dict[str, Any], str]] = []


@pytest.mark.parametrize(("name", "body"), SAME_ANSWER, ids=[c[0] for c in SAME_ANSWER])
async def test_the_same_body_gets_the_same_answer(
    vllm_url: str, epd_url: str, name: str, body: dict[str, Any]
) -> None:
    vllm_status, expected = await post(vllm_url, body)
    status, answer = await post(epd_url, body)
    assert (status, vllm_status) == (200, 200), (answer, expected)
    assert choices(answer) == choices(expected)
    assert logprob_values(answer) == pytest.approx(logprob_values(expected), abs=1e-3)
    assert_same_prompt_logprobs(answer, expected)
    for key in ("prompt_tokens", "completion_tokens"):
        assert answer["usage"][key] == expected["usage"][key], key


@pytest.mark.parametrize(("name", "body"), SAME_REFUSAL, ids=[c[0] for c in SAME_REFUSAL])
async def test_the_same_bad_body_gets_the_same_refusal(
    vllm_url: str, epd_url: str, name: str, body: dict[str, Any]
) -> None:
    vllm_status, expected = await post(vllm_url, body)
    status, answer = await post(epd_url, body)
    assert (status, vllm_status) == (400, 400), (answer, expected)
    assert answer["error"]["message"]


@pytest.mark.parametrize(("name", "body", "field"), NOT_YET, ids=[c[0] for c in NOT_YET])
async def test_what_epd_does_not_implement_yet_is_refused_by_name(
    vllm_url: str, epd_url: str, name: str, body: dict[str, Any], field: str
) -> None:
    vllm_status, _ = await post(vllm_url, body)
    status, answer = await post(epd_url, body)
    assert vllm_status == 200
    assert (status, answer["error"]["code"], answer["error"]["param"]) == (
        400,
        "UNSUPPORTED_PARAMETER",
        field,
    )


async def test_a_beam_search_encodes_its_image_once(vllm_url: str, epd_url: str) -> None:
    """Each step of each beam is a request of its own through the route, its image found again
    by its mm hash: the tower runs once, and each of the 8 later steps' Encode call (2 beams, 4
    steps after the first; the tiny model's end of sequence is never among its candidates) is
    a hit in the encoder's cache; the beams are vLLM's."""
    encoder = ENCODERS.get(epd_url)
    if encoder is None:
        pytest.skip("EP/D: no encoder")
    image = io.BytesIO()
    picture(23, 72, 56).save(image, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(image.getvalue()).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "and?"}]
    body = {**BEAMS, "n": 2, "max_tokens": 5, "messages": [{"role": "user", "content": content}]}
    stats, cache = encoder.worker.batcher.stats, encoder.worker.cache
    before = (stats.num_items, cache.num_misses, cache.num_hits)
    status, answer = await post(epd_url, body)
    runs, misses, hits = (stats.num_items, cache.num_misses, cache.num_hits)
    assert status == 200, answer
    assert (runs - before[0], misses - before[1]) == (1, 1)
    assert hits - before[2] == 2 * (5 - 1)
    vllm_status, expected = await post(vllm_url, body)
    assert vllm_status == 200 and choices(answer) == choices(expected)
