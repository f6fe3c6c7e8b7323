"""vLLM engine prompts for images that come as embeddings, or as grids only (decode).

Embeddings enter vLLM as its public input: ``multi_modal_data={"image": family.vllm_data(...)}``
with the prompt's one placeholder per image, named through ``multi_modal_uuids``, and vLLM's
renderer expands each placeholder to its rows and makes the family's items. Rendering them here
instead (``vllm_embeds`` kept a copy of the renderer's output per family and injected it into the
processor cache) saved 0.0-1.0 ms of a 16-17 ms E/PD TTFT on the tiny model and nothing on the
small one, within the run-to-run noise (``scripts/bench_pd.py``, docs/engine.md), so it is gone;
it stays only for a family whose items vLLM's renderer makes wrongly (``ModelFamily.vllm_items``
not None: LLaVA-OneVision and InternVL, whose embeddings of different row counts vLLM 0.32 batches
together and dies on), built as the renderer builds them (a test compares them).

Names: embeddings their encoder bound to the image's mm_hash (``EngineImage.is_bound``: the
content tag of their shared-memory segment, which only the encoder writes) are named by that
mm_hash and their dtype; others by a hash of their bytes, dtype, shape and grid, so vLLM's caches
(processor, encoder, prefix) share an entry only between equal embeddings whatever a caller
claims. Grid-only images (decode after a remote prefill: their KV is pulled, never
recomputed) get zero embeddings of the right shape, so vLLM lays out positions as the prefill did,
named by the route's ``mm_hash``, else uniquely per request.

A decode engine learns those images from the KV handle alone: ``VllmEngine.prefill`` lists them
in its ``kv_transfer_params`` (``IMAGE_GRIDS_KEY`` and the lists beside it), and
``take_handle_images`` reads them back and takes them off (vLLM's connector never sees them).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch

from epd.common.errors import InvalidArgument
from epd.server.engine.base import EngineImage
from epd.server.engine.prompt_check import VisionLayout
from epd.server.models.video import VideoRefused

EMBEDS_HASH_PREFIX = "epd-embeds-"
EMBEDS_BOUND_PREFIX = "epd-mm-"
# The handle's lists, one entry per image of the prompt (images, then videos): its [t, h, w] grid;
# its name (mm_hash); a video's seconds per temporal patch (0.0 where its family has none), null
# where an image; a video's time of each temporal patch in seconds (Qwen3-VL's timestamps, which
# its engine writes into the prompt: decode lays the prompt out as prefill did only with them),
# an empty list where its family shows none, null where an image. The video lists are there only
# where the prompt has videos.
IMAGE_GRIDS_KEY = "epd_image_grids"
IMAGE_HASHES_KEY = "epd_image_hashes"
VIDEO_SECONDS_KEY = "epd_video_seconds"
VIDEO_TIMESTAMPS_KEY = "epd_video_timestamps"
# Each list beside the grids: its key, its entries where it is missing, what an entry must be.
_HANDLE_LISTS: tuple[tuple[str, Any, Callable[[Any], bool], str], ...] = (
    (IMAGE_HASHES_KEY, "", lambda name: isinstance(name, str), "one string"),
    (
        VIDEO_SECONDS_KEY,
        None,
        lambda value: value is None or type(value) in (int, float),
        "a number or null",
    ),
    (
        VIDEO_TIMESTAMPS_KEY,
        None,
        lambda value: (
            value is None
            or (isinstance(value, list) and all(type(n) in (int, float) for n in value))
        ),
        "a list of numbers or null",
    ),
)


def embeddings_prompt(
    request_id: str,
    token_ids: list[int],
    images: list[EngineImage],
    layout: VisionLayout,
    hash_algorithm: str = "blake3",
) -> dict[str, Any]:
    """vLLM's prompt for ``token_ids`` whose images have embeddings or grids only: the public
    input for vLLM's renderer, or (``"type": "multimodal"``) an input rendered already, for a
    family whose ``vllm_items`` are not None.

    Call ``layout.check`` first: every image needs a valid grid, and its embeddings (if any)
    the rows that grid gives.
    """
    family = layout.family
    pictures = [image for image in images if not image.is_video]
    videos = [image for image in images if image.is_video]
    embeddings, grids, names = _named(request_id, pictures, layout, hash_algorithm)
    if not videos and (items := family.vllm_items(embeddings, grids)) is not None:
        return _rendered(token_ids, images, layout, items, names)
    data: dict[str, Any] = {}
    uuids: dict[str, list[str]] = {}
    if pictures:
        data["image"], uuids["image"] = family.vllm_data(embeddings, grids), names
    if videos:
        embeddings, grids, names = _named(f"{request_id}-video", videos, layout, hash_algorithm)
        seconds = [video.seconds_per_temporal_patch or 0.0 for video in videos]
        timestamps = [video.timestamps for video in videos]
        try:
            data["video"] = family.vllm_video_data(embeddings, grids, seconds, timestamps)
        except VideoRefused as e:  # NOTE: LLaVA-OneVision takes video on transformers only
            raise InvalidArgument(str(e), reason=e.reason) from e
        uuids["video"] = names
    return {
        "prompt_token_ids": list(token_ids),
        "multi_modal_data": data,
        "multi_modal_uuids": uuids,
    }


def _named(
    request_id: str, images: list[EngineImage], layout: VisionLayout, hash_algorithm: str
) -> tuple[list[torch.Tensor], list[tuple[int, int, int]], list[str]]:
    """Each image's embeddings (zeros for a grid-only one), grid and name for vLLM's caches."""
    embeddings, grids, names = [], [], []
    for index, image in enumerate(images):
        assert image.grid is not None  # checked by VisionLayout.check
        embeds = image.embeddings
        if embeds is None:
            t, h, w = image.grid
            embeds = torch.zeros(t * h * w // layout.merge_size**2, layout.embedding_width)
            names.append(image.mm_hash or f"{request_id}-{index}")
        elif image.is_bound:
            # NOTE: the image and the precision they were computed in: what equal embeddings share
            dtype = str(embeds.dtype).removeprefix("torch.")
            names.append(f"{EMBEDS_BOUND_PREFIX}{image.mm_hash}-{dtype}")
        else:
            names.append(embeddings_hash(embeds, image.grid, hash_algorithm))
        embeddings.append(embeds)
        grids.append(image.grid)
    return embeddings, grids, names


def _rendered(
    token_ids: list[int],
    images: list[EngineImage],
    layout: VisionLayout,
    items: list[dict[str, Any]],
    names: list[str],
) -> dict[str, Any]:
    """The ``MultiModalInput`` vLLM's renderer would make of ``items``."""
    from vllm.inputs.engine import mm_input
    from vllm.multimodal.inputs import MultiModalKwargsItem, MultiModalKwargsItems, PlaceholderRange

    expanded, ranges = layout.expand_with_ranges(token_ids, images)
    kwargs = MultiModalKwargsItems({"image": [MultiModalKwargsItem(item) for item in items]})
    placeholders = [
        PlaceholderRange(offset=offset, length=length, is_embed=_rows_mask(layout, length))
        for offset, length in ranges
    ]
    engine_input: dict[str, Any] = mm_input(
        expanded, kwargs, {"image": names}, {"image": placeholders}
    )  # type: ignore[assignment]
    return engine_input


