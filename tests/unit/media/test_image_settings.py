"""An image's pixel budget (vLLM 0.32's image ``mm_processor_kwargs``): resolved as vLLM
resolves it (flat or under ``images_kwargs``, ``size``'s edges then ``min_pixels`` /
``max_pixels``, the request's over the server's), completed with the processor's own bounds,
checked (min over max, the media pixel limit) with 400s naming the key; the grid under it is
the model's processor's under the same kwargs; it is part of the image's identity; and it
travels as a canonical key that another hop reads back or refuses."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from epd.common.errors import InvalidArgument
from epd.server.media.grid import ImageGridder
from epd.server.media.hashing import under_settings
from epd.server.media.image_settings import (
    NO_IMAGE_SETTINGS,
    ImageSettings,
    image_settings_of,
)
from epd.server.media.loader import MediaLoader
from epd.server.media.policy import MediaPolicy
from epd.server.media.video_overrides import NO_KWARGS, MediaKwargs
from epd.server.route.media import load_images
from epd.server.route.request import ImageSource

TRUSTED = MediaPolicy(trust_request_mm_kwargs=True)
# the tiny checkpoint's own bounds (its preprocessor_config.json)
OWN_MIN, OWN_MAX = 3136, 50176


@pytest.fixture(scope="module")
def gridder(tiny_model_dir: Path) -> ImageGridder:
    return ImageGridder(tiny_model_dir)


def budget_of(
    gridder: ImageGridder,
    request: dict[str, Any] | None,
    server: dict[str, Any] | None = None,
    max_pixels: int = TRUSTED.max_pixels,
) -> ImageSettings:
    return gridder.budget(MediaKwargs(server), MediaKwargs(request), max_pixels)


@pytest.mark.parametrize(
    ("request_kwargs", "server_kwargs", "expected"),
    [
        (None, None, NO_IMAGE_SETTINGS),
        ({"max_pixels": 5000}, None, ImageSettings(OWN_MIN, 5000)),
        ({"min_pixels": 20000}, None, ImageSettings(20000, OWN_MAX)),
        ({"images_kwargs": {"max_pixels": 6000}, "max_pixels": 5000}, None, (OWN_MIN, 6000)),
        ({"size": {"shortest_edge": 4000, "longest_edge": 9000}}, None, (4000, 9000)),
        ({"size": {"longest_edge": 9000}, "max_pixels": 8000}, None, (OWN_MIN, 8000)),
        ({"videos_kwargs": {"max_pixels": 5000}}, None, NO_IMAGE_SETTINGS),
        (None, {"max_pixels": 7000}, (OWN_MIN, 7000)),
        ({"min_pixels": 4000}, {"max_pixels": 7000}, (4000, 7000)),
        ({"max_pixels": 9000}, {"max_pixels": 7000}, (OWN_MIN, 9000)),
        ({"fps": 1, "do_rescale": True, "cap_pixels_per_frame": True}, None, NO_IMAGE_SETTINGS),
    ],
)
def test_the_budget_is_vllms_resolution_completed_with_the_processors_bounds(
    gridder: ImageGridder, request_kwargs: Any, server_kwargs: Any, expected: Any
) -> None:
    if isinstance(expected, tuple):
        expected = ImageSettings(*expected)
    assert budget_of(gridder, request_kwargs, server_kwargs) == expected


@pytest.mark.parametrize(
    ("request_kwargs", "param", "reason"),
    [
        ({"min_pixels": 9000, "max_pixels": 5000}, "mm_processor_kwargs.min_pixels", "BAD"),
        ({"max_pixels": -1}, "mm_processor_kwargs.max_pixels", "BAD"),
        ({"max_pixels": 1.5}, "mm_processor_kwargs.max_pixels", "BAD"),
        ({"images_kwargs": {"min_pixels": "many"}}, "mm_processor_kwargs.min_pixels", "BAD"),
        ({"size": {"height": 64}}, "mm_processor_kwargs.size.height", "NOT"),
        ({"min_pixels": 40_000_000}, "mm_processor_kwargs.min_pixels", "BAD"),
    ],
)
def test_a_bad_budget_is_a_400_naming_the_key(
    gridder: ImageGridder, request_kwargs: Any, param: str, reason: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        budget_of(gridder, request_kwargs)
    reasons = {"BAD": "BAD_MEDIA_KWARGS", "NOT": "MEDIA_KWARGS_NOT_SUPPORTED"}
    assert (caught.value.metadata["param"], caught.value.reason) == (param, reasons[reason])


def test_a_floor_over_the_media_pixel_limit_is_refused(gridder: ImageGridder) -> None:
    assert budget_of(gridder, {"min_pixels": 4000}, max_pixels=4000).min_pixels == 4000
    with pytest.raises(InvalidArgument, match="--media-max-pixels"):
        budget_of(gridder, {"min_pixels": 4001}, max_pixels=4000)


@pytest.mark.parametrize(
    "kwargs",
    [{"max_pixels": 5000}, {"min_pixels": 20000}, {"min_pixels": 4000, "max_pixels": 9000}],
    ids=str,
)
def test_the_grid_under_a_budget_is_the_processors_under_the_same_kwargs(
    gridder: ImageGridder, tiny_model_dir: Path, kwargs: dict[str, int]
) -> None:
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(tiny_model_dir)
    settings = budget_of(gridder, kwargs)
    sizes = [(150, 100), (96, 64), (1000, 700), (57, 113)]
    grids = [gridder.grid_of_size(width, height, settings) for width, height in sizes]
    for (width, height), grid in zip(sizes, grids, strict=True):
        image = Image.new("RGB", (width, height), (30, 60, 90))
        (expected,) = processor(images=[image], return_tensors="pt", **kwargs)["image_grid_thw"]
        assert grid == tuple(expected.tolist())
    assert grids != [gridder.grid_of_size(width, height) for width, height in sizes]


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_every_qwen_familys_grid_under_a_budget_is_its_processors(
    tiny_family_dir: Any, family: str
) -> None:
    from transformers import AutoImageProcessor

    model_dir = tiny_family_dir(family)
    gridder = ImageGridder(model_dir)
    processor = AutoImageProcessor.from_pretrained(model_dir)
    for kwargs in ({"max_pixels": 5000}, {"min_pixels": 40000}):
        settings = budget_of(gridder, kwargs)
        image = Image.new("RGB", (150, 100), (30, 60, 90))
        (expected,) = processor(images=[image], return_tensors="pt", **kwargs)["image_grid_thw"]
        assert gridder.grid_of_size(150, 100, settings) == tuple(expected.tolist())
        assert gridder.grid_of_size(150, 100, settings) != gridder.grid_of_size(150, 100)


def test_a_fixed_size_processor_refuses_a_budget_and_ignores_keys_it_does_not_take(
    tiny_family_dir: Any,
) -> None:
    gridder = ImageGridder(tiny_family_dir("llava"))
    assert budget_of(gridder, {"min_pixels": 4000, "max_pixels": 9000}) == NO_IMAGE_SETTINGS
    with pytest.raises(InvalidArgument) as caught:
        budget_of(gridder, {"size": {"shortest_edge": 4000}})
    assert caught.value.reason == "MEDIA_KWARGS_NOT_SUPPORTED"


def test_the_key_is_canonical_and_read_back() -> None:
    settings = ImageSettings(max_pixels=5000, min_pixels=3136)
    assert settings.key == '{"max_pixels": 5000, "min_pixels": 3136}'
    assert image_settings_of(settings.key) == settings
    assert NO_IMAGE_SETTINGS.key == "" and image_settings_of("") == NO_IMAGE_SETTINGS


def test_a_key_is_read_back_within_the_media_pixel_limit() -> None:
    """A worker reads the route's budget and holds its floor to its own limit in one call."""
    settings = ImageSettings(min_pixels=3136, max_pixels=9000)
    assert image_settings_of(settings.key, 3136) == settings
    assert image_settings_of("", 1) == NO_IMAGE_SETTINGS
    with pytest.raises(InvalidArgument) as caught:
        image_settings_of(settings.key, 3135)
    assert caught.value.reason == "BAD_MEDIA_KWARGS"
    assert caught.value.metadata == {"param": "mm_processor_kwargs.min_pixels"}


