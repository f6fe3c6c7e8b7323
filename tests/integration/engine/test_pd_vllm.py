"""P/D on vLLM over gRPC: Prefill -> KvHandle -> Decode (KV pulled over NIXL) gives the same tokens
as E/PD, EPD (raw images into vLLM), EP/D and the transformers reference; concurrency,
cancellation, sampling with a seed, finish reasons and bad inputs."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from epd.common.roles import Role
from epd.common.status import from_rpc_error
from epd.server.decode.app import DecodeConfig, build_decode_server
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.transfer.plane import DataPlane
from epd.v1 import decode_service_pb2 as decode_pb
from epd.v1 import decode_service_pb2_grpc as decode_grpc
from epd.v1 import generation_pb2
from epd.v1 import prefill_service_pb2 as prefill_pb
from epd.v1 import prefill_service_pb2_grpc as prefill_grpc
from tests.pictures import picture

from .helpers import Stubs, embedded_prompt, expected_tokens, media_prompt, release

pytestmark = pytest.mark.vllm
NUM_TOKENS = 12
GREEDY = generation_pb2.SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
async def stubs(tiny_model_dir, engines):
    stubs = Stubs(engines)
    stubs.prefill = await stubs.serve(
        await build_prefill_server(
            PrefillConfig(tiny_model_dir, mode=Role.PREFILL), stubs.producer
        ),
        prefill_grpc.PrefillServiceStub,
    )
    stubs.aggregated = await stubs.serve(
        await build_prefill_server(PrefillConfig(tiny_model_dir), stubs.producer),
        prefill_grpc.PrefillServiceStub,
    )
    stubs.encode_prefill = await stubs.serve(
        await build_prefill_server(
            PrefillConfig(tiny_model_dir, mode=Role.ENCODE_PREFILL, hands_off_kv=True),
            stubs.producer,
        ),
        prefill_grpc.PrefillServiceStub,
    )
    stubs.decode = await stubs.serve(
        await build_decode_server(DecodeConfig(), stubs.consumer), decode_grpc.DecodeServiceStub
    )
    stubs.plane = DataPlane(stubs.apps[0].worker.plane.host_id)
    yield stubs
    await stubs.close()
    stubs.plane.close()


async def prefill_then_decode(
    stubs, prefill_stub, request_id: str, prompt, sampling=GREEDY
) -> tuple[list[int], list]:
    first = await prefill_stub.Prefill(
        prefill_pb.PrefillRequest(
            request_id=request_id, model="tiny", prompt=prompt, sampling=sampling
        )
    )
    responses = [
        r
        async for r in stubs.decode.Decode(
            decode_pb.DecodeRequest(
                request_id=request_id,
                model="tiny",
                prompt_token_ids=prompt.token_ids,
                sampling=sampling,
                first_token_id=first.first_token_id,
                kv_handle=first.kv_handle,
            )
        )
    ]
    return [first.first_token_id] + [t for r in responses for t in r.token_ids], responses


async def aggregated(stub, request_id: str, prompt, sampling=GREEDY) -> list[int]:
    request = prefill_pb.PrefillDecodeRequest(
        request_id=request_id, model="tiny", prompt=prompt, sampling=sampling
    )
    return [t async for r in stub.PrefillDecode(request) for t in r.token_ids]


async def test_every_topology_gives_the_reference_tokens(stubs, oracle) -> None:
    images, text = [picture(1, 96, 64), picture(2, 60, 90)], "describe these pictures"
    expected = expected_tokens(oracle, images, text, NUM_TOKENS)
    embedded = embedded_prompt(oracle, stubs.plane, images, text)
    raw = media_prompt(oracle, images, text)

    pd, responses = await prefill_then_decode(stubs, stubs.prefill, "pd", embedded)
    assert pd == expected, "P/D (embeddings -> prefill -> KV over NIXL -> decode)"
    assert await aggregated(stubs.aggregated, "e-pd", embedded) == expected, "E/PD"
    assert await aggregated(stubs.encode_prefill, "epd", raw) == expected, "EPD (raw images)"
    ep_d, _ = await prefill_then_decode(stubs, stubs.encode_prefill, "ep-d", raw)
    assert ep_d == expected, "EP/D (raw images -> prefill -> decode)"

    last = responses[-1]
    assert last.finish_reason == generation_pb2.FINISH_REASON_LENGTH
    assert last.usage.completion_tokens == NUM_TOKENS and last.usage.prompt_tokens > 20
    release(stubs.plane, embedded)


async def test_concurrent_pd_requests_each_get_their_own_answer(stubs, oracle) -> None:
    cases = [([picture(10 + i, 56 + 8 * i, 56)], f"what is shown {i}?") for i in range(3)]
    prompts = [embedded_prompt(oracle, stubs.plane, images, text) for images, text in cases]
    results = await asyncio.gather(
        *(
            prefill_then_decode(stubs, stubs.prefill, f"c{i}", prompt)
            for i, prompt in enumerate(prompts)
        )
    )
    for (images, text), (tokens, _), prompt in zip(cases, results, prompts, strict=True):
        assert tokens == expected_tokens(oracle, images, text, NUM_TOKENS)
        release(stubs.plane, prompt)


async def test_seeded_sampling_matches_the_aggregated_engine(stubs, oracle) -> None:
    prompt = embedded_prompt(oracle, stubs.plane, [picture(20, 64, 64)], "tell a story")
    sampling = generation_pb2.SamplingParams(
        max_tokens=NUM_TOKENS, ignore_eos=True, temperature=1.0, seed=1234
    )
    pd, _ = await prefill_then_decode(stubs, stubs.prefill, "s-pd", prompt, sampling)
    assert pd == await aggregated(stubs.aggregated, "s-agg", prompt, sampling)
    release(stubs.plane, prompt)


def varied(**fields) -> generation_pb2.SamplingParams:
    """Greedy ``NUM_TOKENS`` tokens with ``fields`` on top."""
    sampling = generation_pb2.SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True)
    constraint = fields.pop("structured_output", None)
    if constraint is not None:
        sampling.structured_output.CopyFrom(generation_pb2.StructuredOutput(**constraint))
    sampling.MergeFrom(generation_pb2.SamplingParams(**fields))
    return sampling


# Sampling beyond the basics, each against the answer without it (greedy, or seeded sampling for
# the penalties: the tiny model's greedy answer repeats nothing to penalise): each changes the
# answer, and the split must give what one engine gives (penalties count the first token, the
# grammar sees it).
SEEDED = {"temperature": 1.0, "seed": 7}
VARIED = {
    "repetition_penalty": (varied(**SEEDED, repetition_penalty=1.8), varied(**SEEDED)),
    "presence_penalty": (varied(**SEEDED, presence_penalty=-2.0), varied(**SEEDED)),
    "frequency_penalty": (varied(**SEEDED, frequency_penalty=-2.0), varied(**SEEDED)),
    "min_p": (varied(**SEEDED, min_p=0.2), varied(**SEEDED)),
    "logit_bias": (varied(logit_bias={5: 100.0}), GREEDY),
    "allowed_token_ids": (varied(allowed_token_ids=[5, 6, 7]), GREEDY),
    "regex": (varied(structured_output={"regex": "(ab|cd)+"}), GREEDY),
    "choice": (
        varied(structured_output={"choice": generation_pb2.Choices(values=["yes", "no"])}),
        GREEDY,
    ),
    "json_object": (varied(structured_output={"json_object": True}, ignore_eos=False), GREEDY),
}


@pytest.mark.parametrize("name", list(VARIED))
async def test_sampling_beyond_the_basics_is_the_same_across_the_split(
    stubs, oracle, name: str
) -> None:
    prompt = embedded_prompt(oracle, stubs.plane, [picture(24, 56, 56)], "say something")
    sampling, baseline = VARIED[name]
    without = await aggregated(stubs.aggregated, f"v-base-{name}", prompt, baseline)
    whole = await aggregated(stubs.aggregated, f"v-agg-{name}", prompt, sampling)
    split, _ = await prefill_then_decode(stubs, stubs.prefill, f"v-pd-{name}", prompt, sampling)
    assert whole != without, f"{name} must change the answer for this test to mean anything"
    assert split == whole
    release(stubs.plane, prompt)


def table(positions) -> list[list[tuple[int, float, int, str]]]:
    return [[(c.token_id, c.logprob, c.rank, c.token) for c in p.candidates] for p in positions]


@pytest.mark.parametrize("num_top", [0, 3])
async def test_logprobs_are_the_same_across_the_split(stubs, oracle, num_top: int) -> None:
    """The first token's from the prefill worker, the rest from the decode worker: together
    what one engine reports, in vLLM's order (the generated token first)."""
    prompt = embedded_prompt(oracle, stubs.plane, [picture(26, 56, 56)], "describe")
    sampling = varied(logprobs=num_top)
    request = prefill_pb.PrefillDecodeRequest(request_id=f"l-agg-{num_top}", prompt=prompt)
    request.sampling.CopyFrom(sampling)
    whole = [r async for r in stubs.aggregated.PrefillDecode(request)]
    tokens = [t for r in whole for t in r.token_ids]
    positions = [p for r in whole for p in r.logprobs]
    assert len(positions) == len(tokens) == NUM_TOKENS
    assert all(p.candidates[0].token_id == t for p, t in zip(positions, tokens, strict=True))
    assert {len(p.candidates) for p in positions} <= {num_top, num_top + 1} - {0}

    first = await stubs.prefill.Prefill(
        prefill_pb.PrefillRequest(request_id=f"l-pd-{num_top}", prompt=prompt, sampling=sampling)
    )
    rest = stubs.decode.Decode(
        decode_pb.DecodeRequest(
            request_id=f"l-pd-{num_top}",
            prompt_token_ids=prompt.token_ids,
            sampling=sampling,
            first_token_id=first.first_token_id,
            kv_handle=first.kv_handle,
        )
    )
    split = [first.first_token_logprobs] + [p async for r in rest for p in r.logprobs]
    expected, actual = table(positions), table(split)
    assert [[c[0] for c in p] for p in actual] == [[c[0] for c in p] for p in expected]
    assert [[c[2:] for c in p] for p in actual] == [[c[2:] for c in p] for p in expected]
    for got, want in zip(actual, expected, strict=True):
        assert [c[1] for c in got] == pytest.approx([c[1] for c in want], abs=1e-4)
    release(stubs.plane, prompt)


