"""MediaPolicy flags: every knob in --help, EPD_* environment fallbacks, checked values."""

from __future__ import annotations

import argparse

import pytest

from epd.server.media.media_cli import add_media_arguments, media_policy
from epd.server.media.policy import MediaPolicy


def parse(argv: list[str]) -> MediaPolicy:
    parser = argparse.ArgumentParser()
    add_media_arguments(parser)
    return media_policy(parser.parse_args(argv))


def test_defaults_match_the_dataclass() -> None:
    assert parse([]) == MediaPolicy()


def test_new_limits_have_flags_and_env_fallbacks(monkeypatch) -> None:
    parser = argparse.ArgumentParser()
    add_media_arguments(parser)
    help_text = parser.format_help()
    for flag in ("--media-max-url-chars", "--media-image-formats", "--media-max-jpeg-scans"):
        assert flag in help_text
    flags = [
        "--media-max-url-chars",
        "100",
        "--media-image-formats",
        "png, jpeg",
        "--media-max-jpeg-scans",
        "7",
    ]
    policy = parse(flags)
    assert (policy.max_url_chars, policy.image_formats, policy.max_jpeg_scans) == (
        100,
        ("PNG", "JPEG"),
        7,
    )
    monkeypatch.setenv("EPD_MEDIA_MAX_URL_CHARS", "200")
    monkeypatch.setenv("EPD_MEDIA_IMAGE_FORMATS", "webp")
    monkeypatch.setenv("EPD_MEDIA_MAX_JPEG_SCANS", "9")
    policy = parse([])
    assert (policy.max_url_chars, policy.image_formats, policy.max_jpeg_scans) == (
        200,
        ("WEBP",),
        9,
    )


@pytest.mark.parametrize(
    "settings", [{"max_url_chars": 0}, {"max_jpeg_scans": 0}, {"image_formats": ()}]
)
def test_bad_settings_fail_at_construction(settings: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        MediaPolicy(**settings)  # type: ignore[arg-type]
