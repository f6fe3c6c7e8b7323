"""On CPU the engine runs its model inside vLLM's EngineCore process, with no worker process
beside it, whatever the environment says: vLLM's CPU default, a worker fed through a
shared-memory queue, busy-polls a core for a second after every step (docs/performance.md)."""

from __future__ import annotations

import psutil
import pytest

pytestmark = pytest.mark.vllm


async def test_on_cpu_the_model_runs_in_the_engine_core_process(
    tiny_model_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    from epd.server.engine.vllm_engine import VllmEngine, VllmOptions

    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    options = VllmOptions(kv_cache_bytes=64 << 20, max_model_len=2048)
    engine = await VllmEngine.start(tiny_model_dir, options=options)
    try:
        names = [
            child.name()
            for child in psutil.Process().children(recursive=True)
            if child.pid not in before
        ]
    finally:
        await engine.close()
    assert any(name.startswith("VLLM::EngineCor") for name in names), names
    assert not any(name.startswith("VLLM::Worker") for name in names), names
