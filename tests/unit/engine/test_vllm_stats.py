"""The stat logger ``LoadTracker.factory`` gives vLLM keeps the last step's figures."""

from __future__ import annotations

from types import SimpleNamespace

from epd.server.engine.vllm_stats import LoadTracker, SchedulerLoad


def test_the_logger_keeps_the_last_steps_figures_and_skips_steps_without_them() -> None:
    tracker = LoadTracker()
    logger = tracker.factory(vllm_config=None)
    assert tracker.latest == SchedulerLoad()
    stats = SimpleNamespace(num_running_reqs=2, num_waiting_reqs=3, kv_cache_usage=0.25)
    logger.record(stats, iteration_stats=None)
    assert tracker.latest == SchedulerLoad(2, 3, 0.25)
    logger.record(None, iteration_stats=None)
    assert tracker.latest == SchedulerLoad(2, 3, 0.25)
