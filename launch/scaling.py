"""When ``epd up --encoders MIN:MAX`` adds or drains an encoder: one group's decision, with
hysteresis (no I/O, injectable time).

The signal is the scheduler's count of encoders the group's kind needs
(``GetEncoderDemand``), clamped to the group's bounds. An encoder is added once that count has
stayed above the running count for ``up_after_s``, and one drained once it has stayed below for
``down_after_s`` (longer: adding is cheap next to a burst queueing, draining and restarting
is not). Any change, and any reading that breaks the streak, starts the windows again, so a
count that flaps between two values never moves the group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from epd.common.flags import flag


@dataclass(frozen=True, slots=True)
class ScalingOptions:
    """How ``epd up --encoders MIN:MAX`` follows the signal. Its fields declare their flags."""

    scale_up_after_s: float = field(
        default=10.0,
        metadata=flag(
            "with --encoders MIN:MAX: add an encoder once the scheduler's count of encoders "
            "needed has stayed above the running count this long"
        ),
    )
    scale_down_after_s: float = field(
        default=60.0,
        metadata=flag(
            "with --encoders MIN:MAX: drain an encoder once the count needed has stayed below "
            "the running count this long"
        ),
    )
    scale_interval_s: float = field(
        default=1.0,
        metadata=flag("with --encoders MIN:MAX: how often the scheduler's count is read"),
    )

    def __post_init__(self) -> None:
        windows = (self.scale_up_after_s, self.scale_down_after_s)
        if min(windows) < 0 or not self.scale_interval_s > 0:
            raise ValueError("scale windows must be 0 or more and the interval positive")


@dataclass(slots=True)
class GroupScaler:
    """One group's decisions: ``decide`` is +1 (add one), -1 (drain one) or 0."""

    minimum: int
    maximum: int
    up_after_s: float
    down_after_s: float
    _above_since: float | None = None
    _below_since: float | None = None

    def target(self, needed: int) -> int:
        """The count the group aims at: ``needed`` within its bounds."""
        return max(self.minimum, min(self.maximum, needed))

    def decide(self, now: float, running: int, needed: int) -> int:
        """What to do at ``now`` with ``running`` encoders when ``needed`` are."""
        target = self.target(needed)
        if target > running:
            self._below_since = None
            self._above_since = now if self._above_since is None else self._above_since
            if now - self._above_since >= self.up_after_s:
                self._above_since = None
                return 1
        elif target < running:
            self._above_since = None
            self._below_since = now if self._below_since is None else self._below_since
            if now - self._below_since >= self.down_after_s:
                self._below_since = None
                return -1
        else:
            self._above_since = self._below_since = None
        return 0
