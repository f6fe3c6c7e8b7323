"""``epd up``'s pass-through of the route's tool, reasoning and request chat template flags
(``tools.ToolOptions``)."""

from __future__ import annotations

import argparse

from epd.common.flags import add_passed_on_arguments
from epd.server.route.tools import ToolOptions, check_tool_options

TOOL_FIELDS = ("enable_auto_tool_choice", "tool_call_parser", "reasoning_parser")
SWITCHES = ("enable_auto_tool_choice", "trust_request_chat_template")


def add_passed_on_tool_arguments(parser: argparse.ArgumentParser) -> None:
    """``--enable-auto-tool-choice``, ``--tool-call-parser``, ``--reasoning-parser`` and
    ``--trust-request-chat-template``, handed to the route when given."""
    add_passed_on_arguments(parser, ToolOptions, dict.fromkeys((*TOOL_FIELDS, *SWITCHES)))


def route_tool_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """The tool flags given, as the route's flags; ValueError as the route would raise it."""
    options = ToolOptions(
        enable_auto_tool_choice=bool(args.enable_auto_tool_choice),
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        trust_request_chat_template=bool(args.trust_request_chat_template),
    )
    check_tool_options(options)
    flags = [f"--{name.replace('_', '-')}" for name in SWITCHES if getattr(options, name)]
    for name in TOOL_FIELDS[1:]:
        if (value := getattr(options, name)) is not None:
            flags += [f"--{name.replace('_', '-')}", value]
    return tuple(flags)
