"""Encoder pieces: cache budget, dynamic batching, devices (CUDA parts run where CUDA exists)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from epd.server.encode.batcher import DynamicBatcher
from epd.server.encode.cache import CachedEmbedding, EmbeddingCache
from epd.server.encode.vision import ACCELERATORS, VisionEncoder
from epd.server.engine.device import device_type, resolve_device


def entry(num_floats: int) -> CachedEmbedding:
    return CachedEmbedding(torch.zeros(num_floats), (1, 2, 2))


def test_cache_evicts_least_recently_used_past_its_budget() -> None:
    cache = EmbeddingCache(max_bytes=3 * 400)
    for key in "abc":
        cache.put(key, entry(100))
    assert cache.get("a") is not None
    cache.put("d", entry(100))
    assert cache.get("b") is None and cache.get("a") is not None
    assert cache.num_bytes == 1200 and len(cache) == 3
    cache.put("huge", entry(1000))
    assert cache.get("huge") is None
    assert cache.keys(2) == ["a", "d"]
    assert EmbeddingCache(0).get("x") is None


async def test_batcher_groups_concurrent_items_and_keeps_order() -> None:
    calls: list[list[int]] = []

    def run(items: list[int]) -> list[int]:
        calls.append(items)
        return [item * 10 for item in items]

    batcher: DynamicBatcher[int, int] = DynamicBatcher(run, max_items=4, max_wait_s=0.05)
    results = await asyncio.gather(*(batcher.submit(i) for i in range(10)))
    assert results == [i * 10 for i in range(10)]
    assert len(calls) == 3 and max(len(c) for c in calls) == 4
    assert batcher.stats.num_items == 10
    await batcher.close()


async def test_without_a_wait_a_batch_takes_every_item_queued_while_the_tower_ran() -> None:
    """The default (no wait): items that queued while the tower was busy go in the next batch
    together (asyncio.wait_for(get(), 0) took none of them: every batch was one item)."""
    gate, sizes = threading.Event(), []

    def run(items: list[int]) -> list[int]:
        gate.wait(10)
        sizes.append(len(items))
        return items

    batcher: DynamicBatcher[int, int] = DynamicBatcher(run, max_items=8, max_wait_s=0)
    first = asyncio.ensure_future(batcher.submit(0))
    await asyncio.sleep(0.05)
    rest = [asyncio.ensure_future(batcher.submit(i)) for i in range(1, 6)]
    await asyncio.sleep(0.05)
    gate.set()
    assert await asyncio.gather(first, *rest) == list(range(6))
    assert sizes == [1, 5]
    await batcher.close()


async def test_short_batches_run_on_the_event_loop_long_ones_in_a_thread() -> None:
    threads: list[int] = []

    def run(items: list[float]) -> list[float]:
        threads.append(threading.get_ident())
        time.sleep(max(items))
        return items

    batcher: DynamicBatcher[float, float] = DynamicBatcher(run, max_items=8, inline_below_s=0.05)
    assert await batcher.submit(0.001) == 0.001  # NOTE: no history yet: a thread
    assert await batcher.submit(0.001) == 0.001
    assert await batcher.submit(0.2) == 0.2  # NOTE: expected short from the last one: inline
    assert await batcher.submit(0.001) == 0.001  # NOTE: expected long now: a thread
    loop_thread = threading.get_ident()
    assert [t == loop_thread for t in threads] == [False, True, True, False]
    await batcher.close()


class SlowHandOff(ThreadPoolExecutor):
    """A thread whose hand-off takes far longer than the batch itself."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        def late() -> Any:
            time.sleep(0.1)
            return fn(*args, **kwargs)

        return super().submit(late)


async def test_a_slow_hand_off_to_a_thread_does_not_keep_short_batches_off_the_loop() -> None:
    threads: list[int] = []
    executor = SlowHandOff(1)
    batcher: DynamicBatcher[int, int] = DynamicBatcher(
        lambda items: threads.append(threading.get_ident()) or items,  # type: ignore[func-returns-value]
        max_items=8,
        inline_below_s=0.05,
        executor=executor,
    )
    assert await batcher.submit(1) == 1  # NOTE: no history yet: a thread
    assert batcher.stats.item_run_ms < 50 <= batcher.stats.item_latency_ms
    assert await batcher.submit(2) == 2
    assert [t == threading.get_ident() for t in threads] == [False, True]
    await batcher.close()
    executor.shutdown()


