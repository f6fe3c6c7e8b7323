"""OpenAI chat-completions bodies -> ChatRequest: request ids, sampling, refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epd.common.errors import InvalidArgument, NotFound
from epd.server.route import openai_answers, openai_logprobs
from epd.server.route import openai_schema as schema

BODY = {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
# An xgrammar structural tag, the constraint vLLM's tool parsers build for tool calls.
TAG = json.dumps(
    {
        "type": "structural_tag",
        "format": {"type": "tag", "begin": "<a>", "content": {"type": "any_text"}, "end": "</a>"},
    }
)


def refusal(body: Any, limits: schema.RequestLimits | None = None) -> InvalidArgument:
    """The error ``body`` is refused with, after checking it maps to a 400 error object."""
    with pytest.raises(InvalidArgument) as caught:
        schema.to_chat_request(body, "tiny", limits=limits or schema.RequestLimits())
    status, error = openai_answers.error_body(caught.value)
    assert status == 400 and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["param"] == caught.value.metadata["param"]
    return caught.value


def user(content: Any) -> dict[str, Any]:
    return {**BODY, "messages": [{"role": "user", "content": content}]}


def test_the_x_request_id_header_names_the_request_and_the_completion() -> None:
    request = schema.to_chat_request(BODY, "tiny", "bench-7f3a-12")
    assert request.request_id == "bench-7f3a-12"
    assert openai_answers.completion(request.request_id, "tiny", [openai_answers.Answer(["x"])])[
        "id"
    ] == ("chatcmpl-bench-7f3a-12")
    assert (
        openai_answers.chunk(request.request_id, "tiny", {}, None)["id"] == "chatcmpl-bench-7f3a-12"
    )


def test_without_the_header_each_request_gets_a_fresh_id() -> None:
    first = schema.to_chat_request(BODY, "tiny").request_id
    assert first and first != schema.to_chat_request(BODY, "tiny").request_id


@pytest.mark.parametrize("bad", ["", "a b", "x" * 129, "id\n", "ü"])
def test_a_malformed_request_id_is_a_bad_request(bad: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        schema.to_chat_request(BODY, "tiny", bad)
    assert caught.value.reason == "BAD_REQUEST"
    assert caught.value.metadata["param"] == "X-Request-Id"
    assert openai_answers.error_body(caught.value)[0] == 400


def test_vllm_extensions_reach_the_sampling_parameters() -> None:
    body = {**BODY, "ignore_eos": True, "top_k": 5, "stop_token_ids": [7], "seed": 3}
    sampling = schema.to_chat_request({**body, "stop": "END"}, "tiny").sampling
    assert (sampling.ignore_eos, sampling.top_k, list(sampling.stop_token_ids)) == (True, 5, [7])
    assert (sampling.seed, list(sampling.stop), sampling.max_tokens) == (3, ["END"], 3)


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("max_tokens", -1),
        ("max_completion_tokens", 1.5),
        ("temperature", "hot"),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("temperature", 2.5),
        ("temperature", 10**400),
        ("top_p", 0),
        ("top_p", 1.01),
        ("seed", 2**70),
        ("seed", 2**64),
        ("stop", ["a", "b", "c", "d", "e"]),
        ("stop", 5),
        ("stop_token_ids", 7),
        ("stream_options", []),
        ("stream_options", {"include_usage": "yes"}),
        ("top_logprobs", 3),
        ("user", 7),
        ("model", 5),
    ],
)
def test_what_vllm_refuses_is_refused_naming_its_parameter(param: str, value: Any) -> None:
    error = refusal({**BODY, param: value})
    assert error.reason == "BAD_REQUEST" and error.metadata["param"].startswith(param)


@pytest.mark.parametrize(
    ("param", "value"),
    [("stop", "\ud800"), ("model", "tiny\udfff"), ("stop_token_ids", [-1]), ("top_k", 2**31)],
)
def test_what_no_hop_can_carry_is_refused_though_vllm_takes_it(param: str, value: Any) -> None:
    """Lone surrogates and negative token ids: protobuf cannot hold them; a top_k beyond int32:
    vLLM's engine keeps it in an int32 tensor (docs/route.md)."""
    assert refusal({**BODY, param: value}).metadata["param"].startswith(param)


