"""``server/`` and ``scheduler/`` never import each other (issue 43): what both sides of a call
share (roles, held-item reports, ports) lives in ``common/``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
APART = {
    "server": "epd.scheduler",
    "scheduler": "epd.server",
    "common": ("epd.scheduler", "epd.server"),
}


def imported_modules(source: str) -> list[str]:
    """Every module ``source`` imports (``import x`` and ``from x import y``, wherever)."""
    modules = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            modules.append(node.module)
    return modules


def crossings(folder: str, forbidden: str | tuple[str, ...]) -> list[str]:
    """``path: module`` for each import in ``folder``'s modules of a module under
    ``forbidden``."""
    return [
        f"{path.relative_to(ROOT)}: {module}"
        for path in sorted((ROOT / folder).rglob("*.py"))
        if not path.name.endswith(("_pb2.py", "_pb2_grpc.py"))
        for module in imported_modules(path.read_text())
        if module.startswith(forbidden)
    ]


def test_server_scheduler_and_common_import_only_downwards() -> None:
    found = [line for folder, forbidden in APART.items() for line in crossings(folder, forbidden)]
    assert found == []


def test_an_import_inside_a_function_is_found() -> None:
    source = "def f() -> None:\n    from epd.scheduler.model import Load\n"
    assert imported_modules(source) == ["epd.scheduler.model"]
