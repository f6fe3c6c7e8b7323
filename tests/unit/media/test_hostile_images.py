"""Images built to hurt: unsupported formats, corrupt data, JPEG scan bombs. Each is refused
with a message about the input, never the decoder's own text, and before costly decoding."""

from __future__ import annotations

import time

import pytest
from PIL import ImageFile

from epd.common.errors import InvalidArgument
from epd.server.media.decode import decode_image
from epd.server.media.loader import MediaLoader
from epd.server.media.policy import MediaPolicy
from tests.unit.media.images import encode, noise, scan_bomb

POLICY = MediaPolicy(max_bytes=1 << 20)
LEAKS = ("0x", "BytesIO", "Ghostscript", "Error", "PIL", "<", "cannot identify")


def refusal(data: bytes, policy: MediaPolicy = POLICY) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as caught:
        decode_image(data, policy)
    return caught.value


@pytest.fixture
def no_decoding(monkeypatch) -> None:
    """Fails the test if any pixel decoding starts."""

    def load(self: ImageFile.ImageFile) -> None:
        raise AssertionError(f"{self.format} image decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)


@pytest.mark.parametrize(
    "data, reason, says",
    [
        (encode(noise(8, 8), "EPS"), "UNSUPPORTED_IMAGE_FORMAT", "EPS images are not accepted"),
        (b"definitely not an image", "BAD_IMAGE", "not in a supported format"),
        (encode(noise())[:200], "BAD_IMAGE", "PNG data is truncated or corrupt"),
        (encode(noise())[:40], "BAD_IMAGE", "PNG data is truncated or corrupt"),
        (encode(noise(), "JPEG")[:300], "BAD_IMAGE", "JPEG data is truncated or corrupt"),
        (encode(noise(), "ICO"), "UNSUPPORTED_IMAGE_FORMAT", "ICO images are not accepted"),
    ],
)
def test_refusals_say_what_is_wrong_with_the_input(data: bytes, reason: str, says: str) -> None:
    error = refusal(data)
    assert error.reason == reason and says in error.message
    assert not any(leak in error.message for leak in LEAKS), error.message


def test_the_message_lists_the_supported_formats() -> None:
    assert "(supported: PNG, JPEG, WEBP, GIF, BMP, TIFF)" in refusal(b"junk").message
    png_only = MediaPolicy(image_formats=("PNG",))
    error = refusal(encode(noise(), "JPEG"), png_only)
    assert error.reason == "UNSUPPORTED_IMAGE_FORMAT" and "(supported: PNG)" in error.message


def test_formats_outside_the_list_are_not_parsed(no_decoding: None, monkeypatch) -> None:
    from PIL import EpsImagePlugin

    def parse(self: object) -> None:
        raise AssertionError("the EPS plugin parsed untrusted bytes")

    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", parse)
    assert refusal(encode(noise(8, 8), "EPS")).reason == "UNSUPPORTED_IMAGE_FORMAT"


def test_policies_refuse_unknown_and_external_program_formats() -> None:
    with pytest.raises(ValueError, match="external program"):
        MediaPolicy(image_formats=("PNG", "EPS"))
    with pytest.raises(ValueError, match="not formats Pillow reads"):
        MediaPolicy(image_formats=("PNG", "HEIC-ISH"))


def test_a_jpeg_scan_bomb_is_refused_before_decoding(no_decoding: None) -> None:
    bomb = scan_bomb(4096, 2000)
    assert len(bomb) < 200_000
    start = time.perf_counter()
    error = refusal(bomb)
    assert time.perf_counter() - start < 1.0
    assert error.reason == "IMAGE_TOO_COMPLEX" and "2000 scans, the limit is 100" in error.message


async def test_a_small_scan_bomb_is_refused_by_the_loader_too(no_decoding: None) -> None:
    loader = MediaLoader(POLICY, model_id="m", processor_fingerprint="p")
    with pytest.raises(InvalidArgument) as caught:
        await loader.load(data=scan_bomb(64, 5000))
    assert caught.value.reason == "IMAGE_TOO_COMPLEX"


def test_progressive_jpegs_within_the_scan_limit_decode() -> None:
    color = encode(noise(), "JPEG", progressive=True)
    assert decode_image(color, POLICY).size == (64, 48)
    assert decode_image(scan_bomb(64, 100), POLICY).size == (64, 64)
    assert refusal(scan_bomb(64, 101)).reason == "IMAGE_TOO_COMPLEX"
    assert refusal(color, MediaPolicy(max_jpeg_scans=5)).reason == "IMAGE_TOO_COMPLEX"
    assert decode_image(encode(noise(), "JPEG"), MediaPolicy(max_jpeg_scans=1)).size == (64, 48)
