"""Summarise the spans one request left in a JSON-lines trace file (``json:PATH`` exporter)."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT_SPAN = "/epd.v1.RouteService/Generate"


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def load_spans(path: Path) -> list[dict[str, Any]]:
    """Every span in the file and in its rotated copy ``PATH.1``, oldest first (unparseable lines
    skipped)."""
    spans = []
    for part in (path.with_name(f"{path.name}.1"), path):
        for line in part.read_text().splitlines() if part.exists() else []:
            try:
                spans.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return spans


def summarise(path: Path) -> str:
    """One line per server span of the latest request's trace: service, RPC, duration."""
    spans = load_spans(path)
    roots = [s for s in spans if s["name"] == ROOT_SPAN and s["kind"] == "SpanKind.SERVER"]
    if not roots:
        return "no trace recorded"
    trace_id = roots[-1]["context"]["trace_id"]
    in_trace = [
        s for s in spans if s["context"]["trace_id"] == trace_id and s["kind"] == "SpanKind.SERVER"
    ]
    lines = [f"trace {trace_id}: {len(in_trace)} server spans"]
    by_service: dict[str, list[str]] = defaultdict(list)
    for span in sorted(in_trace, key=lambda s: s["start_time"]):
        service = span["resource"]["attributes"].get("service.name", "?")
        duration_ms = (_seconds(span["end_time"]) - _seconds(span["start_time"])) * 1000
        attributes = {k: v for k, v in span.get("attributes", {}).items() if k.startswith("epd.")}
        detail = " ".join(f"{k.removeprefix('epd.')}={v}" for k, v in attributes.items())
        by_service[service].append(
            f"    {span['name'].rsplit('/', 1)[-1]:<16} {duration_ms:8.1f} ms  {detail}"
        )
    for service, entries in by_service.items():
        lines.append(f"  {service}")
        lines.extend(entries)
    return "\n".join(lines)
