"""Where MediaLoader decodes: small images (by their declared size) on the event loop, larger
ones in a worker thread, the outcome the same either way; bytes that no allowed format opens are
refused before any decode. Each image's header is read once."""

from __future__ import annotations

import base64
import threading

import pytest
from PIL import Image

from epd.common.errors import InvalidArgument
from epd.server.media import loader as loader_module
from epd.server.media.loader import INLINE_DECODE_PIXELS, MediaLoader
from epd.server.media.policy import MediaPolicy

from .images import encode, noise


def recording_loader(policy: MediaPolicy | None = None) -> tuple[MediaLoader, list[bool]]:
    policy = policy or MediaPolicy()
    media = MediaLoader(policy, model_id="m", processor_fingerprint="p", cache_items=0)
    on_loop: list[bool] = []
    decode = media._decode_and_hash
    loop_thread = threading.get_ident()

    def recorded(raw: bytes, image: Image.Image) -> loader_module.LoadedImage:
        on_loop.append(threading.get_ident() == loop_thread)
        return decode(raw, image)

    media._decode_and_hash = recorded  # type: ignore[method-assign]
    return media, on_loop


async def test_small_images_decode_on_the_loop_large_ones_in_a_thread() -> None:
    media, on_loop = recording_loader()
    small, large = noise(64, 48, seed=1), Image.new("RGB", (INLINE_DECODE_PIXELS // 100, 101))
    loaded = [await media.load(data=encode(image)) for image in (small, large)]
    assert on_loop == [True, False]
    assert [item.image.size for item in loaded] == [small.size, large.size]
    assert loaded[0].image.tobytes() == small.tobytes()


async def test_a_fetched_image_decodes_in_a_thread_whatever_its_size(tmp_path) -> None:
    """Its fetch costs more than the hand-off: no second choice of thread after it."""
    media, on_loop = recording_loader(MediaPolicy(allow_local_files=True))
    path = tmp_path / "small.png"
    path.write_bytes(encode(noise(64, 48, seed=5)))
    loaded = await media.load(url=path.as_uri())
    assert (loaded.width, loaded.height) == (64, 48) and on_loop == [False]


async def test_unreadable_bytes_are_refused_before_any_decode() -> None:
    media, on_loop = recording_loader()
    with pytest.raises(InvalidArgument) as caught:
        await media.load(data=b"\x89PNG\r\n\x1a\n not really")
    assert caught.value.reason == "BAD_IMAGE" and on_loop == []
    assert media.num_refused["BAD_IMAGE"] == 1


@pytest.mark.parametrize("size", [(64, 48), (INLINE_DECODE_PIXELS // 100, 101)])
async def test_each_image_is_opened_once(monkeypatch: pytest.MonkeyPatch, size) -> None:
    """Its header is read once, for the pixel limit and the choice of thread alike."""
    media = MediaLoader(MediaPolicy(), model_id="m", processor_fingerprint="p")
    opened: list[int] = []
    real_open = Image.open

    def counted_open(*args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(1)
        return real_open(*args, **kwargs)

    monkeypatch.setattr(Image, "open", counted_open)
    loaded = await media.load(data=encode(noise(*size, seed=2)))
    assert (loaded.width, loaded.height) == size and len(opened) == 1


async def test_small_images_load_without_a_turn_of_the_event_loop() -> None:
    media = MediaLoader(MediaPolicy(), model_id="m", processor_fingerprint="p")
    data = encode(noise(64, 48, seed=3))
    for expect_hit in (False, True):
        load = media.load(data=data)
        with pytest.raises(StopIteration) as finished:  # NOTE: done at the first step, no await
            load.send(None)
        assert finished.value.value.image.size == (64, 48)
        assert media.cache.num_hits == expect_hit and media.cache.num_loads == 1


async def test_a_data_url_loads_as_its_payloads_bytes() -> None:
    """A small image in a data: URL loads as its bytes do, without a turn of the event loop, and
    the same bytes sent either way are one cache entry."""
    media = MediaLoader(MediaPolicy(), model_id="m", processor_fingerprint="p")
    data = encode(noise(64, 48, seed=4))
    load = media.load(url="data:image/png;base64," + base64.b64encode(data).decode())
    with pytest.raises(StopIteration) as finished:  # NOTE: done at the first step, no await
        load.send(None)
    loaded = finished.value.value
    assert (loaded.width, loaded.height) == (64, 48)
    assert (await media.load(data=data)).mm_hash == loaded.mm_hash
    assert media.cache.num_loads == 1 and media.cache.num_hits == 1
