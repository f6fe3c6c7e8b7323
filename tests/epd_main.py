"""The ``epd`` console script's ``main`` run in the test's own process, for the checks that end in
a usage error before anything starts: the answer of a subprocess without its interpreter start
and imports (seconds each on the 2-core VM). An exception escaping ``main`` fails the test, as
a traceback would."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from epd.cli import main


@dataclass(frozen=True)
class Answer:
    """What ``epd ARGS`` returned and printed."""

    returncode: int
    stdout: str
    stderr: str


def epd_main(capsys: pytest.CaptureFixture[str], *args: str) -> Answer:
    """``epd ARGS`` in this process; argparse's exits become their exit code."""
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    captured = capsys.readouterr()
    return Answer(code, captured.out, captured.err)
