"""Load figures (waiting requests, KV cache usage) taken from vLLM's scheduler statistics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SchedulerLoad:
    """The latest scheduler figures vLLM reported (zeros before the first step)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0


class LoadTracker:
    """Keeps the latest ``SchedulerStats`` of an AsyncLLM; pass ``factory`` as a stat logger."""

    def __init__(self) -> None:
        # the figures of the engine's last step, set from the engine's output loop
        self.latest = SchedulerLoad()

    def factory(self, vllm_config: Any, engine_index: int = 0) -> Any:
        """A vLLM per-engine stat logger factory feeding this tracker."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        tracker = self

        class _Logger(StatLoggerBase):  # type: ignore[misc]
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(
                self,
                scheduler_stats: Any,
                iteration_stats: Any,
                mm_cache_stats: Any = None,
                engine_idx: int = 0,
            ) -> None:
                if scheduler_stats is not None:
                    tracker.latest = SchedulerLoad(
                        int(scheduler_stats.num_running_reqs),
                        int(scheduler_stats.num_waiting_reqs),
                        float(scheduler_stats.kv_cache_usage),
                    )

            def log_engine_initialized(self) -> None:
                pass

        return _Logger(vllm_config, engine_index)
