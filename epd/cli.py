"""The ``epd`` command line: one console script, one subcommand per job.

Each subcommand lives in its own module that defines ``add_arguments(parser)`` (which reads the
flags' EPD_* environment fallbacks, ValueError when one is malformed) and ``run(args) -> int``;
modules are imported only when their subcommand runs, so ``epd --help`` stays instant and a
service never imports what another one needs (torch, vLLM).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "model": ("epd.server.engine.model_cli", "build local models (epd model tiny --out DIR)"),
    "scheduler": ("epd.scheduler.cli", "run the scheduler: worker registry and placement"),
    "encode": ("epd.server.encode.cli", "run an encoder: images to embeddings (vision tower only)"),
    "prefill": ("epd.server.prefill.cli", "run a prefill worker (vLLM or transformers)"),
    "decode": ("epd.server.decode.cli", "run a decode worker on vLLM (KV pulled from prefill)"),
    "route": ("epd.server.route.cli", "run the route: the public Generate / ListModels entry"),
    "up": ("epd.client.up_cli", "start a local deployment, answer one request with an image"),
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
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    if args and args[0] in COMMANDS:
        module_name, summary = COMMANDS[args[0]]
        module = importlib.import_module(module_name)
        sub = subparsers.add_parser(args[0], help=summary, description=summary)
        try:
            module.add_arguments(sub)
        except ValueError as e:  # NOTE: a malformed EPD_* fallback, read while adding flags
            print(f"epd {args[0]}: {e}", file=sys.stderr)
            return 2
        parsed = parser.parse_args(args)
        return int(module.run(parsed))
    for name, (_, summary) in COMMANDS.items():
        subparsers.add_parser(name, help=summary)
    parser.parse_args(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
