"""Conversions to vLLM inputs and back from protobuf: multimodal data, sampling, image grids."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from epd.common.errors import InvalidArgument
from epd.server.engine.base import EngineImage, Sampling, TokenChunk, VideoFrames
from epd.server.engine.vllm_inputs import (
    PICTURE_NAME_PREFIX,
    VIDEO_NAME_PREFIX,
    kv_transfer_config,
    picture_data,
    raw_prompt,
)
from epd.server.media.image_settings import ImageSettings
from epd.server.worker import convert
from epd.v1 import generation_pb2


def test_pictures_pass_through_and_mixed_inputs_are_refused() -> None:
    picture = Image.new("RGB", (4, 4))
    assert picture_data([EngineImage("p", image=picture)]) == {"image": [picture]}
    mixed = [EngineImage("p", image=picture), EngineImage("a", (1, 2, 2), torch.ones(1, 8))]
    with pytest.raises(InvalidArgument) as caught:
        picture_data(mixed)
    assert caught.value.reason == "MIXED_IMAGE_INPUTS"


def test_raw_videos_go_in_as_sampled_frames_with_their_timing_and_names() -> None:
    picture = Image.new("RGB", (4, 4))
    pixels = np.zeros((4, 6, 8, 3), np.uint8)
    frames = VideoFrames(pixels, 2.5, 12, (0, 3, 6, 9))
    video = EngineImage("v", (2, 2, 2), seconds_per_temporal_patch=0.8, frames=frames)
    prompt = raw_prompt([1, 2], [EngineImage("p", image=picture), video])
    ((given, metadata),) = prompt["multi_modal_data"]["video"]
    assert prompt["multi_modal_data"]["image"] == [picture] and given is pixels
    assert metadata == {
        "fps": 2.5,
        "total_num_frames": 12,
        "duration": 12 / 2.5,
        "frames_indices": [0, 3, 6, 9],
        "do_sample_frames": False,
    }
    assert prompt["mm_processor_kwargs"] == {"do_sample_frames": False}
    assert prompt["multi_modal_uuids"] == {
        "image": [f"{PICTURE_NAME_PREFIX}p"],
        "video": [f"{VIDEO_NAME_PREFIX}v"],
    }
    assert "mm_processor_kwargs" not in raw_prompt([1], [EngineImage("p", image=picture)])
    embedded = EngineImage("e", (2, 2, 2), torch.ones(2, 8), seconds_per_temporal_patch=0.0)
    with pytest.raises(InvalidArgument) as caught:
        raw_prompt([1], [video, embedded])
    assert caught.value.reason == "MIXED_IMAGE_INPUTS"


def test_a_pixel_budget_tells_vllms_processor_to_resize_the_pictures_within_it() -> None:
    picture = Image.new("RGB", (4, 4))
    small = ImageSettings(3136, 5000)
    budgeted = [EngineImage("p", image=picture, image_settings=small)] * 2
    prompt = raw_prompt([1], budgeted)
    assert prompt["mm_processor_kwargs"] == {
        "images_kwargs": {"max_pixels": 5000, "min_pixels": 3136}
    }
    frames = VideoFrames(np.zeros((2, 6, 8, 3), np.uint8), 2.0, 2, (0, 1))
    video = EngineImage("v", (1, 2, 2), seconds_per_temporal_patch=1.0, frames=frames)
    assert raw_prompt([1], [*budgeted, video])["mm_processor_kwargs"] == {
        "do_sample_frames": False,
        "images_kwargs": small.settings,
    }
    with pytest.raises(InvalidArgument) as caught:
        raw_prompt([1], [budgeted[0], EngineImage("q", image=picture)])
    assert caught.value.reason == "MIXED_IMAGE_SETTINGS"


def test_sampling_defaults_and_ranges() -> None:
    sampling = convert.sampling_from_proto(generation_pb2.SamplingParams())
    assert sampling == Sampling(max_tokens=16, top_p=1.0)
    seeded = convert.sampling_from_proto(generation_pb2.SamplingParams(seed=0, stop=["x"]))
    assert seeded.seed == 0 and seeded.stop == ("x",)


def test_output_options_cross_the_proto_with_vllms_defaults() -> None:
    unset = convert.sampling_from_proto(generation_pb2.SamplingParams())
    assert (unset.skip_special_tokens, unset.spaces_between_special_tokens) == (True, True)
    assert (unset.prompt_logprobs, unset.priority, unset.cache_salt) == (None, 0, "")
    message = generation_pb2.SamplingParams(
        prompt_logprobs=0,
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        priority=-2,
        cache_salt="tenant",
    )
    sampling = convert.sampling_from_proto(message)
    assert sampling.prompt_logprobs == 0, "0 asks for the prompt token's own logprob"
    assert (sampling.skip_special_tokens, sampling.spaces_between_special_tokens) == (False, False)
    assert (sampling.priority, sampling.cache_salt) == (-2, "tenant")
    assert sampling.beyond_basics() == [
        "prompt_logprobs",
        "skip_special_tokens",
        "spaces_between_special_tokens",
    ], "what an engine without them refuses; priority and salt change no answer"


def test_prompt_logprobs_cross_the_proto_with_an_empty_first_position() -> None:
    chunk = TokenChunk([4], prompt_logprobs=[(), ((7, -1.5, 3, "a"), (2, -0.1, 1, "b"))])
    positions = convert.chunk_fields(chunk)["prompt_logprobs"]
    assert [len(p.candidates) for p in positions] == [0, 2]
    assert positions[1].candidates[0].token_id == 7 and positions[1].candidates[0].rank == 3
    assert "prompt_logprobs" not in convert.chunk_fields(TokenChunk([4]))


def test_logprob_token_ids_cross_the_proto_to_vllms_sampling_params() -> None:
    pytest.importorskip("vllm")
    from epd.server.engine.vllm_inputs import sampling_params

    message = generation_pb2.SamplingParams(logprob_token_ids=[9, 5])
    sampling = convert.sampling_from_proto(message)
    assert sampling.logprob_token_ids == (9, 5)
    assert sampling.beyond_basics() == ["logprob_token_ids"], "the transformers engine refuses"
    params = sampling_params(sampling)
    assert (params.logprob_token_ids, params.logprobs) == ([9, 5], None)
    assert (
        sampling_params(
            convert.sampling_from_proto(generation_pb2.SamplingParams())
        ).logprob_token_ids
        is None
    )


def test_vllm_sampling_params_reject_bad_values() -> None:
    pytest.importorskip("vllm")
    from epd.server.engine.vllm_inputs import sampling_params

    params = sampling_params(
        Sampling(max_tokens=5, temperature=0.7, top_k=3),
        max_tokens=1,
        kv_transfer_params={"do_remote_decode": True},
    )
    assert params.max_tokens == 1 and params.top_k == 3
    assert params.extra_args == {"kv_transfer_params": {"do_remote_decode": True}}
    for bad in (Sampling(max_tokens=0), Sampling(top_p=1.5), Sampling(temperature=-1.0)):
        with pytest.raises(InvalidArgument) as caught:
            sampling_params(bad)
        assert caught.value.reason == "BAD_SAMPLING"


def test_kv_transfer_config_carries_the_lease_and_refuses_bad_roles_and_leases() -> None:
    config = kv_transfer_config("kv_producer", lease_s=12)
    assert config.get_from_extra_config("kv_lease_duration", 30) == 12
    assert config.kv_buffer_device == "cpu" and config.kv_connector == "NixlConnector"
    with pytest.raises(ValueError, match="lease"):
        kv_transfer_config("kv_consumer", lease_s=5)
    with pytest.raises(ValueError, match="role"):
        kv_transfer_config("kv_sideways")
