"""The pure logic of ``bench_soak.py``: the kill schedule, the check of a stream against its
reference answer, and the figures made of the requests (latency of the requests a kill moved
against the others, memory flat or growing). No I/O here, so tests run it without servers."""

from __future__ import annotations

import difflib
import math
import signal
from collections.abc import Sequence
from dataclasses import dataclass

ROLES = ("encoder", "prefill", "decode", "scheduler", "route")
SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM}
CHAOS_ROLES = ("encoder", "prefill", "decode", "scheduler")


@dataclass(frozen=True, slots=True)
class Kill:
    """Send ``signum`` to one process of ``role`` when request number ``after_requests`` (from
    0) starts."""

    role: str
    after_requests: int
    signum: int = signal.SIGKILL

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name


def parse_kill(text: str) -> Kill:
    """``ROLE@N[:SIGNAL]`` -> Kill; SIGNAL is KILL (default) or TERM, with or without ``SIG``.
    ValueError names what is wrong."""
    role, at, rest = text.partition("@")
    if not at or role not in ROLES:
        raise ValueError(f"--kill {text!r}: expected ROLE@N[:SIGNAL], ROLE one of {ROLES}")
    count, _, name = rest.partition(":")
    if not count.isdigit():
        raise ValueError(f"--kill {text!r}: N must be a request number (0 or more)")
    name = (name or "KILL").upper().removeprefix("SIG")
    if name not in SIGNALS:
        raise ValueError(f"--kill {text!r}: signal {name!r} is not one of KILL, TERM")
    return Kill(role, int(count), SIGNALS[name])


def chaos_schedule(num_requests: int, roles: Sequence[str] = CHAOS_ROLES) -> list[Kill]:
    """SIGKILL each role once, then SIGTERM each once, evenly spread over the requests after the
    first tenth (a warm-up) and before the last tenth (time for the last one to heal)."""
    kills = [(role, signum) for signum in (signal.SIGKILL, signal.SIGTERM) for role in roles]
    first, last = num_requests // 10, num_requests - num_requests // 10
    step = (last - first) / len(kills)
    return [
        Kill(role, first + int(step * (i + 0.5)), signum) for i, (role, signum) in enumerate(kills)
    ]


@dataclass(frozen=True, slots=True)
class StreamVerdict:
    """``kind``: ok, missing (pieces of the reference absent), repeated (pieces sent twice) or
    changed (other text); ``at``: the first reference piece where the stream differs (-1: ok)."""

    kind: str
    at: int = -1

    @property
    def is_ok(self) -> bool:
        return self.kind == "ok"


def check_stream(reference: Sequence[str], pieces: Sequence[str]) -> StreamVerdict:
    """Compare the text pieces of a stream with those of its reference answer. Equal text is ok
    however it is cut into pieces; otherwise the pieces are aligned and the first difference
    says what happened."""
    if "".join(reference) == "".join(pieces):
        return StreamVerdict("ok")
    matcher = difflib.SequenceMatcher(a=list(reference), b=list(pieces), autojunk=False)
    for tag, start, _end, other_start, other_end in matcher.get_opcodes():
        if tag == "delete":
            return StreamVerdict("missing", start)
        if tag == "insert":
            inserted = list(pieces[other_start:other_end])
            return StreamVerdict("repeated" if _repeats(reference, inserted) else "changed", start)
        if tag == "replace":
            return StreamVerdict("changed", start)
    return StreamVerdict("changed", 0)


def _repeats(reference: Sequence[str], inserted: list[str]) -> bool:
    """Whether ``inserted`` is a run of pieces that the reference holds (sent again)."""
    size = len(inserted)
    return any(list(reference[i : i + size]) == inserted for i in range(len(reference)))


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (``fraction`` in 0..1) of ``values``; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def is_moved(start: float, end: float, kill_times: Sequence[float]) -> bool:
    """Whether a request in flight from ``start`` to ``end`` crossed a kill."""
    return any(start <= at < end for at in kill_times)


def latency_groups(
    spans: Sequence[tuple[float, float]], kill_times: Sequence[float]
) -> dict[str, dict[str, float]]:
    """Latency (ms) count, p50 and p99 of the requests (start, end) that crossed a kill
    (``moved``) and of the others (``undisturbed``)."""
    groups: dict[str, list[float]] = {"moved": [], "undisturbed": []}
    for start, end in spans:
        group = "moved" if is_moved(start, end, kill_times) else "undisturbed"
        groups[group].append((end - start) * 1000)
    return {
        name: {
            "count": len(values),
            "p50_ms": percentile(values, 0.5),
            "p99_ms": percentile(values, 0.99),
        }
        for name, values in groups.items()
    }


def memory_trend(samples: Sequence[tuple[int, int]], tolerance: float = 0.1) -> str:
    """``flat``, ``growing`` or ``restarted`` from one service's (pid, RSS bytes) samples, the
    first taken after warm-up: the last sample against the first, growth beyond ``tolerance`` (a
    fraction) is growing. ``restarted``: the process sampled last is not the one warmed up, so
    it has no warm-up to compare with."""
    if len(samples) < 2:
        return "unknown"
    (first_pid, first_rss), (last_pid, last_rss) = samples[0], samples[-1]
    if first_pid != last_pid:
        return "restarted"
    return "growing" if last_rss > first_rss * (1 + tolerance) else "flat"


TRANSFER_GAUGES = {
    "epd_transfer_leases_outstanding": "leases_outstanding",
    "epd_transfer_leases_expired": "leases_expired",
    "epd_transfer_shm_segments": "shm_segments",
    "epd_transfer_nixl_registered_regions": "nixl_regions",
}


def transfer_state(metrics_text: str) -> dict[str, float]:
    """A service's data-plane figures from its Prometheus text: leases it has lent and not had
    back, leases its reaper freed unreleased (expired), shared-memory segments and NIXL regions it
    holds now; each summed over its labels. Empty for a service without a data plane."""
    from prometheus_client.parser import text_string_to_metric_families

    state: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            name = TRANSFER_GAUGES.get(sample.name) or TRANSFER_GAUGES.get(
                sample.name.removesuffix("_total")
            )
            if name is not None:
                state[name] = state.get(name, 0.0) + sample.value
    return state
