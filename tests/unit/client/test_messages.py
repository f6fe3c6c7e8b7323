"""SDK requests and answers in protobuf form, and errors by status code."""

from __future__ import annotations

import io
import urllib.parse
from pathlib import Path

import grpc
import pytest
from PIL import Image

from epd.client import EpdClientError, InvalidRequest, Unavailable, build_request, system, user
from epd.client.messages import join, to_chunk
from epd.common.errors import EpdError, InvalidArgument
from epd.common.status import to_rpc_status
from epd.v1 import generation_pb2, route_service_pb2
from epd.v1 import scheduler_service_pb2 as scheduler_pb


def rpc_error(error: EpdError) -> grpc.aio.AioRpcError:
    """The AioRpcError a server answering ``error`` produces, rich status included."""
    status = to_rpc_status(error)
    return grpc.aio.AioRpcError(
        status.code,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(*status.trailing_metadata),
        status.details,
    )


def test_images_of_every_kind_become_media_items(tmp_path: Path) -> None:
    picture = Image.new("RGB", (8, 8))
    path = tmp_path / "p.png"
    picture.save(path)
    request = build_request(
        [
            system("be brief"),
            user(
                "what?",
                images=[
                    path,
                    str(path),
                    b"\x89PNG raw",
                    picture,
                    "https://example.com/a.png",
                    "data:image/png;base64,AAAA",
                ],
            ),
        ],
        max_tokens=3,
        seed=5,
        encoder_policy="per_request",
    )
    parts = request.messages[1].content
    assert [p.WhichOneof("part") for p in parts] == ["image"] * 6 + ["text"]
    assert parts[0].image.data == path.read_bytes() == parts[1].image.data
    assert parts[2].image.data == b"\x89PNG raw"
    assert Image.open(io.BytesIO(parts[3].image.data)).size == (8, 8)
    assert parts[4].image.url == "https://example.com/a.png"
    assert parts[5].image.url.startswith("data:")
    assert request.messages[0].role == "system" and parts[6].text == "what?"
    assert request.sampling.max_tokens == 3 and request.sampling.seed == 5
    assert request.encoder_policy == scheduler_pb.ENCODER_POLICY_PER_REQUEST


def test_url_schemes_are_read_in_any_case_and_file_urls_are_local_files(tmp_path: Path) -> None:
    path = tmp_path / "p q.png"
    path.write_bytes(b"\x89PNG local")
    request = build_request(
        [
            user(
                "what?",
                images=[
                    "HTTPS://example.com/a.png",
                    "DATA:IMAGE/PNG;BASE64,AAAA",
                    path.as_uri(),
                    "FILE://localhost" + urllib.parse.quote(str(path)),
                ],
            )
        ]
    )
    images = [part.image for part in request.messages[0].content[:4]]
    assert [image.url for image in images[:2]] == [
        "HTTPS://example.com/a.png",
        "DATA:IMAGE/PNG;BASE64,AAAA",
    ]
    assert images[2].data == images[3].data == b"\x89PNG local"


@pytest.mark.parametrize(
    "source",
    [
        "ftp://example.com/a.png",
        "gopher:x",
        "file://otherhost/etc/hostname",
        "no/such/picture.png",
    ],
)
def test_a_string_that_is_no_file_and_no_server_url_is_refused_clearly(source: str) -> None:
    """Any string but a lower-case http(s) or data: URL used to be opened as a local file."""
    with pytest.raises(ValueError) as caught:
        build_request([user("what?", image=source)])
    assert "an image is bytes" in str(caught.value) and source[:12] in str(caught.value)


def test_a_path_is_a_file_whatever_its_name_holds(tmp_path: Path) -> None:
    path = tmp_path / "ftp:x.png"
    path.write_bytes(b"\x89PNG colon")
    assert build_request([user("x", image=path)]).messages[0].content[0].image.data == (
        b"\x89PNG colon"
    )


def test_max_tokens_left_out_is_the_routes_default_as_over_http() -> None:
    """The SDK used to ask for 64 tokens where an HTTP body without max_tokens gets the rest of
    the context: unset now (0 on the wire), given its default by the route's one check."""
    assert build_request([user("hi")]).sampling.max_tokens == 0
    assert build_request([user("hi")], max_tokens=5).sampling.max_tokens == 5
    with pytest.raises(ValueError):
        build_request([user("hi")], max_tokens=0)


def test_a_finish_reason_a_newer_server_sends_reads_as_stop() -> None:
    unknown = route_service_pb2.GenerateResponse(finish_reason=7)  # type: ignore[arg-type]
    assert to_chunk(unknown).finish_reason == "stop"


def test_unset_seed_stays_unset_and_bad_policy_is_refused() -> None:
    assert not build_request([user("hi")]).sampling.HasField("seed")
    with pytest.raises(ValueError):
        build_request([user("hi")], encoder_policy="fastest")