@pytest.mark.parametrize(
    ("param", "value", "field", "expected"),
    [
        ("max_tokens", "2", "max_tokens", 2),
        ("top_k", -1, "top_k", 0),
        ("ignore_eos", 1, "ignore_eos", True),
        ("presence_penalty", 0.5, "presence_penalty", 0.5),
        ("frequency_penalty", -1, "frequency_penalty", -1.0),
        ("repetition_penalty", 1.25, "repetition_penalty", 1.25),
        ("min_p", 0.25, "min_p", 0.25),
        ("min_tokens", 2, "min_tokens", 2),
        ("include_stop_str_in_output", True, "include_stop_str_in_output", True),
    ],
)
def test_what_vllm_takes_reaches_the_sampling_parameters(
    param: str, value: Any, field: str, expected: Any
) -> None:
    sampling = schema.to_chat_request({**BODY, param: value}, "tiny").sampling
    assert getattr(sampling, field) == expected


def test_logprobs_reach_the_sampling_parameters_as_vllm_sets_them() -> None:
    sampling = schema.to_chat_request(
        {**BODY, "logprobs": True, "top_logprobs": 4}, "tiny"
    ).sampling
    assert sampling.HasField("logprobs") and sampling.logprobs == 4
    sampling = schema.to_chat_request({**BODY, "logprobs": True}, "tiny").sampling
    assert sampling.HasField("logprobs") and sampling.logprobs == 0
    assert not schema.to_chat_request({**BODY, "top_logprobs": 0}, "tiny").sampling.HasField(
        "logprobs"
    )


def test_logprobs_json_is_vllms_shape_with_the_generated_token_first() -> None:
    from epd.v1 import generation_pb2 as g

    position = g.TokenLogprobs(
        candidates=[
            g.Logprob(token_id=5, logprob=-0.5, rank=2, token="b"),
            g.Logprob(token_id=4, logprob=-0.25, rank=1),
            g.Logprob(token_id=6, logprob=-1e6, rank=3, token="é"),
        ]
    )
    body = openai_logprobs.logprobs_json([position], 3, lambda token: f"<{token}>")
    [entry] = body["content"]
    assert (entry["token"], entry["logprob"], entry["bytes"]) == ("b", -0.5, [98])
    assert [t["token"] for t in entry["top_logprobs"]] == ["b", "<4>", "é"]
    assert entry["top_logprobs"][2] == {"token": "é", "logprob": -9999.0, "bytes": [195, 169]}
    assert openai_logprobs.logprobs_json([position], 0, str)["content"][0]["top_logprobs"] == []


def test_n_reaches_the_sampling_parameters_up_to_its_limit() -> None:
    assert schema.to_chat_request({**BODY, "n": 3}, "tiny").sampling.n == 3
    assert refusal({**BODY, "n": 129}).metadata["param"] == "n"
    assert "n must be at least 1" in refusal({**BODY, "n": 0}).message


def test_completions_gather_their_choices_and_count_the_prompt_once() -> None:
    from epd.v1 import generation_pb2 as g

    answers = [
        openai_answers.Answer(
            ["a", "b"], finish=1, usage=g.Usage(prompt_tokens=9, completion_tokens=2)
        ),
        openai_answers.Answer(["c"], finish=2, usage=g.Usage(prompt_tokens=9, completion_tokens=1)),
    ]
    body = openai_answers.completion("r", "tiny", answers)
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "ab", "stop"),
        (1, "c", "length"),
    ]
    assert body["usage"] == {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}


