"""One place for settings: docs/flags.md is what scripts/gen_flag_table.py reads off every `epd`
command's parser, each variable a help names really is its flag's fallback, and no library
module reads the environment (vLLM keeps every variable in envs.py; we keep them in cli modules)."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from epd.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[3]
PACKAGE_FOLDERS = ("server", "common", "scheduler", "client", "launch", "epd")
ENV_NAME = re.compile(r"EPD_[A-Z0-9_]+")
# Modules besides cli modules that may touch os.environ, and why.
ENVIRONMENT_ALLOWED = {
    # The flag generator: reads flags' fallbacks while cli modules build their parsers.
    "common/flags.py",
    # Sets the variables vLLM reads around an engine's creation and restores them after.
    "server/engine/vllm_process.py",
}


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_flag_table", ROOT / "scripts" / "gen_flag_table.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # NOTE: dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


generator = load_generator()


def is_cli_module(path: Path) -> bool:
    return path.name == "cli.py" or path.name.endswith("_cli.py")


def package_modules() -> Iterator[tuple[str, ast.Module]]:
    for folder in PACKAGE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative.parts[:2] != ("epd", "v1"):
                yield relative.as_posix(), ast.parse(path.read_text())


ENVIRONMENT_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def names_environment(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.value.id == "os" and node.attr in ENVIRONMENT_NAMES
    if isinstance(node, ast.ImportFrom) and node.module == "os":
        return any(alias.name in ENVIRONMENT_NAMES for alias in node.names)
    return False


def reads_environment(tree: ast.Module) -> bool:
    """Whether the module names os.environ (getenv, ...) or imports it from os."""
    return any(names_environment(node) for node in ast.walk(tree))


def test_the_committed_table_is_the_generated_one() -> None:
    expected = generator.render(generator.all_rows())
    assert generator.DOC.read_text() == expected, "run scripts/gen_flag_table.py"


def test_the_table_does_not_depend_on_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPD_PORT", "1234")
    monkeypatch.setenv("EPD_LOG_LEVEL", "DEBUG")
    assert generator.render(generator.all_rows()) == generator.DOC.read_text()


def test_only_cli_modules_read_the_environment() -> None:
    readers = {path for path, tree in package_modules() if reads_environment(tree)}
    assert readers - ENVIRONMENT_ALLOWED == {p for p in readers if is_cli_module(Path(p))}
    assert readers >= ENVIRONMENT_ALLOWED, "an allowed module no longer reads: drop it"


# The generator's functions that read the environment (``flag`` only declares).
READS_FALLBACKS = {"add_flag", "add_dataclass_arguments"}


def test_the_fallback_readers_serve_cli_modules_only() -> None:
    importers = {
        path
        for path, tree in package_modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module == "epd.common.flags"
        and READS_FALLBACKS.intersection(alias.name for alias in node.names)
    }
    assert importers and all(is_cli_module(Path(path)) for path in importers), importers


def test_every_variable_in_the_code_is_in_the_table() -> None:
    rows = generator.all_rows()
    in_table = {v for row in rows for v in row.variables} | set(generator.OTHER_VARIABLES)
    named = set()
    for _, tree in package_modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and ENV_NAME.fullmatch(str(node.value)):
                named.add(str(node.value))
    for path in [*(ROOT / "scripts").glob("*.sh"), ROOT / "tests" / "conftest.py"]:
        named.update(ENV_NAME.findall(path.read_text()))
    assert named - in_table == set()


def changed_value(action: argparse.Action) -> str:
    """A value of the flag's variable its default does not already have."""
    if action.choices:
        return next(str(c) for c in action.choices if str(c) != str(action.default))
    if action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction):
        return "1"
    if isinstance(action.default, int | float) or action.type in (int, float):
        return "7"
    for text in ("7", "v1", "8:1", '{"k": 1}'):  # NOTE: the first text the flag's own type takes
        try:
            if action.type:
                action.type(text)  # type: ignore[operator]
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            continue
        return text
    return "v1"


def parser_actions(command: str) -> dict[str, argparse.Action]:
    module, _ = COMMANDS[command]
    parser = generator.command_parser(command, module)
    return {action.dest: action for action in parser._actions}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_variable_a_help_names_is_its_flags_fallback(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("EPD_")]:
        monkeypatch.delenv(name)
    actions = parser_actions(command)
    checked = 0
    for dest, action in actions.items():
        for variable in generator.ENV_IN_HELP.findall(" ".join((action.help or "").split())):
            value = changed_value(action)
            with monkeypatch.context() as patch:
                patch.setenv(variable, value)
                changed = parser_actions(command)[dest].default
            assert generator.show(changed) != generator.show(action.default), (dest, variable)
            checked += 1
    assert checked or command in ("model", "generate")