@pytest.mark.parametrize(
    "key",
    [
        "not json",
        "[1]",
        '{"max_pixels": 5000, "min_pixels": 3136, "fps": 1}',
        '{"min_pixels": 3136, "max_pixels": 5000}',
        '{"max_pixels": -5}',
        '{"max_pixels": 5000.0}',
        '{"max_pixels": true}',
        "{}",
    ],
)
def test_a_key_that_is_not_canonical_settings_is_refused(key: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        image_settings_of(key)
    assert caught.value.reason == "BAD_MEDIA_ITEM"


def test_an_images_identity_covers_its_budget() -> None:
    content = "ab" * 16
    small, large = ImageSettings(3136, 5000), ImageSettings(3136, 9000)
    named = {under_settings(content, settings.key) for settings in (small, large)}
    assert under_settings(content, "") == content
    assert len(named | {content}) == 3
    assert under_settings(content, small.key) == under_settings(content, small.key)
    assert under_settings("cd" * 16, small.key) not in named


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 60)).save(buffer, "PNG")
    return buffer.getvalue()


def test_the_routes_items_carry_the_budget_and_are_named_under_it(
    gridder: ImageGridder,
) -> None:
    loader = MediaLoader(TRUSTED, model_id="tiny", processor_fingerprint="p")
    source = [ImageSource(data=png(150, 100))]

    def loaded(kwargs: MediaKwargs) -> Any:
        (image,) = asyncio.run(load_images(loader, gridder, source, kwargs))
        return image

    plain, small, again = (
        loaded(kwargs)
        for kwargs in (
            NO_KWARGS,
            MediaKwargs({"max_pixels": 5000}),
            MediaKwargs({"max_pixels": 5000}),
        )
    )
    other = loaded(MediaKwargs({"images_kwargs": {"max_pixels": 9000}}))
    assert plain.item.image_settings == "" and plain.item.mm_hash == plain.loaded.mm_hash
    assert small.item.image_settings == ImageSettings(OWN_MIN, 5000).key
    assert small.item.mm_hash == under_settings(plain.loaded.mm_hash, small.item.image_settings)
    assert small.item.mm_hash == again.item.mm_hash
    assert len({plain.item.mm_hash, small.item.mm_hash, other.item.mm_hash}) == 3
    assert small.num_tokens < plain.num_tokens
    assert (small.grid.h, small.grid.w) == gridder.grid_of_size(
        150, 100, ImageSettings(OWN_MIN, 5000)
    )[1:]


