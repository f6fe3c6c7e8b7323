"""The SDK stands alone: ``epd.client`` (the SDK and ``epd chat``) imports nothing of the
services (``epd.server``, ``epd.scheduler``), of ``epd up`` (``epd.launch``) or of the server
scaffold in ``epd.common``, neither in its own files nor transitively; what it shares with the
services (channels, auth, error mapping, sampling defaults) comes from ``epd.common``."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SDK_FILES = sorted((ROOT / "client").rglob("*.py"))
# Packages and modules that serve rather than call: none may be loaded by importing the SDK.
SERVER_SIDE = (
    "epd.server",
    "epd.scheduler",
    "epd.launch",
    "epd.common.server",
    "epd.common.serving",
    "epd.common.server_cli",
    "epd.common.metrics",
)
# grpc's own server-side modules, which the SDK's files must not name (grpc itself loads some of
# them whoever imports it, so they are checked in the source, not in sys.modules).
GRPC_SERVER_SIDE = ("grpc_reflection", "grpc_health.v1.health", "grpc.aio._server", "grpc._server")
# Attribute chains that start a server: grpc.server(...), grpc.aio.server(...).
SERVER_FACTORIES = {"grpc.server", "grpc.aio.server", "aio.server"}

IMPORT_EVERY_SDK_MODULE = """
import pkgutil, sys
import epd.client
for module in pkgutil.walk_packages(epd.client.__path__, "epd.client."):
    __import__(module.name)
print("\\n".join(sorted(sys.modules)))
"""


def is_within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def imported_names(tree: ast.Module) -> Iterator[str]:
    """Every module a file imports; ``from a import b`` yields ``a`` and ``a.b`` (b may be a
    submodule)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def attribute_chain(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def test_importing_every_sdk_module_loads_nothing_of_the_services_or_the_launcher() -> None:
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERY_SDK_MODULE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = done.stdout.split()
    assert "epd.client.sdk" in loaded and "epd.client.chat_cli" in loaded
    assert [m for m in loaded if is_within(m, SERVER_SIDE)] == []


@pytest.mark.parametrize("path", SDK_FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_sdk_files_import_no_server_module(path: Path) -> None:
    tree = ast.parse(path.read_text())
    forbidden = SERVER_SIDE + GRPC_SERVER_SIDE
    assert [m for m in imported_names(tree) if is_within(m, forbidden)] == []
    chains = {attribute_chain(node) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert chains & SERVER_FACTORIES == set()