def test_token_lists_and_biases_reach_the_sampling_parameters() -> None:
    body = {
        **BODY,
        "logit_bias": {"7": -100, "9": 2.5},
        "bad_words": ["no"],
        "allowed_token_ids": [3, 4],
    }
    sampling = schema.to_chat_request(body, "tiny").sampling
    assert dict(sampling.logit_bias) == {7: -100.0, 9: 2.5}
    assert (list(sampling.bad_words), list(sampling.allowed_token_ids)) == (["no"], [3, 4])


@pytest.mark.parametrize(
    ("fields", "constraint", "value"),
    [
        ({"response_format": {"type": "json_object"}}, "json_object", True),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "n", "schema": {}},
                }
            },
            "json_schema",
            "{}",
        ),
        ({"structured_outputs": {"regex": "[ab]+"}}, "regex", "[ab]+"),
        ({"structured_outputs": {"grammar": 'root ::= "x"'}}, "grammar", 'root ::= "x"'),
        ({"structured_outputs": {"structural_tag": TAG}}, "structural_tag", TAG),
    ],
)
def test_structured_outputs_reach_the_sampling_parameters(
    fields: dict[str, Any], constraint: str, value: Any
) -> None:
    output = schema.to_chat_request({**BODY, **fields}, "tiny").sampling.structured_output
    assert output.WhichOneof("constraint") == constraint
    assert getattr(output, constraint) == value


def test_a_choice_reaches_the_sampling_parameters_and_text_constrains_nothing() -> None:
    body = {**BODY, "structured_outputs": {"choice": ["yes", "no"]}}
    output = schema.to_chat_request(body, "tiny").sampling.structured_output
    assert list(output.choice.values) == ["yes", "no"]
    body = {**BODY, "response_format": {"type": "text"}}
    assert not schema.to_chat_request(body, "tiny").sampling.HasField("structured_output")


def test_a_stop_token_id_beyond_uint32_is_refused() -> None:
    error = refusal({**BODY, "stop_token_ids": [7, 2**40]})
    assert error.metadata["param"] == "stop_token_ids"


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "user", "content": "bad \ud800 text"}, "messages[0].content"),
        ({"role": "user", "content": [{"type": "text", "text": "\udc00"}]}, "content[0].text"),
        ({"role": "user", "content": [{"type": "text", "text": 42}]}, "content[0].text"),
        ({"role": "user", "content": [{"type": "text"}]}, "content[0].text"),
        ({"role": "user", "content": [{"type": "input_audio"}]}, "content[0]"),
        ({"role": "user", "content": [7]}, "content[0]"),
        ({"role": "user", "content": []}, "messages[0].content"),
        ({"role": "user", "content": None}, "messages[0].content"),
        ({"role": "user", "content": {"text": "hi"}}, "messages[0].content"),
        ({"role": "function", "content": "42"}, "messages[0].role"),
        ({"role": "us\ud800er", "content": "hi"}, "messages[0].role"),
        ({"role": ["user"], "content": "hi"}, "messages[0].role"),
        ({"content": "hi"}, "messages[0].role"),
        ({"role": "user", "name": 3, "content": "hi"}, "messages[0].name"),
        ({"role": "user", "content": "hi", "name": "\ud800"}, "messages[0].name"),
        ({"role": "user", "content": "hi", "name": "n" * 257}, "messages[0].name"),
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x\ud800"}}]},
            "image_url.url",
        ),
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": 5}}]},
            "content[0].image_url",
        ),
        (
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "u", "detail": 1}}],
            },
            "image_url.detail",
        ),
    ],
)
def test_a_malformed_message_is_refused_naming_where(message: Any, param: str) -> None:
    error = refusal({**BODY, "messages": [message]})
    assert error.metadata["param"].endswith(param)


