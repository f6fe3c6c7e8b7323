"""Image grids computed without pixels equal what the model's processor produces."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from epd.common.errors import InvalidArgument
from epd.server.media.grid import ImageGridder

SIZES = [
    (96, 64),
    (10, 10),
    (1000, 30),
    (2000, 1500),
    (57, 113),
    (3000, 3000),
    (60, 90),
    (28, 28),
    (10, 300),
    (1000, 700),
    (57, 57),
]


def processor_grids(model_dir, sizes) -> list[tuple[int, int, int]]:
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(model_dir)
    grids = []
    for width, height in sizes:
        image = Image.new("RGB", (width, height), (30, 60, 90))
        (grid,) = processor(images=[image], return_tensors="pt")["image_grid_thw"].tolist()
        grids.append(tuple(grid))
    return grids


def test_grids_equal_the_processor(tiny_model_dir) -> None:
    gridder = ImageGridder(tiny_model_dir)
    expected = processor_grids(tiny_model_dir, SIZES)
    assert [gridder.grid(Image.new("RGB", size)) for size in SIZES] == expected
    assert gridder.num_tokens((1, 4, 6)) == 6


def test_legacy_pixel_limits_are_honoured(tiny_model_dir, tmp_path) -> None:
    for name in ("config.json", "preprocessor_config.json"):
        (tmp_path / name).write_text((tiny_model_dir / name).read_text())
    settings = json.loads((tmp_path / "preprocessor_config.json").read_text())
    settings.pop("size")
    settings.update(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(settings))
    gridder = ImageGridder(tmp_path)
    assert gridder.processor.size["longest_edge"] == 28 * 28 * 16
    sizes = [(2000, 1500), (10, 10)]
    assert [gridder.grid_of_size(*size) for size in sizes] == processor_grids(tmp_path, sizes)


def test_extreme_aspect_ratio_is_bad_input(tiny_model_dir) -> None:
    with pytest.raises(InvalidArgument) as caught:
        ImageGridder(tiny_model_dir).grid_of_size(5000, 10)
    assert caught.value.reason == "BAD_IMAGE_SHAPE"


@pytest.mark.parametrize(
    "size, says",
    [
        ((4000, 8), "4000x8 pixels has an aspect ratio of 500:1"),
        ((8, 4000), "8x4000 pixels has an aspect ratio of 500:1"),
        ((1000, 3), "1000x3 pixels has an aspect ratio of 333.4:1"),
    ],
)
def test_extreme_aspect_ratio_says_the_limit_and_the_fix(tiny_model_dir, size, says) -> None:
    with pytest.raises(InvalidArgument) as caught:
        ImageGridder(tiny_model_dir).grid_of_size(*size)
    assert caught.value.reason == "BAD_IMAGE_SHAPE"
    assert says in caught.value.message and "accepts at most 200:1" in caught.value.message
    assert "Error" not in caught.value.message


def test_the_suggested_pad_and_crop_are_accepted(tiny_model_dir) -> None:
    gridder = ImageGridder(tiny_model_dir)
    with pytest.raises(InvalidArgument) as caught:
        gridder.grid_of_size(4000, 8)
    assert "pad the image to at least 4000x20 or crop it to at most 1600x8" in str(caught.value)
    expected = processor_grids(tiny_model_dir, [(4000, 20), (1600, 8), (20, 4000)])
    assert [gridder.grid_of_size(*s) for s in [(4000, 20), (1600, 8), (20, 4000)]] == expected
    with pytest.raises(InvalidArgument):
        gridder.grid_of_size(4000, 19)
