"""The scheduler's deployment-level settings (``epd scheduler``'s flags)."""

from __future__ import annotations

from dataclasses import dataclass, field

from epd.common.errors import InvalidArgument
from epd.common.flags import flag
from epd.scheduler.model import Policy
from epd.scheduler.policies.encoders import parse_split_ratio
from epd.scheduler.policies.routing import CACHE_AWARE, PREFILL_POLICIES

DEFAULT_POLICY = Policy.ADAPTIVE


def split_ratio(text: str) -> tuple[float, float]:
    """``--split-ratio``'s shares (``parse_split_ratio``); ValueError when malformed."""
    try:
        return parse_split_ratio(text)
    except InvalidArgument as e:
        raise ValueError(e.message) from None


@dataclass(slots=True)
class SchedulerConfig:
    """Deployment-level settings: the defaults of ``epd scheduler``'s flags (ValueError for a
    TTL or probe interval that is not positive)."""

    default_policy: Policy = field(
        default=DEFAULT_POLICY,
        metadata=flag(
            "encoder assignment policy when a request names none", env="EPD_SCHEDULER_POLICY"
        ),
    )
    split_ratio: tuple[float, float] | None = field(
        default=None,
        metadata=flag(
            "ACCELERATOR:CPU shares for per_request (and adaptive's prior), e.g. 8:1",
            env="EPD_SPLIT_RATIO",
            type=split_ratio,
            metavar="SPLIT_RATIO",
            default_help="default: the workers' weights",
        ),
    )
    ttl_s: float = field(
        default=10.0,
        metadata=flag(
            "a worker missing heartbeats this long is evicted", env="EPD_SCHEDULER_TTL_S"
        ),
    )
    assignment_timeout_s: float = 300.0
    # items the held-items index keeps (least recently used dropped first)
    max_held_items: int = 100_000
    probe_after_s: float = field(
        default=5.0,
        metadata=flag(
            "adaptive sends one item to an idle encoder whose service time has had no fresh "
            "sample this long",
            env="EPD_SCHEDULER_PROBE_AFTER_S",
        ),
    )

    encode_wait_target_s: float = field(
        default=0.25,
        metadata=flag(
            "the encode wait the autoscaling signal keeps under: epd_scheduler_encoders_needed "
            "counts the encoders of each kind the arrivals need for it (docs/metrics.md)",
            env="EPD_SCHEDULER_ENCODE_WAIT_TARGET_S",
        ),
    )
    demand_smoothing_s: float = field(
        default=30.0,
        metadata=flag(
            "time constant of the arrival rate behind epd_scheduler_encoders_needed "
            "(exponentially weighted)",
            env="EPD_SCHEDULER_DEMAND_SMOOTHING_S",
        ),
    )

    prefill_policy: str = field(
        default=CACHE_AWARE,
        metadata=flag(
            "how a prompt's prefill worker is chosen: cache_aware (the worker holding the "
            "longest prefix of the prompt's KV blocks, images included, unless it holds under "
            "half of them or is much busier than another), longest_prefix (any overlap first, "
            "whatever the load) or round_robin (each worker in turn)",
            env="EPD_PREFILL_POLICY",
            choices=PREFILL_POLICIES,
        ),
    )

    def __post_init__(self) -> None:
        if not (self.encode_wait_target_s > 0 and self.demand_smoothing_s > 0):
            raise ValueError("the encode wait target and the demand smoothing must be positive")
        if not self.ttl_s > 0:
            raise ValueError(f"ttl_s must be positive, got {self.ttl_s}")
        if not self.probe_after_s > 0:
            raise ValueError(f"probe_after_s must be positive, got {self.probe_after_s}")
