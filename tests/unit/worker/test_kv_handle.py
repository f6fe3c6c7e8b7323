"""The KV handle's payload: the prefill side encodes its engine's kv_transfer_params once, the
decode side decodes them once, exactly (ints stay ints: a Struct turned them into doubles), and
a payload that is not a handle is refused with INVALID_ARGUMENT ``BAD_KV_HANDLE``; the prefill
response that carries it, with the log probabilities asked for."""

from __future__ import annotations

import pytest

from epd.common.errors import InvalidArgument
from epd.server.engine.base import PrefillResult, Usage
from epd.server.engine.vllm_embeds import IMAGE_GRIDS_KEY, IMAGE_HASHES_KEY
from epd.server.worker.convert import decode_kv_params, kv_handle_to_proto, prefill_fields
from epd.v1 import generation_pb2
from epd.v1 import prefill_service_pb2 as prefill_pb

HANDLE = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[1, 2], [3]],
    "remote_port": 5601,
    "remote_engine_id": "e1",
    "remote_host": "10.0.0.7",
    "remote_blocks_expiry_time": None,
    "tp_size": 1,
    "lease": {"seconds": 30, "renew_every": 5.0, "ratio": 0.1},
    "epd_seed": 2**62 + 1,
    IMAGE_GRIDS_KEY: [[1, 4, 6]],
    IMAGE_HASHES_KEY: ["a"],
}


def through_the_wire(handle: generation_pb2.KvHandle) -> generation_pb2.KvHandle:
    return generation_pb2.KvHandle.FromString(handle.SerializeToString())


def test_a_handle_crosses_the_wire_exactly_with_ints_as_ints() -> None:
    handle = through_the_wire(kv_handle_to_proto(HANDLE))
    assert handle.engine_id == "e1"
    params = decode_kv_params(handle.payload)
    assert params == HANDLE
    assert type(params["remote_port"]) is int and type(params["epd_seed"]) is int
    assert all(type(n) is int for ids in params["remote_block_ids"] for n in ids)
    assert type(params["lease"]["seconds"]) is int and type(params["lease"]["ratio"]) is float


def test_no_handle_is_an_empty_payload() -> None:
    assert kv_handle_to_proto(None) == generation_pb2.KvHandle()
    assert kv_handle_to_proto({}) == generation_pb2.KvHandle()


@pytest.mark.parametrize(
    "payload",
    [b"not json", b"\xff\xfe\xfd", b"[1, 2]", b'"text"', b"7", b"null", b"{" * 100_000],
    ids=["text", "not-utf8", "list", "string", "number", "null", "too-deep"],
)
def test_a_payload_that_is_not_a_json_object_is_a_bad_handle(payload: bytes) -> None:
    with pytest.raises(InvalidArgument) as caught:
        decode_kv_params(payload)
    assert caught.value.reason == "BAD_KV_HANDLE"


def test_a_prefill_response_carries_the_handle_and_the_logprobs_asked_for() -> None:
    plain = PrefillResult(7, None, HANDLE, Usage(3, 1))
    response = prefill_pb.PrefillResponse(**prefill_fields(plain))
    assert response.first_token_id == 7 and response.usage.prompt_tokens == 3
    assert decode_kv_params(response.kv_handle.payload) == HANDLE
    assert response.finish_reason == generation_pb2.FINISH_REASON_UNSPECIFIED
    assert not response.HasField("first_token_logprobs") and not response.prompt_logprobs
    ranked = ((7, -0.5, 1, "a"), (8, -1.5, 2, None))
    asked = PrefillResult(7, "stop", None, Usage(3, 1), ranked, [(), ranked])
    response = prefill_pb.PrefillResponse(**prefill_fields(asked))
    assert [c.token_id for c in response.first_token_logprobs.candidates] == [7, 8]
    assert [len(p.candidates) for p in response.prompt_logprobs] == [0, 2]
    assert response.finish_reason == generation_pb2.FINISH_REASON_STOP
    assert response.kv_handle == generation_pb2.KvHandle()