def test_roles_and_fields_of_echoed_assistant_messages() -> None:
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "hi", "name": "ann"},
        {"role": "assistant", "content": "hello", "tool_calls": None, "refusal": None},
        {"role": "user", "content": "again"},
    ]
    request = schema.to_chat_request({**BODY, "messages": messages}, "tiny")
    assert [m.role for m in request.messages] == ["system", "user", "assistant", "user"]
    calls = {"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}
    error = refusal({**BODY, "messages": [*messages, calls]})
    assert error.metadata["param"] == "messages[4].tool_calls"
    unknown = {"role": "assistant", "content": "x", "audio": {"id": "a"}}
    error = refusal({**BODY, "messages": [*messages, unknown]})
    assert (error.reason, error.metadata["param"]) == ("UNSUPPORTED_PARAMETER", "messages[4].audio")


def test_min_tokens_beyond_max_tokens_is_refused_as_vllm_refuses_it() -> None:
    assert "min_tokens" in refusal({**BODY, "min_tokens": 4}).message


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("kv_transfer_params", {"do_remote_decode": True}),
        ("ec_transfer_params", {"do_remote_encode": True}),
    ],
)
def test_a_proxys_transfer_params_are_taken_and_reach_no_engine(param: str, value: Any) -> None:
    """As ``vllm serve`` without a connector, which disables them: the route makes every
    hand-off itself, so they go nowhere; a ``vllm_xargs`` key of that name is still refused."""
    sampling = schema.to_chat_request({**BODY, param: value}, "tiny").sampling
    assert sampling.vllm_xargs == ""
    with_xargs = {**BODY, param: value, "vllm_xargs": {"tag": "a"}}
    assert schema.to_chat_request(with_xargs, "tiny").sampling.vllm_xargs == '{"tag": "a"}'
    error = refusal({**BODY, "vllm_xargs": {param: "x"}})
    assert error.metadata["param"] == "vllm_xargs"


def test_unimplemented_fields_at_their_defaults_and_harmless_ones_pass() -> None:
    no_ops = {
        "n": 1,
        "logprobs": False,
        "top_logprobs": 0,
        "echo": False,
        "tool_choice": "none",
        "response_format": {"type": "text"},
        "logit_bias": {},
        "user": "u1",
        "parallel_tool_calls": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "skip_special_tokens": True,
        "request_id": "r1",
    }
    assert schema.to_chat_request({**BODY, **no_ops}, "tiny").sampling.max_tokens == 3


# vLLM's fields that its generation endpoints take and do nothing with here, at values not
# their defaults
IGNORED = {
    "return_token_offsets": True,
    "mm_payload": "none",
    "return_mm_kwargs": False,
    "routed_experts_prompt_start": 2,
    "watermarking": True,
    "session_id": "conversation-7",
    "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
    "ec_transfer_params": {"do_remote_encode": True},
}


def test_what_vllms_generation_endpoints_ignore_is_taken() -> None:
    assert set(IGNORED) == schema.IGNORED_FIELDS
    assert schema.to_chat_request({**BODY, **IGNORED}, "tiny").sampling.max_tokens == 3
    assert refusal({**BODY, **IGNORED, "routed_experts_prompt_start": -1}).metadata["param"] == (
        "routed_experts_prompt_start"
    )


def test_an_unknown_field_is_accepted_as_vllm_accepts_it() -> None:
    """vLLM accepts fields it does not know (and logs them); so do OpenAI's newer ones."""
    extra = {"temprature": 0.5, "metadata": {"k": "v"}, "modalities": ["text"], "store": False}
    assert schema.to_chat_request({**BODY, **extra}, "tiny").sampling.max_tokens == 3


def test_nulls_are_absent_and_defaults_are_vllms_up_to_the_context() -> None:
    nulls = {"temperature": None, "top_p": None, "seed": None, "stop": None, "max_tokens": None}
    body = {**BODY, **nulls}
    sampling = schema.to_chat_request(body, "tiny").sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p) == (16, 1.0, 1.0)
    assert not sampling.HasField("seed") and not sampling.stop
    limits = schema.RequestLimits(max_context_tokens=4096)
    assert schema.to_chat_request(body, "tiny", limits=limits).sampling.max_tokens == 4096
    body = {**BODY, "max_completion_tokens": 9, "top_k": -1, "temperature": 2, "top_p": 0.5}
    sampling = schema.to_chat_request(body, "tiny", limits=limits).sampling
    assert (sampling.max_tokens, sampling.top_k, sampling.temperature, sampling.top_p) == (
        9,
        0,
        2.0,
        0.5,
    )


