"""On CPU the engine runs its model inside vLLM's EngineCore process, with no worker process
beside it, whatever the environment says: vLLM's CPU default, a worker fed through a
shared-memory queue, busy-polls a core for a second after every step (docs/performance.md)."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.vllm


async def test_on_cpu_the_model_runs_in_the_engine_core_process(
    tiny_model_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    from epd.server.engine.vllm_engine import VllmEngine
    from epd.server.engine.vllm_options import VllmOptions

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


def test_kv_engines_keep_their_models_cpus(engines) -> None:
    """vLLM's NIXL connector pins the thread that builds it (on CPU: the model's, in the
    EngineCore) to the last CPU; the engine puts its threads back on the model's CPUs."""
    from epd.common.cpus import allowed_cpus
    from epd.server.engine.vllm_process import engine_core_pids, model_cpus

    if len(allowed_cpus()) < 2:
        pytest.skip("one CPU: the connector's pin is that CPU, nothing to restore")
    allowed = set(model_cpus(None, kv=True)[0])
    for engine in engines:
        pids = engine_core_pids(engine._llm)
        assert pids
        for pid in pids:
            threads = [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]
            pinned = {tid: os.sched_getaffinity(tid) for tid in threads}
            assert all(cpus == allowed for cpus in pinned.values()), pinned
