"""Every fenced code block in README.md and docs/ (benchmark pages included) runs as written.

- Each block names its language: ``python``, ``bash`` or ``text`` (diagrams, sample output).
- python: compiles, every ``import`` / ``from ... import`` resolves, and the block runs in a
  subprocess; the ones talking to a deployment at 127.0.0.1 (the SDK, the ``openai`` client)
  reach a real route over in-memory fakes, with the placeholders below swapped for what it serves.
- bash: each command's program exists: ``scripts/*`` files are executable, ``epd SUBCOMMAND``
  exists, ``python -m MODULE`` resolves, ``python -c CODE`` compiles with its imports resolving,
  and every ``--flag`` given to epd, a script or a module appears in that command's ``--help``.
  Nothing heavy runs (no install, no benchmark, no deployment): only ``--help``.

Placeholders a block may use: ``127.0.0.1:50050`` is the route's gRPC endpoint,
``http://127.0.0.1:PORT`` (or any port) its OpenAI HTTP endpoint, ``base64,...`` a PNG, an
``https://example.com/...`` image a PNG (no network here), and quoted ``NAME.png`` / ``NAME.jpg``
files are written into the block's working folder.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import base64
import functools
import importlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LANGUAGES = {"python", "bash", "text", "yaml"}
BIN = Path(sys.executable).parent
EPD_PROGRAMS = {"epd", ".venv/bin/epd"}
PYTHON_PROGRAMS = {"python", ".venv/bin/python"}
# Programs of other projects the docs show (containers, Kubernetes): named, not checked here.
OTHER_PROJECTS_PROGRAMS = {"docker", "podman", "helm", "kubectl", "curl", "grpcurl"}
T = TypeVar("T")
SEPARATORS = {"&&", "||", "|", ";", "&"}


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


# --- python: compile and resolve imports ---------------------------------------------------------


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


@by_place(BLOCKS)
def test_every_block_names_its_language(block: Block) -> None:
    assert block.language in LANGUAGES, (
        f"{block.where}: tag the block with one of {sorted(LANGUAGES)}, not {block.language!r}"
    )


@by_place(PYTHON)
def test_python_blocks_compile_and_their_imports_resolve(block: Block) -> None:
    assert import_problems(block.code) == [], block.where


@by_place(YAML)
def test_yaml_blocks_are_config_files_every_command_takes(block: Block) -> None:
    """Every YAML block is an ``epd --config`` file: each command finds its keys flags of its
    own or of another command, and parses their values (required flags aside)."""
    from epd.cli import COMMANDS, add_config_argument, is_flag_of_another_command
    from epd.common.config_file import config_arguments

    document = yaml.safe_load(block.code)
    for command, (module_name, _) in COMMANDS.items():
        parser = argparse.ArgumentParser(exit_on_error=False)
        importlib.import_module(module_name).add_arguments(parser)
        add_config_argument(parser)
        for action in parser._actions:
            action.required = False
        arguments = config_arguments(
            document,
            command,
            parser,
            commands=COMMANDS,
            environ={},
            is_flag_elsewhere=lambda key, command=command: is_flag_of_another_command(command, key),
        )
        parser.parse_args(arguments)


# --- bash: programs, subcommands and flags -------------------------------------------------------


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


# --- python blocks run; those calling a deployment reach a route over fakes ----------------------


def png_bytes() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


class RouteThread:
    """The real route (gRPC and OpenAI HTTP) over fakes, on an event loop in its own thread so
    that blocks calling ``asyncio.run`` or blocking clients can drive it."""

    def __init__(self, model_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.endpoint, self.http_url = self.call(self._start(model_dir))

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(60)

    async def _start(self, model_dir: Path) -> tuple[str, str]:
        from epd.common.server import ServerOptions
        from epd.server.media.policy import MediaPolicy
        from epd.server.media.video_loader import VideoLoader
        from epd.server.media.video_planner import VideoPlanner
        from epd.server.route.openai_http import OpenAiHttp
        from epd.server.route.tools import ToolOptions
        from tests.unit.route.fake_route import serve_route
        from tests.unit.route.fakes import FakePeers

        # NOTE: as README's deployment: --enable-auto-tool-choice --tool-call-parser hermes
        tools = ToolOptions(enable_auto_tool_choice=True, tool_call_parser="hermes")
        served = await serve_route(model_dir, FakePeers(), " a red square", ServerOptions(), tools)
        # NOTE: the blocks' videos are decoded and planned for real; the fake encoders take them
        served.router.videos = VideoLoader(VideoPlanner(model_dir, "tiny"), MediaPolicy())
        self.server = served.server
        self.http = OpenAiHttp(served.router, tools=served.calling)
        http_port = await self.http.start("127.0.0.1", 0)
        return f"127.0.0.1:{served.port}", f"http://127.0.0.1:{http_port}"

    async def _stop(self) -> None:
        await self.http.stop()
        await self.server.drain_and_stop(0)

    def stop(self) -> None:
        self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def route(tiny_model_dir: Path) -> Iterator[RouteThread]:
    route = RouteThread(tiny_model_dir)
    yield route
    route.stop()


def with_placeholders_filled(code: str, route: RouteThread) -> str:
    picture = "data:image/png;base64," + base64.b64encode(png_bytes()).decode()
    code = re.sub(r"http://127\.0\.0\.1:(PORT|\d+)", route.http_url, code)
    code = code.replace("127.0.0.1:50050", route.endpoint)
    code = code.replace("data:image/png;base64,...", picture)
    return re.sub(r"https://example\.com/[\w./-]+", picture, code)


@by_place(PYTHON)
def test_python_blocks_run(block: Block, route: RouteThread, tmp_path: Path) -> None:
    for name in set(re.findall(r"[\"']([\w-]+\.(?:png|jpg))[\"']", block.code)):
        (tmp_path / name).write_bytes(png_bytes())
    environment = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1"}
    done = subprocess.run(
        [sys.executable, "-c", with_placeholders_filled(block.code, route)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{block.where}:\n{done.stderr[-3000:]}"
