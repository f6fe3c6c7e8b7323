"""The ``epd`` command line: one console script, one subcommand per job.

Each subcommand lives in its own module that defines ``add_arguments(parser)`` (which reads the
flags' EPD_* environment fallbacks, ValueError when one is malformed) and ``run(args) -> int``;
modules are imported only when their subcommand runs, so ``epd --help`` stays instant and a
service never imports what another one needs (torch, vLLM).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
from collections.abc import Sequence

from epd import __version__
from epd.common.flag_suggest import close_match, reject_unknown
from epd.common.flags import refused

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "model": ("epd.server.engine.model_cli", "build local models (epd model tiny --out DIR)"),
    "scheduler": ("epd.scheduler.cli", "run the scheduler: worker registry and placement"),
    "encode": ("epd.server.encode.cli", "run an encoder: images to embeddings (vision tower only)"),
    "prefill": ("epd.server.prefill.cli", "run a prefill worker (vLLM or transformers)"),
    "decode": ("epd.server.decode.cli", "run a decode worker on vLLM (KV pulled from prefill)"),
    "route": ("epd.server.route.cli", "run the route: the public Generate / ListModels entry"),
    "store-holder": (
        "epd.server.store.holder_cli",
        "lend the embedding store (Mooncake) the memory its values live in",
    ),
    "up": ("epd.launch.up_cli", "start a local deployment, answer one request with an image"),
    "chat": ("epd.client.chat_cli", "ask a running deployment about images"),
    "generate": (
        "epd.server.engine.generate_cli",
        "answer one question about images in-process with the reference engine",
    ),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: sys.argv[1:]), run the chosen subcommand, return its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="epd",
        description="Disaggregated Encode / Prefill / Decode serving for vision-language models.",
        epilog="Run `epd COMMAND --help` for the flags of one command.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    if args and args[0] in COMMANDS:
        module_name, summary = COMMANDS[args[0]]
        module = importlib.import_module(module_name)
        sub = subparsers.add_parser(args[0], help=summary, description=summary)
        try:
            module.add_arguments(sub)
            add_config_argument(sub)
            args = [args[0], *file_arguments(args[0], sub, args[1:]), *args[1:]]
        except ValueError as e:  # NOTE: a malformed EPD_* fallback or --config file
            return refused(args[0], e)
        parsed, extras = parser.parse_known_args(args)
        if extras:
            reject_unknown(parser, parsed, extras)
        return int(module.run(parsed))
    for name, (_, summary) in COMMANDS.items():
        subparsers.add_parser(name, help=summary)
    if args and not args[0].startswith("-"):
        meant = close_match(args[0], COMMANDS)
        hint = f" (did you mean {meant}?)" if meant else ""
        parser.error(f"unknown command {args[0]!r}{hint}; the commands: {', '.join(COMMANDS)}")
    parser.parse_args(args)
    return 2


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` on every command (``common/config_file.py`` says what the file holds)."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=os.environ.get("EPD_CONFIG"),
        help="YAML file of flag values: top-level keys are flags (max-batch-size: 8), a key "
        "naming a command holds that command's own (encode: {...}); flags on the command line "
        "and EPD_* variables override it (env EPD_CONFIG; epd up hands it to its services)",
    )


def file_arguments(command: str, parser: argparse.ArgumentParser, args: Sequence[str]) -> list[str]:
    """The arguments ``--config`` (or EPD_CONFIG, the flag's default) adds for ``command``; []
    without a file."""
    from epd.common.config_file import config_arguments, load_config

    path = config_path(args) or parser.get_default("config")
    if not path:
        return []
    document = load_config(path)
    try:
        return config_arguments(
            document,
            command,
            parser,
            commands=COMMANDS,
            environ=os.environ,
            is_flag_elsewhere=functools.partial(is_flag_of_another_command, command),
        )
    except ValueError as e:
        raise ValueError(f"--config {path}: {e}") from None


def config_path(args: Sequence[str]) -> str | None:
    """The last ``--config FILE`` (or ``--config=FILE``) of ``args``, before any ``--``."""
    path = None
    for index, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--config" and index + 1 < len(args):
            path = args[index + 1]
        elif arg.startswith("--config="):
            path = arg.removeprefix("--config=")
    return path


def is_flag_of_another_command(command: str, key: str) -> bool:
    """Whether a command other than ``command`` has flag ``key``."""
    return "--" + key.strip().replace("_", "-") in options_of_other_commands(command)


@functools.cache
def options_of_other_commands(command: str) -> frozenset[str]:
    """The option strings of every command but ``command`` (imports their flag modules)."""
    options: set[str] = set()
    for name, (module_name, _) in COMMANDS.items():
        if name != command:
            parser = argparse.ArgumentParser(add_help=False)
            importlib.import_module(module_name).add_arguments(parser)
            options.update(o for action in parser._actions for o in action.option_strings)
    return frozenset(options)


if __name__ == "__main__":
    sys.exit(main())