def test_an_untrusted_requests_budget_is_refused_with_vllms_message(
    gridder: ImageGridder,
) -> None:
    loader = MediaLoader(MediaPolicy(), model_id="tiny", processor_fingerprint="p")
    source = [ImageSource(data=png(20, 20))]
    with pytest.raises(InvalidArgument, match="--trust-request-mm-kwargs"):
        asyncio.run(load_images(loader, gridder, source, MediaKwargs({"max_pixels": 5000})))


def test_a_clients_item_may_not_name_its_image_settings() -> None:
    """Only the route sets them (``MediaItem.image_settings``); a client sends kwargs."""
    from epd.server.route.request import from_proto
    from epd.v1 import multimodal_pb2, route_service_pb2

    item = multimodal_pb2.MediaItem(data=b"png", image_settings=ImageSettings(max_pixels=9).key)
    content = [route_service_pb2.ContentPart(image=item)]
    message = route_service_pb2.ChatMessage(role="user", content=content)
    with pytest.raises(InvalidArgument) as caught:
        from_proto(route_service_pb2.GenerateRequest(request_id="r", messages=[message]))
    assert caught.value.reason == "BAD_MEDIA_ITEM"
    assert caught.value.metadata["param"] == "messages[0].content[0].image.image_settings"


def test_the_servers_budget_reaches_every_image(gridder: ImageGridder) -> None:
    """``--mm-processor-kwargs`` (here under ``images_kwargs``) sizes an image of a request that
    sends none, untrusted or not."""
    policy = MediaPolicy(mm_processor_kwargs={"images_kwargs": {"max_pixels": 5000}})
    loader = MediaLoader(policy, model_id="tiny", processor_fingerprint="p")
    (image,) = asyncio.run(load_images(loader, gridder, [ImageSource(data=png(150, 100))]))
    assert image.item.image_settings == ImageSettings(OWN_MIN, 5000).key
    budgeted = gridder.grid_of_size(150, 100, ImageSettings(OWN_MIN, 5000))
    assert (image.grid.t, image.grid.h, image.grid.w) == budgeted
