"""The figures of a soak (``bench_soak.py``) and their report: made of what the soak gathered
(``Soaked``, ``summarise``), judged (``is_clean``), printed as a table (``print_report``) or
written as JSON (``without_nan``). No I/O but the printing, so tests run it without servers."""

from __future__ import annotations

import argparse
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from soak_check import latency_groups, memory_trend, percentile
from soak_load import Fired, Outcome

MIB = 1024 * 1024


@dataclass
class Soaked:
    """What one soak gave: each request's outcome, each kill fired and its time back (s), each
    service's (pid, RSS) samples, and the load's start (``time.monotonic``) and length."""

    outcomes: list[Outcome]
    fired: list[Fired]
    back_s: list[float | None]
    samples: dict[str, list[tuple[int, int]]]
    start: float
    elapsed_s: float
    num_prompts: int
    # each data-plane service's leases and regions after the load (``transfer_state``)
    transfers: dict[str, dict[str, float]] = field(default_factory=dict)


def summarise(args: argparse.Namespace, run: Soaked) -> dict[str, Any]:
    """The figures of a soak (latencies and TTFTs of ok requests)."""
    answered = [o for o in run.outcomes if o.status == "ok"]
    latencies = [(o.end - o.start) * 1000 for o in answered]
    ttfts = [o.ttft_s * 1000 for o in answered if o.ttft_s is not None]
    statuses = Counter(o.status for o in run.outcomes)
    reasons = Counter(o.detail for o in run.outcomes if o.status != "ok")
    return {
        "requests": len(run.outcomes),
        "concurrency": args.concurrency,
        "tokens": args.tokens,
        "prompts": run.num_prompts,
        "ok": statuses["ok"],
        "failed": statuses["failed"],
        "corrupted": statuses["corrupted"],
        "elapsed_s": round(run.elapsed_s, 1),
        "req_s": round(len(run.outcomes) / run.elapsed_s, 2),
        "latency_p50_ms": percentile(latencies, 0.5),
        "latency_p99_ms": percentile(latencies, 0.99),
        "ttft_p50_ms": percentile(ttfts, 0.5),
        "ttft_p99_ms": percentile(ttfts, 0.99),
        "reasons": dict(reasons.most_common(8)),
        "not_ok": [
            {
                "index": o.index,
                "status": o.status,
                "at_s": round(o.start - run.start, 1),
                "took_s": round(o.end - o.start, 2),
                "detail": o.detail,
            }
            for o in run.outcomes
            if o.status != "ok"
        ][:20],
        "kills": [
            {
                "role": f.kill.role,
                "signal": f.kill.signal_name,
                "service": f.service,
                "pid": f.pid,
                "at_request": f.kill.after_requests,
                "at_s": round(f.at - run.start, 1),
                "back_after_s": back,
            }
            for f, back in zip(run.fired, run.back_s, strict=True)
        ],
        "latency_by_group": latency_groups(
            [(o.start, o.end) for o in answered], [f.at for f in run.fired if f.pid]
        ),
        "memory": {name: memory_row(series) for name, series in sorted(run.samples.items())},
        "transfers": run.transfers,
        "leases_outstanding": sum(s.get("leases_outstanding", 0) for s in run.transfers.values()),
    }