async def test_min_tokens_holds_off_a_stop_token_across_the_split(stubs, oracle) -> None:
    prompt = embedded_prompt(oracle, stubs.plane, [picture(25, 56, 56)], "count")
    greedy, _ = await prefill_then_decode(stubs, stubs.prefill, "m-greedy", prompt)
    stop_at_first = varied(stop_token_ids=[greedy[0]])
    assert await aggregated(stubs.aggregated, "m-stop", prompt, stop_at_first) == greedy[:1]
    held = varied(stop_token_ids=[greedy[0]], min_tokens=4)
    whole = await aggregated(stubs.aggregated, "m-agg", prompt, held)
    split, _ = await prefill_then_decode(stubs, stubs.prefill, "m-pd", prompt, held)
    assert len(whole) >= 4 and split == whole
    release(stubs.plane, prompt)


async def test_finish_reasons_at_the_first_token_and_mid_stream(stubs, oracle) -> None:
    prompt = embedded_prompt(oracle, stubs.plane, [picture(21, 56, 56)], "count")
    one = generation_pb2.SamplingParams(max_tokens=1, ignore_eos=True)
    first = await stubs.prefill.Prefill(
        prefill_pb.PrefillRequest(request_id="f1", prompt=prompt, sampling=one)
    )
    assert first.finish_reason == generation_pb2.FINISH_REASON_LENGTH
    assert not first.HasField("kv_handle") or not first.kv_handle.payload
    assert first.usage.completion_tokens == 1

    tokens, _ = await prefill_then_decode(stubs, stubs.prefill, "f2", prompt)
    stop = generation_pb2.SamplingParams(
        max_tokens=NUM_TOKENS, stop_token_ids=[tokens[3]], ignore_eos=True
    )
    stopped, responses = await prefill_then_decode(stubs, stubs.prefill, "f3", prompt, stop)
    assert stopped == tokens[: tokens.index(tokens[3]) + 1]
    assert responses[-1].finish_reason == generation_pb2.FINISH_REASON_STOP
    release(stubs.plane, prompt)


