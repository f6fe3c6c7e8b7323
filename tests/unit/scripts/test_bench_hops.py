"""bench_hops.hop_table on a span file where two traces start at the same instant (before: the
tie was broken by comparing the traces' spans, a TypeError)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.unit.scripts.loader import load

TIED = "2026-11-29T09:00:00.001000Z"
LATER = "2026-11-29T09:00:01.001000Z"


def span(trace_id: str, name: str, start: str) -> dict[str, Any]:
    return {
        "context": {"trace_id": trace_id},
        "name": f"/epd.v1.EncodeService/{name}",
        "kind": "SpanKind.SERVER",
        "start_time": start,
        "end_time": start,
        "resource": {"attributes": {"service.name": "epd-encode"}},
        "events": [],
    }


def test_traces_starting_together_do_not_stop_the_table(tmp_path: Path) -> None:
    bench_hops = load("bench_hops")
    spans = tmp_path / "spans.jsonl"
    lines = [span("a", "Release", TIED), span("b", "Release", TIED), span("c", "Encode", LATER)]
    spans.write_text("".join(json.dumps(line) + "\n" for line in lines))
    sent = bench_hops._seconds(LATER) - 0.002
    [row] = bench_hops.hop_table(spans, [(sent, 0.01, 0.5)])
    assert (row["service"], row["side"], row["rpc"], row["count"]) == (
        "epd-encode",
        "server",
        "Encode",
        1,
    )
    assert round(row["start_ms"], 3) == 2.0
