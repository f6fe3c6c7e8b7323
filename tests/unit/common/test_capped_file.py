"""The span file stays within its cap: one rotated copy, whole records, the newest kept (several
processes writing at once: tests/integration/common/test_capped_file_processes.py)."""

from __future__ import annotations

import json
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider

from epd.common import capped_file
from epd.common.telemetry import add_exporter

KiB = 1 << 10


def record(number: int, size: int = KiB) -> bytes:
    line = json.dumps({"n": number, "pad": ""})
    return json.dumps({"n": number, "pad": "x" * (size - len(line) - 1)}).encode() + b"\n"


def numbers(*paths: Path) -> list[int]:
    """Record numbers in ``paths`` (each line must be one whole record)."""
    return [
        json.loads(line)["n"] for p in paths if p.exists() for line in p.read_bytes().splitlines()
    ]


def test_writes_past_the_cap_keep_both_files_within_it(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    for number in range(200):
        capped_file.append(str(path), record(number), 16 * KiB)
    rotated = Path(capped_file.rotated_path(str(path)))
    assert path.stat().st_size <= 8 * KiB and rotated.stat().st_size <= 8 * KiB
    kept = numbers(rotated, path)
    assert kept == list(range(200 - len(kept), 200)) and len(kept) >= 8


def test_a_record_larger_than_the_cap_is_written_whole(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    capped_file.append(str(path), record(1), 4 * KiB)
    capped_file.append(str(path), record(2, 8 * KiB), 4 * KiB)
    assert numbers(path) == [2] and numbers(Path(capped_file.rotated_path(str(path)))) == [1]


def test_no_cap_grows_one_file(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    for number in range(20):
        capped_file.append(str(path), record(number), 0)
    assert numbers(path) == list(range(20))
    assert not Path(capped_file.rotated_path(str(path))).exists()


def test_the_json_exporter_keeps_its_file_within_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    provider = TracerProvider()
    assert add_exporter(provider, f"json:{path}", span_file_bytes=8 * KiB)
    tracer = provider.get_tracer("t")
    for number in range(200):
        with tracer.start_as_current_span(f"span-{number}"):
            pass
    rotated = Path(capped_file.rotated_path(str(path)))
    assert path.stat().st_size + rotated.stat().st_size <= 8 * KiB
    names = [
        json.loads(line)["name"] for p in (rotated, path) for line in p.read_text().splitlines()
    ]
    assert names[-1] == "span-199"
