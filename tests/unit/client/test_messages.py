"""SDK requests and answers in protobuf form, and errors by status code."""

from __future__ import annotations

import io
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
    assert first.finish_reason is None and first.usage == {}
    whole = join([first, last])
    assert (whole.text, whole.token_ids, whole.finish_reason) == ("hello", [1, 2, 3], "stop")
    assert whole.usage["prompt_tokens"] == 9 and whole.request_id == "r"


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