def _rows_mask(layout: VisionLayout, length: int) -> torch.Tensor | None:
    """Which tokens of a placeholder run of ``length`` take embedding rows (vLLM's
    ``is_embed``): None where the run is rows alone, else all but the delimiters."""
    if not layout.num_delimiters:
        return None
    mask = torch.zeros(length, dtype=torch.bool)
    mask[len(layout.image_start_ids) : length - len(layout.image_end_ids)] = True
    return mask


def embeddings_hash(
    embeds: torch.Tensor, grid: tuple[int, int, int], algorithm: str = "blake3"
) -> str:
    """A name for ``embeds`` at ``grid`` that only equal embeddings share.

    ``algorithm``: the engine's multimodal hash (vLLM's ``mm_hasher_algorithm``: blake3, sha256
    or sha512).
    """
    if algorithm == "blake3":
        from blake3 import blake3

        hasher: Any = blake3()
    else:
        hasher = hashlib.new(algorithm)
    header = f"{embeds.dtype}:{list(embeds.shape)}:{list(grid)}:"
    hasher.update(header.encode())
    payload = embeds.detach().cpu().contiguous()
    if payload.numel():
        hasher.update(payload.view(-1).view(torch.uint8).numpy())
    digest: str = hasher.hexdigest()
    return EMBEDS_HASH_PREFIX + digest


def take_handle_images(params: dict[str, Any]) -> list[EngineImage]:
    """The prompt's images as the prefill engine listed them in ``params`` (``IMAGE_GRIDS_KEY``
    and the lists beside it, taken off ``params``): each one's grid and name, a video's timing;
    none listed: empty. INVALID_ARGUMENT ``BAD_KV_HANDLE`` when the grids are not lists of three
    positive ints or another list has not one valid entry per grid (a caller's mistake, told
    without a traceback)."""
    grids = params.pop(IMAGE_GRIDS_KEY, None) or []
    if not isinstance(grids, list) or not all(
        isinstance(grid, list) and len(grid) == 3 and all(type(n) is int and n > 0 for n in grid)
        for grid in grids
    ):
        raise InvalidArgument(
            f"kv_handle.payload's {IMAGE_GRIDS_KEY} must list [t, h, w] grids of positive ints",
            reason="BAD_KV_HANDLE",
        )
    lists = []
    for key, missing, is_entry, entry in _HANDLE_LISTS:
        values = params.pop(key, [missing] * len(grids))
        if not (
            isinstance(values, list)
            and len(values) == len(grids)
            and all(is_entry(value) for value in values)
        ):
            raise InvalidArgument(
                f"kv_handle.payload's {key} must list {entry} per image grid",
                reason="BAD_KV_HANDLE",
            )
        lists.append(values)
    return [
        EngineImage(
            name, (t, h, w), seconds_per_temporal_patch=video, timestamps=tuple(stamp or ())
        )
        for (t, h, w), name, video, stamp in zip(grids, *lists, strict=True)
    ]