async def test_without_an_inline_budget_every_batch_runs_in_a_thread() -> None:
    threads: list[int] = []
    batcher: DynamicBatcher[int, int] = DynamicBatcher(
        lambda items: threads.append(threading.get_ident()) or items,  # type: ignore[func-returns-value]
        max_items=8,
    )
    assert await asyncio.gather(*(batcher.submit(i) for i in range(3))) == [0, 1, 2]
    assert await batcher.submit(3) == 3
    assert len(threads) >= 2 and threading.get_ident() not in threads
    await batcher.close()


async def test_batcher_failure_fails_its_batch_only() -> None:
    def run(items: list[int]) -> list[int]:
        if 3 in items:
            raise RuntimeError("tower failed")
        return items

    batcher: DynamicBatcher[int, int] = DynamicBatcher(run, max_items=1, max_wait_s=0)
    outcomes = await asyncio.gather(*(batcher.submit(i) for i in range(5)), return_exceptions=True)
    assert [isinstance(o, RuntimeError) for o in outcomes] == [False, False, False, True, False]
    await batcher.close()


async def test_a_bad_item_in_a_batch_fails_alone() -> None:
    calls: list[list[int]] = []

    def run(items: list[int]) -> list[int]:
        calls.append(items)
        if 3 in items:
            raise ValueError("cannot preprocess item 3")
        return [-item for item in items]

    batcher: DynamicBatcher[int, int] = DynamicBatcher(run, max_items=4, max_wait_s=0.05)
    outcomes = await asyncio.gather(*(batcher.submit(i) for i in range(4)), return_exceptions=True)
    assert outcomes[:3] == [0, -1, -2] and isinstance(outcomes[3], ValueError)
    assert calls[0] == [0, 1, 2, 3] and len(calls) == 5
    assert batcher.stats.num_failed_batches == 1
    await batcher.close()


def test_unavailable_devices_are_refused() -> None:
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda", accelerators=ACCELERATORS)
    assert device_type(resolve_device("cpu", accelerators=ACCELERATORS)) == "cpu"
    assert device_type(resolve_device("auto", accelerators=ACCELERATORS)) in ("cpu", "cuda", "xpu")


def test_only_vision_weights_are_loaded(tiny_model_dir) -> None:
    encoder = VisionEncoder(tiny_model_dir)
    names = [name for name, _ in encoder.model.named_parameters()]
    assert names and all(not n.startswith(("lm_head", "language_model", "model.")) for n in names)
    total = sum(p.numel() for p in encoder.model.parameters())
    assert total == encoder.num_parameters < 600_000


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tower", [{}, {"attention": "sdpa", "patch_embedding": "conv"}])
def test_cuda_float32_matches_cpu(tiny_model_dir, tower) -> None:
    # NOTE: failed (1e-2 relative) before TF32 was turned off for float32 on CUDA.
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (64, 96, 3), dtype=np.uint8))]
    cpu = VisionEncoder(tiny_model_dir).encode(images)[0][0]
    gpu = VisionEncoder(
        tiny_model_dir, device="cuda", dtype="float32", preprocess_device="cpu", **tower
    ).encode(images)
    assert gpu[0][0].device.type == "cuda"  # NOTE: kept there until the data plane hands it over
    assert torch.allclose(cpu, gpu[0][0].cpu(), rtol=1e-4, atol=1e-4 * float(cpu.abs().max()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_defaults_to_bfloat16_and_the_fast_tower(tiny_model_dir) -> None:
    encoder = VisionEncoder(tiny_model_dir, device="cuda")
    assert encoder.dtype == torch.bfloat16
    assert encoder.num_fast_convolutions == 1


def test_encoders_batch_on_accelerators_and_not_on_cpu() -> None:
    from epd.server.encode.app import max_batch_size_for

    assert max_batch_size_for("cuda") == max_batch_size_for("xpu") == 8
    assert max_batch_size_for("cpu") == 1


def test_tower_calls_run_inline_only_on_cpu() -> None:
    from epd.server.encode.app import max_inline_ms_for

    assert max_inline_ms_for("cuda") == max_inline_ms_for("xpu") == 0
    assert max_inline_ms_for("cpu") == 10


@pytest.mark.parametrize("given", ["-1", "nan", "soon"])
def test_a_bad_inline_time_is_refused_with_a_message(given: str, tiny_model_dir, capsys) -> None:
    from epd.cli import main

    with pytest.raises(SystemExit) as exit_:  # NOTE: argparse refuses it, a usage error
        main(["encode", "--model", str(tiny_model_dir), "--max-inline-ms", given])
    assert exit_.value.code == 2 and "max-inline-ms" in capsys.readouterr().err
