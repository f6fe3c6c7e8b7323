"""Several processes appending to one capped span file at once keep it within its cap, with whole
records, each writer's in order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from epd.common import capped_file
from tests.unit.common.test_capped_file import KiB, numbers

_WRITER = """
import json, sys
from epd.common import capped_file
path, writer = sys.argv[1], int(sys.argv[2])
for number in range(400):
    line = json.dumps({"n": writer * 1000 + number, "pad": "x" * 200}) + "\\n"
    capped_file.append(path, line.encode(), 32 * 1024)
"""


def test_several_processes_rotate_one_file_within_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    writers = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(w)]) for w in range(4)
    ]
    assert [writer.wait(120) for writer in writers] == [0] * 4
    rotated = Path(capped_file.rotated_path(str(path)))
    assert path.stat().st_size + rotated.stat().st_size <= 32 * KiB
    kept = numbers(rotated, path)  # NOTE: fails on a torn or interleaved line
    for writer in range(4):
        mine = [n for n in kept if n // 1000 == writer]
        assert mine == sorted(mine)
    assert max(kept) % 1000 == 399