async def test_decode_cancellation_aborts_the_engine_request(stubs, oracle) -> None:
    prompt = embedded_prompt(oracle, stubs.plane, [picture(22, 56, 56)], "go on")
    sampling = generation_pb2.SamplingParams(max_tokens=1500, ignore_eos=True)
    first = await stubs.prefill.Prefill(
        prefill_pb.PrefillRequest(request_id="x", prompt=prompt, sampling=sampling)
    )
    call = stubs.decode.Decode(
        decode_pb.DecodeRequest(
            request_id="x",
            prompt_token_ids=prompt.token_ids,
            sampling=sampling,
            first_token_id=first.first_token_id,
            kv_handle=first.kv_handle,
        )
    )
    await call.read()
    assert stubs.consumer.load().num_running + stubs.consumer.load().num_waiting == 1
    call.cancel()
    for _ in range(100):
        if not stubs.consumer.load().num_running:
            break
        await asyncio.sleep(0.05)
    assert stubs.consumer.load().num_running == 0
    release(stubs.plane, prompt)


async def expect_error(call, code: grpc.StatusCode, reason: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        result = call()
        if hasattr(result, "__aiter__"):
            _ = [r async for r in result]
        else:
            await result
    assert caught.value.code() == code, caught.value.details()
    assert from_rpc_error(caught.value).reason == reason


async def test_bad_pd_inputs_get_clear_status_codes(stubs, oracle) -> None:
    prompt = embedded_prompt(oracle, stubs.plane, [picture(23, 56, 56)], "bad")
    first = await stubs.prefill.Prefill(
        prefill_pb.PrefillRequest(request_id="b", prompt=prompt, sampling=GREEDY)
    )
    invalid, precondition = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION

    def decode(**changes):
        request = decode_pb.DecodeRequest(
            request_id="b",
            model="tiny",
            prompt_token_ids=prompt.token_ids,
            sampling=GREEDY,
            first_token_id=first.first_token_id,
            kv_handle=first.kv_handle,
        )
        for name, value in changes.items():
            if value is None:
                request.ClearField(name)
            elif isinstance(value, list):
                getattr(request, name)[:] = value
            else:
                getattr(request, name).CopyFrom(value) if hasattr(value, "DESCRIPTOR") else setattr(
                    request, name, value
                )
        return lambda: stubs.decode.Decode(request)

    await expect_error(decode(kv_handle=None), invalid, "MISSING_KV_HANDLE")
    await expect_error(decode(model="llama"), invalid, "WRONG_MODEL")
    not_prefilled = generation_pb2.KvHandle(payload=b'{"remote_engine_id": "x"}')
    await expect_error(decode(kv_handle=not_prefilled), invalid, "BAD_KV_HANDLE")
    not_json = generation_pb2.KvHandle(payload=b"remote_engine_id=x")
    await expect_error(decode(kv_handle=not_json), invalid, "BAD_KV_HANDLE")
    # NOTE: the handle lists the prompt's image; token ids without its placeholder do not fit it
    text_only = list(prompt.token_ids[:1])
    await expect_error(decode(prompt_token_ids=text_only), invalid, "IMAGE_COUNT_MISMATCH")

    aggregated_only = prefill_pb.PrefillRequest(request_id="b2", prompt=prompt)
    await expect_error(
        lambda: stubs.aggregated.Prefill(aggregated_only), precondition, "WRONG_MODE"
    )
    whole = prefill_pb.PrefillDecodeRequest(request_id="b3", prompt=prompt)
    await expect_error(lambda: stubs.prefill.PrefillDecode(whole), precondition, "WRONG_MODE")
    release(stubs.plane, prompt)
    # the unused handle: decode it so the producer frees its blocks now
    _ = [r async for r in decode()()]
