"""Decoding hostile or unusual images, and the content hash."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from PIL import Image

from epd.common.errors import InvalidArgument
from epd.server.media.decode import decode_image
from epd.server.media.hashing import mm_hash, processor_fingerprint
from epd.server.media.policy import MediaPolicy
from tests.unit.media.images import encode, noise

POLICY = MediaPolicy(max_bytes=1 << 20, max_pixels=1_000_000)


def reason_of(data: bytes, policy: MediaPolicy = POLICY) -> str:
    with pytest.raises(InvalidArgument) as caught:
        decode_image(data, policy)
    return caught.value.reason


def test_png_and_jpeg_decode_to_rgb() -> None:
    for fmt in ("PNG", "JPEG", "WEBP", "BMP", "TIFF", "GIF"):
        image = decode_image(encode(noise(), fmt), POLICY)
        assert image.mode == "RGB" and image.size == (64, 48)


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", "EMPTY_IMAGE"),
        (b"definitely not an image", "BAD_IMAGE"),
        (encode(noise())[:200], "BAD_IMAGE"),
        (b"\0" * (2 << 20), "IMAGE_TOO_LARGE"),
    ],
)
def test_bad_bytes_are_refused_with_reasons(data: bytes, reason: str) -> None:
    assert reason_of(data) == reason


def test_declared_dimensions_are_checked_before_decoding() -> None:
    bomb = encode(Image.new("L", (4000, 4000)), "PNG")
    assert len(bomb) < POLICY.max_bytes
    assert reason_of(bomb) == "TOO_MANY_PIXELS"


def test_exif_orientation_is_applied() -> None:
    image = noise(40, 20)
    exif = Image.Exif()
    exif[0x0112] = 6
    rotated = decode_image(encode(image, "JPEG", exif=exif), POLICY)
    assert rotated.size == (20, 40)


@pytest.mark.parametrize(
    "mode, pixels",
    [
        ("I;16", np.full((8, 8), 65535, dtype=np.uint16)),
        ("F", np.full((8, 8), 1.0, dtype=np.float32)),
        ("I", np.full((8, 8), 65535, dtype=np.int32)),
    ],
)
def test_wide_modes_scale_to_8_bits(mode: str, pixels: np.ndarray) -> None:
    image = Image.fromarray(pixels)
    assert image.mode == mode
    decoded = decode_image(encode(image, "TIFF"), POLICY)
    assert decoded.mode == "RGB" and decoded.getpixel((0, 0)) == (255, 255, 255)


def test_alpha_palette_cmyk_and_animation_normalise() -> None:
    transparent = Image.new("RGBA", (4, 4), (255, 0, 0, 0))
    assert decode_image(encode(transparent), POLICY).getpixel((0, 0)) == (255, 255, 255)
    palette = noise().convert("P")
    assert decode_image(encode(palette), POLICY).mode == "RGB"
    cmyk = Image.new("CMYK", (4, 4), (0, 255, 255, 0))
    assert decode_image(encode(cmyk, "JPEG"), POLICY).getpixel((0, 0))[0] > 200
    frames = [Image.new("RGB", (8, 8), color) for color in ((255, 0, 0), (0, 0, 255))]
    animated = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    assert decode_image(animated, POLICY).getpixel((0, 0))[0] > 200


def test_mm_hash_depends_on_pixels_model_and_processor(tmp_path) -> None:
    image = np.asarray(noise())
    same = np.asarray(decode_image(encode(noise(), "PNG"), POLICY))
    base = mm_hash(image, model_id="m", processor_fingerprint="p")
    assert mm_hash(same, model_id="m", processor_fingerprint="p") == base
    assert mm_hash(np.asarray(noise(seed=1)), model_id="m", processor_fingerprint="p") != base
    assert mm_hash(image, model_id="other", processor_fingerprint="p") != base
    assert mm_hash(image, model_id="m", processor_fingerprint="q") != base
    (tmp_path / "preprocessor_config.json").write_text('{"b": 1, "a": 2}')
    first = processor_fingerprint(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text('{"a": 2, "b": 1}')
    assert processor_fingerprint(tmp_path) == first
    (tmp_path / "preprocessor_config.json").write_text('{"a": 3, "b": 1}')
    assert processor_fingerprint(tmp_path) != first


def test_mm_hash_of_pixels_is_the_hash_of_the_pillow_image_they_come_from() -> None:
    """mm_hash keys caches and routing across processes and versions: hashing the pixel array
    (no copy) gives the digest the Pillow image's bytes, mode and size always gave."""
    image = noise(seed=2)
    digest = hashlib.blake2b(digest_size=16)
    for part in (b"epd-mm-v1", b"m", b"p", b"RGB", f"{image.width}x{image.height}".encode()):
        digest.update(len(part).to_bytes(4, "little") + part)
    digest.update(image.tobytes())
    pixels = np.asarray(image)
    assert mm_hash(pixels, model_id="m", processor_fingerprint="p") == digest.hexdigest()
