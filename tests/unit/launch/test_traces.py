"""The trace summary reads the span file and its rotated copy: a request split by a rotation is
summarised whole."""

from __future__ import annotations

import json
from pathlib import Path

from epd.launch.traces import ROOT_SPAN, load_spans, summarise


def span(name: str, service: str, start: str, end: str) -> dict[str, object]:
    return {
        "name": name,
        "kind": "SpanKind.SERVER",
        "context": {"trace_id": "0xabc"},
        "resource": {"attributes": {"service.name": service}},
        "start_time": f"2026-01-01T00:00:{start}Z",
        "end_time": f"2026-01-01T00:00:{end}Z",
    }


def test_a_trace_split_by_rotation_is_read_from_both_files(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    encode = span("/epd.v1.EncodeService/Encode", "epd-encode", "01.000", "01.100")
    route = span(ROOT_SPAN, "epd-route", "00.900", "02.000")
    (tmp_path / "spans.jsonl.1").write_text(json.dumps(encode) + "\n")
    path.write_text(json.dumps(route) + "\n")
    assert [s["name"] for s in load_spans(path)] == [encode["name"], route["name"]]
    summary = summarise(path)
    assert summary.startswith("trace 0xabc: 2 server spans")
    assert "epd-encode" in summary and "epd-route" in summary
