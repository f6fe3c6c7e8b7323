"""Every bash block of README.md and docs/ names programs, subcommands and flags that exist:
``scripts/*`` files are executable, ``epd SUBCOMMAND`` exists, ``python -m MODULE`` resolves,
``python -c CODE`` compiles with its imports resolving, and every ``--flag`` given to epd, a
script or a module appears in that command's ``--help``. Nothing heavy runs (no install, no
benchmark, no deployment): only ``--help``."""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.doc_blocks import BASH, ROOT, Block, by_place, import_problems, unresolved

BIN = Path(sys.executable).parent
EPD_PROGRAMS = {"epd", ".venv/bin/epd"}
PYTHON_PROGRAMS = {"python", ".venv/bin/python"}
# Programs of other projects the docs show (containers, Kubernetes): named, not checked here.
OTHER_PROJECTS_PROGRAMS = {"docker", "podman", "helm", "kubectl", "curl", "grpcurl", "git"}


SEPARATORS = {"&&", "||", "|", ";", "&"}


def shell_commands(code: str) -> Iterator[list[str]]:
    """The simple commands of a block: continuations joined, comments dropped, split at
    ``&&``, ``|``, ``;``; a quote left open goes on over the next lines."""
    pending = ""
    for line in code.splitlines():
        pending += line + "\n"
        words = None if line.endswith("\\") else shell_words(pending)
        if words is not None:
            pending = ""
            yield from simple_commands(words)
    assert not pending.strip(), f"unterminated command: {pending!r}"


def shell_words(text: str) -> list[str] | None:
    """The words and operators of ``text``, or None while a quote is open (``python -c '...'``
    over several lines)."""
    lexer = shlex.shlex(text.replace("\\\n", " "), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:
        return None


def simple_commands(words: list[str]) -> Iterator[list[str]]:
    """Split at the operators; leading ``NAME=value`` assignments are dropped."""
    command: list[str] = []
    for word in [*words, ";"]:
        if word in SEPARATORS:
            if command:
                yield command
            command = []
        elif command or not re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", word):
            command.append(word)


def flags(args: list[str]) -> list[str]:
    """The flags of ``args`` up to a ``--``, after which they are another program's."""
    own = args[: args.index("--")] if "--" in args else args
    return [a.split("=")[0] for a in own if a.startswith("-") and a != "-"]


@functools.cache
def help_text(command: tuple[str, ...]) -> str:
    """``command --help``, which must succeed (so a missing subcommand fails here)."""
    done = subprocess.run(
        [*command, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, f"{' '.join(command)} --help: {done.stderr[-2000:]}"
    return done.stdout


def missing_flags(command: tuple[str, ...], args: list[str]) -> list[str]:
    text = help_text(command)
    return [
        f"{' '.join(command)}: no flag {flag}"
        for flag in flags(args)
        if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text)
    ]


def command_problems(argv: list[str]) -> list[str]:
    program, args = argv[0], argv[1:]
    if program in EPD_PROGRAMS:
        words = list(args[: next((i for i, a in enumerate(args) if a.startswith("-")), len(args))])
        return missing_flags((str(BIN / "epd"), *words[:2]), args)
    if program in PYTHON_PROGRAMS:
        return python_problems(args)
    if program.startswith(("scripts/", "deploy/")):
        path = ROOT / program
        if not (path.is_file() and os.access(path, os.X_OK)):
            return [f"{program} is not an executable file"]
        # NOTE: deploy/docker/build_rootfs.sh run ARGS hands ARGS to epd inside the image.
        checked = program.startswith("scripts/") and flags(args)
        return missing_flags((str(path),), args) if checked else []
    if program in OTHER_PROJECTS_PROGRAMS:
        return []
    return [f"{program}: not a program the docs test knows (extend command_problems)"]


def python_problems(args: list[str]) -> list[str]:
    if args[0] == "-c":
        # NOTE: flags after the code go to the code's own parser: ``python -c CODE --help``.
        problems = import_problems(args[1])
        if problems or not flags(args[2:]):
            return problems
        return missing_flags((sys.executable, "-c", args[1]), args[2:])
    if args[0] == "-m":
        problem = unresolved(args[1], None)
        if problem or not flags(args[2:]):
            return [problem] if problem else []
        return missing_flags((sys.executable, "-m", args[1]), args[2:])
    if not (ROOT / args[0]).is_file():
        return [f"no script {args[0]}"]
    return missing_flags((sys.executable, str(ROOT / args[0])), args[1:]) if flags(args) else []


@by_place(BASH)
def test_bash_blocks_name_programs_subcommands_and_flags_that_exist(block: Block) -> None:
    problems = [p for argv in shell_commands(block.code) for p in command_problems(argv)]
    assert problems == [], block.where


@pytest.mark.parametrize(
    "code, problem",
    [
        ("scripts/nope.sh", "not an executable file"),
        (".venv/bin/epd up --no-such-flag", "no flag --no-such-flag"),
        (".venv/bin/epd model tiny --out DIR --presets small", "no flag --presets"),
        (".venv/bin/python scripts/bench_e2e.py --sistems epd", "no flag --sistems"),
        (".venv/bin/python -m epd.no_such_module", "no module epd.no_such_module"),
        (".venv/bin/python -c 'from epd.client.sdk import nothing'", "cannot import name"),
        (
            ".venv/bin/python -c 'import argparse; argparse.ArgumentParser().parse_args()' --x 1",
            "no flag --x",
        ),
        ("make all", "not a program"),
    ],
)
def test_broken_commands_are_caught(code: str, problem: str) -> None:
    problems = [p for argv in shell_commands(code) for p in command_problems(argv)]
    assert len(problems) == 1 and problem in problems[0]


def test_a_missing_subcommand_is_caught() -> None:
    with pytest.raises(AssertionError, match="unknown command"):
        command_problems([".venv/bin/epd", "serve", "--port", "1"])
