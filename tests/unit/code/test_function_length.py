"""No function of epd's library is over 60 lines (issue 43): a longer one is two jobs, or a
flag builder whose flags belong on their options dataclass fields."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LIBRARY = ("epd", "server", "scheduler", "common", "client", "launch")
MAX_LINES = 60


def long_functions(source: str) -> list[str]:
    """``name (lines)`` of each function in ``source`` over ``MAX_LINES`` lines."""
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1})"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_LINES
    ]


def test_no_library_function_is_over_60_lines() -> None:
    sources = [
        path
        for folder in LIBRARY
        for path in sorted((ROOT / folder).rglob("*.py"))
        if not path.name.endswith(("_pb2.py", "_pb2_grpc.py"))
    ]
    assert len(sources) > 100
    found = [
        f"{path.relative_to(ROOT)}:{name}"
        for path in sources
        for name in long_functions(path.read_text())
    ]
    assert found == []


def test_a_function_of_61_lines_is_found() -> None:
    body = "\n".join(f"    x{index} = {index}" for index in range(MAX_LINES))
    assert long_functions(f"def long() -> None:\n{body}\n") == ["long (61)"]
    assert long_functions(f"def short() -> None:\n{body[: body.rindex(chr(10))]}\n") == []
