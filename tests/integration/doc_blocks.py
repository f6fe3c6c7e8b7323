"""The fenced code blocks of README.md and docs/ (benchmark pages included), parametrized by place,
and the check that a python block compiles and its imports resolve."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LANGUAGES = {"python", "bash", "text", "yaml"}


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced block: where it starts (``README.md:50``), its language and its text."""

    where: str
    language: str
    code: str


def fenced_blocks(path: Path) -> Iterator[Block]:
    opened: tuple[int, str] | None = None
    lines: list[str] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.startswith("```"):
            if opened is not None:
                lines.append(line)
        elif opened is None:
            opened, lines = (number, line[3:].strip()), []
        else:
            yield Block(f"{path.relative_to(ROOT)}:{opened[0]}", opened[1], "\n".join(lines))
            opened = None


BLOCKS = [block for path in DOCUMENTS for block in fenced_blocks(path)]
PYTHON = [b for b in BLOCKS if b.language == "python"]
BASH = [b for b in BLOCKS if b.language == "bash"]
YAML = [b for b in BLOCKS if b.language == "yaml"]


def by_place(blocks: list[Block]) -> pytest.MarkDecorator:
    """Parametrize by block, named by place; blocks naming vLLM are marked ``vllm`` (slow)."""
    params = [
        pytest.param(b, id=b.where, marks=[pytest.mark.vllm] * ("vllm" in b.code)) for b in blocks
    ]
    return pytest.mark.parametrize("block", params)


def top_level_names(source: str) -> set[str]:
    """Names a module binds at its top level (in ``if`` / ``try`` bodies too)."""
    names: set[str] = set()
    pending = list(ast.parse(source).body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.If | ast.Try):
            pending += node.body + node.orelse + getattr(node, "finalbody", [])
            pending += [n for h in getattr(node, "handlers", []) for n in h.body]
    return names


@functools.cache
def unresolved(module: str, name: str | None) -> str | None:
    """Why ``from module import name`` (``import module`` when name is None) fails, or None.

    NOTE: a name bound at the module's top level counts without importing it, so blocks naming
    vLLM's modules are checked without the half minute vLLM takes to import here."""
    try:
        spec = importlib.util.find_spec(module)
    except ImportError as e:
        return f"{module}: {e}"
    if spec is None:
        return f"no module {module}"
    if name is None or name == "*":
        return None
    source = Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    if source and name in top_level_names(source.read_text()):
        return None
    if spec.submodule_search_locations and importlib.util.find_spec(f"{module}.{name}"):
        return None
    if not hasattr(importlib.import_module(module), name):
        return f"cannot import name {name!r} from {module}"
    return None


def import_problems(code: str) -> list[str]:
    try:
        tree = ast.parse(compile(code, "<block>", "exec", ast.PyCF_ONLY_AST))
    except SyntaxError as e:
        return [f"does not compile: {e}"]
    wanted: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            wanted += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            wanted += [(node.module, alias.name) for alias in node.names]
    return [problem for module, name in wanted if (problem := unresolved(module, name))]