def memory_row(series: list[tuple[int, int]]) -> dict[str, Any]:
    """One service's RSS after warm-up, at the end and at most (MiB), the largest of each quarter
    of the run (a leak climbs from quarter to quarter; a high-water mark of in-flight work does
    not), and its trend."""
    quarters = [series[len(series) * i // 4 : len(series) * (i + 1) // 4] for i in range(4)]
    return {
        "warm_mib": round(series[0][1] / MIB, 1),
        "end_mib": round(series[-1][1] / MIB, 1),
        "max_mib": round(max(rss for _, rss in series) / MIB, 1),
        "quarter_max_mib": [round(max(rss for _, rss in q) / MIB, 1) for q in quarters if q],
        "samples": len(series),
        "trend": memory_trend(series),
    }


def restarts(log_file: Path | None) -> list[str]:
    """The launcher's lines about services it restarted or gave up on."""
    if log_file is None or not log_file.exists():
        return []
    lines = log_file.read_text(errors="replace").splitlines()
    return [line for line in lines if "restarting it" in line or "gave up" in line]


def print_report(figures: dict[str, Any]) -> None:
    """The figures as a readable table."""
    prompts, tokens = figures["prompts"], figures["tokens"]
    print(f"\nsoak of {figures['deployment']} ({prompts} prompts, {tokens} tokens each)")
    print(
        f"  {figures['requests']} requests at concurrency {figures['concurrency']} in "
        f"{figures['elapsed_s']} s ({figures['req_s']} req/s): {figures['ok']} ok, "
        f"{figures['failed']} failed, {figures['corrupted']} corrupted"
    )
    print(
        f"  latency p50 {figures['latency_p50_ms']:.0f} ms, p99 {figures['latency_p99_ms']:.0f} ms;"
        f" TTFT p50 {figures['ttft_p50_ms']:.0f} ms, p99 {figures['ttft_p99_ms']:.0f} ms"
    )
    for reason, count in figures["reasons"].items():
        print(f"  {count:>6} x {reason}")
    for row in figures["not_ok"]:
        print(
            f"    request {row['index']} {row['status']} at {row['at_s']} s after "
            f"{row['took_s']} s: {row['detail']}"
        )
    if figures["kills"]:
        print("kills")
        for kill in figures["kills"]:
            print(
                f"  {kill['signal']:<8} {kill['service']:<10} pid {kill['pid']:<8} at request "
                f"{kill['at_request']:<6} ({kill['at_s']} s), {back(kill)}"
            )
        print("latency of the requests in flight at a kill (moved) and of the others")
        for group, row in figures["latency_by_group"].items():
            print(
                f"  {group:<12} {row['count']:>6} requests  p50 {row['p50_ms']:>8.0f} ms  "
                f"p99 {row['p99_ms']:>8.0f} ms"
            )
    print(
        f"{'memory (RSS, MiB)':<20}{'warm':>9}{'end':>9}{'max':>9}{'samples':>9}  trend"
        "  (largest of each quarter)"
    )
    for name, row in figures["memory"].items():
        quarters = " ".join(f"{mib:.0f}" for mib in row["quarter_max_mib"])
        print(
            f"  {name:<18}{row['warm_mib']:>9}{row['end_mib']:>9}{row['max_mib']:>9}"
            f"{row['samples']:>9}  {row['trend']}  ({quarters})"
        )
    for line in figures["restarts"]:
        print(f"  {line}")
    print("data planes after the load (leases lent and not back, freed unreleased, regions)")
    for name, state in figures["transfers"].items():
        print(
            f"  {name:<18} outstanding {state.get('leases_outstanding', 0):>4.0f}  expired "
            f"{state.get('leases_expired', 0):>4.0f}  shm segments "
            f"{state.get('shm_segments', 0):>4.0f}  NIXL regions "
            f"{state.get('nixl_regions', 0):>4.0f}"
        )
    leaked = figures["leaked_segments"]
    print(
        "leaked /dev/shm segments: "
        + ("not checked (attached)" if leaked is None else str(len(leaked)))
    )
    for name in leaked or []:
        print(f"  {name}")
    for name in figures["new_shm_of_unknown_owner"] or []:
        print(f"  new in /dev/shm, not seen in this deployment's processes (not counted): {name}")
    print(f"logs in {figures['logs']}")


def without_nan(value: Any) -> Any:
    """``value`` with every NaN (a percentile of no request) as None, so JSON readers take it."""
    if isinstance(value, dict):
        return {key: without_nan(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_nan(item) for item in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def back(kill: dict[str, Any]) -> str:
    """How soon a killed service served again, in words."""
    if not kill["pid"]:
        return "not sent"
    seconds = kill["back_after_s"]
    return "not back" if seconds is None else f"back after {seconds} s"


def is_clean(figures: dict[str, Any]) -> bool:
    """No request failed or corrupted, no lease left outstanding after the load and no segment
    leaked."""
    return not (
        figures["failed"]
        or figures["corrupted"]
        or figures["leases_outstanding"]
        or figures["leaked_segments"]
    )
