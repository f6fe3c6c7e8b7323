"""The OpenAI answer bodies: completions' choices and usage, logprobs JSON, error bodies."""

from __future__ import annotations

from epd.common.errors import NotFound
from epd.server.route import openai_answers, openai_logprobs


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