def test_chunks_carry_finish_reason_and_usage_and_join() -> None:
    first = to_chunk(route_service_pb2.GenerateResponse(request_id="r", text="he", token_ids=[1]))
    last = to_chunk(
        route_service_pb2.GenerateResponse(
            request_id="r",
            text="llo",
            token_ids=[2, 3],
            finish_reason=generation_pb2.FINISH_REASON_STOP,
            usage=generation_pb2.Usage(prompt_tokens=9, completion_tokens=3),
        )
    )
    assert first.finish_reason is None and first.usage is None
    whole = join([first, last])
    assert (whole.text, whole.token_ids, whole.finish_reason) == ("hello", [1, 2, 3], "stop")
    assert whole.usage is not None and whole.usage.prompt_tokens == 9 and whole.request_id == "r"


def test_errors_map_to_typed_exceptions_with_reason() -> None:
    bad = EpdClientError.from_rpc_error(
        rpc_error(InvalidArgument("no", reason="BAD_IMAGE", metadata={"index": "1"}))
    )
    assert isinstance(bad, InvalidRequest)
    assert (bad.code, bad.reason, bad.metadata) == ("INVALID_ARGUMENT", "BAD_IMAGE", {"index": "1"})
    assert str(bad) == "INVALID_ARGUMENT (BAD_IMAGE): no"
    plain = grpc.aio.AioRpcError(
        grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.aio.Metadata(), grpc.aio.Metadata(), "busy"
    )
    busy = EpdClientError.from_rpc_error(plain)
    assert isinstance(busy, Unavailable) and busy.reason == "RESOURCE_EXHAUSTED"


def test_options_are_vllms_sampling_options_and_a_structured_output() -> None:
    request = build_request(
        [user("hi")],
        max_tokens=5,
        temperature=0.5,
        presence_penalty=1.0,
        frequency_penalty=-0.5,
        repetition_penalty=1.2,
        min_p=0.1,
        min_tokens=2,
        logit_bias={7: 3.0},
        bad_words=["no"],
        allowed_token_ids=[1, 2],
        include_stop_str_in_output=True,
        logprobs=3,
        n=2,
        seed=9,
        json_schema={"type": "object"},
    )
    sampling = request.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.n, sampling.logprobs) == (
        5,
        0.5,
        2,
        3,
    )
    assert (sampling.presence_penalty, sampling.min_tokens, dict(sampling.logit_bias)) == (
        1.0,
        2,
        {7: 3.0},
    )
    assert sampling.structured_output.json_schema == '{"type": "object"}'
    assert not build_request([user("hi")]).sampling.HasField("logprobs")
    choice = build_request([user("hi")], choice=["a", "b"]).sampling.structured_output
    assert list(choice.choice.values) == ["a", "b"]
    ids = build_request([user("hi")], logprob_token_ids=[7, 3]).sampling.logprob_token_ids
    assert list(ids) == [7, 3]


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"temprature": 1.0}, TypeError),
        ({"regex": "a", "choice": ["a"]}, ValueError),
        ({"max_tokens": 0}, ValueError),
        ({"encoder_policy": "fastest"}, ValueError),
    ],
)
def test_bad_options_are_refused_before_sending(
    options: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        build_request([user("hi")], **options)  # type: ignore[arg-type]


def test_completions_and_logprobs_come_back_typed() -> None:
    from epd.client import completions

    position = generation_pb2.TokenLogprobs(
        candidates=[generation_pb2.Logprob(token_id=4, logprob=-0.5, rank=1, token="a")]
    )
    chunks = [
        to_chunk(
            route_service_pb2.GenerateResponse(
                text="a", token_ids=[4], index=1, logprobs=[position]
            )
        ),
        to_chunk(route_service_pb2.GenerateResponse(text="b", token_ids=[5], index=0)),
        to_chunk(route_service_pb2.GenerateResponse(text="c", token_ids=[6], index=1)),
    ]
    first, second = completions(chunks)
    assert (first.text, second.text, second.index) == ("b", "ac", 1)
    assert second.logprobs[0][0].token == "a" and second.logprobs[0][0].logprob == -0.5


def test_output_options_and_prompt_logprobs_cross_typed() -> None:
    from epd.client import completions

    sampling = build_request(
        [user("hi")],
        prompt_logprobs=0,
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        priority=-2,
        cache_salt="tenant",
    ).sampling
    assert sampling.prompt_logprobs == 0 and sampling.HasField("prompt_logprobs")
    assert (sampling.skip_special_tokens, sampling.spaces_between_special_tokens) == (False, False)
    assert (sampling.priority, sampling.cache_salt) == (-2, "tenant")
    plain = build_request([user("hi")]).sampling
    assert not plain.HasField("prompt_logprobs") and not plain.HasField("skip_special_tokens")
    position = generation_pb2.TokenLogprobs(
        candidates=[generation_pb2.Logprob(token_id=4, logprob=-1.5, rank=3, token="a")]
    )
    first = route_service_pb2.GenerateResponse(
        text="x", token_ids=[9], prompt_logprobs=[generation_pb2.TokenLogprobs(), position]
    )
    (answer,) = completions([to_chunk(first), to_chunk(route_service_pb2.GenerateResponse())])
    assert answer.prompt_logprobs[0] == [], "nothing precedes the prompt's first token"
    assert answer.prompt_logprobs[1][0].rank == 3 and answer.prompt_logprobs[1][0].token == "a"
