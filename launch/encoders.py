"""The encoders ``epd up`` starts: their devices, ``--encoders``' count or range, and the groups
that scale together (no I/O)."""

from __future__ import annotations

import re
from dataclasses import dataclass

AUTO_DEVICE = "auto"
CPU_DEVICE = "cpu"
ENCODER_DEVICE = re.compile(r"auto|cpu|(cuda|xpu)(:\d+)?")


@dataclass(frozen=True, slots=True)
class EncoderRange:
    """``--encoders``: a fixed count (``minimum == maximum``) or the bounds an autoscaled group
    of encoders moves between."""

    minimum: int = 1
    maximum: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.maximum:
            raise ValueError(f"encoders {self}: expected 1 <= MIN <= MAX")

    @property
    def scales(self) -> bool:
        """Whether the count moves (MIN:MAX with MIN < MAX)."""
        return self.maximum > self.minimum

    def __str__(self) -> str:
        return f"{self.minimum}:{self.maximum}" if self.scales else str(self.minimum)


def encoder_range(text: str) -> EncoderRange:
    """``"2"`` -> 2 encoders, ``"1:3"`` -> between 1 and 3; ValueError names what is wrong."""
    low, sep, high = text.partition(":")
    try:
        minimum = int(low)
        maximum = int(high) if sep else minimum
    except ValueError:
        raise ValueError(f"expected N or MIN:MAX, e.g. 2 or 1:3, got {text!r}") from None
    return EncoderRange(minimum, maximum)


@dataclass(frozen=True, slots=True)
class EncoderGroup:
    """Encoders on one ``device`` that scale together: their ``slots`` (names ``encodeN``, ports
    and CPUs are the slot's), ``minimum`` of them started at once, at most ``maximum``."""

    device: str
    slots: tuple[int, ...]
    minimum: int
    maximum: int