def test_the_models_generation_config_sets_the_defaults_a_body_leaves_out() -> None:
    defaults = {"temperature": 0.7, "top_k": 20, "repetition_penalty": 1.05, "max_tokens": 5}
    sampling = schema.to_chat_request(
        {**BODY, "max_tokens": None}, "tiny", defaults=defaults
    ).sampling
    assert (sampling.temperature, sampling.top_k) == (pytest.approx(0.7), 20)
    assert sampling.repetition_penalty == pytest.approx(1.05)
    body = {**BODY, "temperature": 0.5, "top_k": 3}
    sampling = schema.to_chat_request(body, "tiny", defaults=defaults).sampling
    assert (sampling.temperature, sampling.top_k) == (0.5, 3)


def test_max_tokens_beyond_the_models_context_is_the_rest_of_the_context_as_in_vllm() -> None:
    limits = schema.RequestLimits(max_context_tokens=4096)
    request = schema.to_chat_request({**BODY, "max_tokens": 4097}, "tiny", limits=limits)
    assert request.sampling.max_tokens == 4096
    body = {**BODY, "max_completion_tokens": 5000}
    assert schema.to_chat_request(body, "tiny", limits=limits).sampling.max_tokens == 4096


@pytest.mark.parametrize(
    ("body", "limits"),
    [
        ({**BODY, "messages": [{"role": "user", "content": "x"}] * 4}, {"max_messages": 3}),
        (user([{"type": "text", "text": "x"}] * 4), {"max_parts_per_message": 3}),
        (user("x" * 101), {"max_prompt_chars": 100}),
        (user([{"type": "image_url", "image_url": "http://i"}] * 3), {"max_images": 2}),
    ],
)
def test_sizes_beyond_the_limits_are_refused_before_any_work(
    body: Any, limits: dict[str, int]
) -> None:
    error = refusal(body, schema.RequestLimits(**limits))
    assert error.reason == "LIMIT_EXCEEDED" and error.metadata["param"].startswith("messages")
    assert schema.to_chat_request(body, "tiny").messages


def test_error_body_maps_model_not_found_to_openais_404() -> None:
    status, body = openai_answers.error_body(NotFound("no model 'x'", reason="MODEL_NOT_FOUND"))
    assert status == 404
    assert body["error"] == {
        "message": "no model 'x'",
        "type": "invalid_request_error",
        "param": None,
        "code": "model_not_found",
    }


def test_error_body_hides_the_details_of_unexpected_errors() -> None:
    status, body = openai_answers.error_body(KeyError("secret path /etc/x"))
    assert status == 500 and "secret" not in str(body)
    assert body["error"]["type"] == "server_error"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
KEYS = [
    "model",
    "messages",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "n",
    "tools",
    "stream_options",
]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), JSON, max_size=6), st.sampled_from(KEYS))
def test_any_body_is_refused_or_becomes_a_request_that_serializes(body: Any, key: str) -> None:
    """Random values under known keys, over a valid body: InvalidArgument or a sendable request
    (its sampling serializes for the engines, its strings encode as UTF-8 for every hop)."""
    try:
        request = schema.to_chat_request({**BODY, **body}, "tiny")
    except InvalidArgument as e:
        assert openai_answers.error_body(e)[0] == 400
        return
    assert request.sampling.SerializeToString() is not None
    texts = [part.text or "" for message in request.messages for part in message.parts]
    assert "".join([request.model, request.request_id, *texts]).encode()
