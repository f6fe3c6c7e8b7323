"""One default per option, owned by its options dataclass: every service's flags, parsed with no
argument and no EPD_* variable set, build the dataclasses' own defaults, and no flag writes again,
in its ``default=`` or in the ``default N`` of its help, a value that the dataclass field it sets
already holds (it reads the field instead: a flag declared on its field with ``common.flags``)."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from epd.cli import COMMANDS
from epd.common.server import ServerOptions
from epd.common.server_tls import ServerTls
from epd.launch.monitor import WatchOptions
from epd.launch.topology import Topology
from epd.scheduler.config import SchedulerConfig
from epd.server.decode.app import DecodeConfig
from epd.server.encode.app import EncodeConfig
from epd.server.engine.transformers_engine import TransformersOptions
from epd.server.engine.vllm_inputs import SideChannel
from epd.server.engine.vllm_options import VllmOptions
from epd.server.media.policy import MediaPolicy
from epd.server.prefill.app import PrefillConfig
from epd.server.route.app import RouteConfig
from epd.server.route.http_guard import HttpOptions
from epd.server.route.request_check import RequestLimits
from epd.server.transfer.options import NixlOptions, TransferOptions

MiB = 1 << 20
ENV_NAME = re.compile(r"EPD_[A-Z0-9_]+")
DEFAULT_IN_HELP = re.compile(r"\bdefault:? ([\w.\-]+)")
SERVER = (ServerOptions, ServerTls, MediaPolicy, TransferOptions, NixlOptions)
ENGINE = (VllmOptions, TransformersOptions, SideChannel)
# The options dataclasses whose fields each command's flags set.
OPTIONS: dict[str, tuple[type, ...]] = {
    "scheduler": (SchedulerConfig, ServerOptions, ServerTls),
    "encode": (EncodeConfig, *SERVER),
    "prefill": (PrefillConfig, *ENGINE, *SERVER),
    "decode": (DecodeConfig, *ENGINE, *SERVER),
    "route": (RouteConfig, HttpOptions, RequestLimits, *SERVER),
    "up": (Topology, WatchOptions, SchedulerConfig),
}
# Flags whose field has another name (a unit in the flag's name, a prefix of its group).
RENAMED: dict[str, tuple[tuple[type, str], ...]] = {
    "vision_attention": ((EncodeConfig, "attention"),),
    "max_pending": (
        (VllmOptions, "max_pending_requests"),
        (TransformersOptions, "max_pending_requests"),
        (PrefillConfig, "capacity"),
        (DecodeConfig, "capacity"),
    ),
    "kv_host": ((SideChannel, "host"),),
    "kv_port": ((SideChannel, "port"),),
    "max_message_mb": ((ServerOptions, "max_message_bytes"),),
    "grpc_keepalive_s": ((ServerOptions, "keepalive_s"),),
    "media_max_mb": ((MediaPolicy, "max_bytes"),),
    "media_max_pixels": ((MediaPolicy, "max_pixels"),),
    "media_fetch_timeout_s": ((MediaPolicy, "fetch_timeout_s"),),
    "media_max_url_chars": ((MediaPolicy, "max_url_chars"),),
    "media_image_formats": ((MediaPolicy, "image_formats"),),
    "media_max_jpeg_scans": ((MediaPolicy, "max_jpeg_scans"),),
    "nixl_ucx_error_handling": ((NixlOptions, "ucx_error_handling"),),
    "nixl_poll_interval_s": ((NixlOptions, "poll_interval_s"),),
    "nixl_progress_thread": ((NixlOptions, "progress_thread"),),
    "http_max_body_mb": ((HttpOptions, "max_body_bytes"),),
    "http_max_json_values": ((HttpOptions, "max_json_values"),),
    "http_header_timeout_s": ((HttpOptions, "header_timeout_s"),),
    "http_body_timeout_s": ((HttpOptions, "body_timeout_s"),),
    "http_idle_timeout_s": ((HttpOptions, "idle_timeout_s"),),
    "http_max_connections": ((HttpOptions, "max_connections"),),
    "http_request_timeout_s": ((HttpOptions, "request_timeout_s"),),
    "topology": ((Topology, "name"),),
    "encoders": ((Topology, "num_encoders"),),
    "prefill_workers": ((Topology, "num_prefill"),),
    "decode_workers": ((Topology, "num_decode"),),
    "default_policy": ((Topology, "policy"), (SchedulerConfig, "default_policy")),
}
# Dataclasses whose fields only renamed flags set (SideChannel.host is --kv-host, not --host).
ONLY_RENAMED = {SideChannel}
# Fields whose flag gives another value by design.
OWN_DEFAULTS = {
    "ServerOptions.port": "each service listens on its own port (its cli's DEFAULT_PORT)",
}


@dataclasses.dataclass(frozen=True)
class Defined:
    """Where a flag's ``add_argument`` call is: the file and a line inside the call."""

    action: argparse.Action
    path: str
    line: int


@pytest.fixture(autouse=True)
def no_epd_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("EPD_")]:
        monkeypatch.delenv(name)


def command_flags(command: str) -> list[Defined]:
    """``epd COMMAND``'s flags, each with the place its ``add_argument`` call was made."""
    places: list[Defined] = []
    add_argument = argparse._ActionsContainer.add_argument

    def recording(self: Any, *args: Any, **kwargs: Any) -> argparse.Action:
        action = add_argument(self, *args, **kwargs)
        caller = sys._getframe(1)
        places.append(Defined(action, caller.f_code.co_filename, caller.f_lineno))
        return action

    parser = argparse.ArgumentParser(prog=f"epd {command}")
    argparse._ActionsContainer.add_argument = recording  # type: ignore[method-assign]
    try:
        __import__(COMMANDS[command][0], fromlist=["add_arguments"]).add_arguments(parser)
    finally:
        argparse._ActionsContainer.add_argument = add_argument  # type: ignore[method-assign]
    # NOTE: a flag common/flags.py generates takes its default from its field by construction.
    return [
        place
        for place in places
        if place.action.help != argparse.SUPPRESS and Path(place.path).name != "flags.py"
    ]


def fields_set_by(command: str, dest: str) -> Iterator[tuple[type, str, Any]]:
    """(dataclass, field, its default) of each field flag ``dest`` of ``command`` sets."""
    named = [cls for cls in OPTIONS.get(command, ()) if cls not in ONLY_RENAMED]
    targets = RENAMED.get(dest) or [(cls, dest) for cls in named]
    for cls, name in targets:
        if cls not in OPTIONS.get(command, ()):
            continue
        for field in dataclasses.fields(cls):
            if field.name == name and field.default is not dataclasses.MISSING:
                yield cls, name, field.default
            elif field.name == name and field.default_factory is not dataclasses.MISSING:
                yield cls, name, field.default_factory()


def spellings(name: str, value: Any) -> list[Any]:
    """How a flag could write ``value``, the default of field ``name``: itself, its enum's
    value or label, its text, and in MiB for a field in bytes."""
    found = [value, getattr(value, "value", None), getattr(value, "label", None)]
    if isinstance(value, tuple):
        found.append(",".join(str(item) for item in value))
    if name.endswith("_bytes") and isinstance(value, int):
        found.append(value / MiB)
    return [item for item in found if item is not None]


def same(literal: Any, value: Any) -> bool:
    """Whether ``literal`` (a constant in a flag's source) writes ``value``."""
    if isinstance(literal, bool) or isinstance(value, bool):
        return type(literal) is type(value) and literal == value
    if isinstance(value, int | float) and not isinstance(literal, bool):
        try:
            return float(literal) == float(value)
        except (TypeError, ValueError):
            return False
    return literal == value or str(literal) == str(value)


@functools.cache
def tree_of(path: str) -> ast.Module:
    return ast.parse(Path(path).read_text())


def call_of(place: Defined) -> ast.Call:
    """The ``add_argument`` call of ``place``: the innermost call spanning its line whose first
    argument is one of the flag's names."""
    names = set(place.action.option_strings) or {place.action.dest}
    calls = [
        node
        for node in ast.walk(tree_of(place.path))
        if isinstance(node, ast.Call)
        and node.lineno <= place.line <= (node.end_lineno or node.lineno)
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value in names
    ]
    assert calls, f"no add_argument call of {names} around {place.path}:{place.line}"
    return calls[-1]


def written_defaults(call: ast.Call) -> Iterator[tuple[str, Any]]:
    """(where, literal) of each value the call writes as a default: the constants of its
    ``default=`` (variable names aside) and the words after ``default`` in its help's literal
    text (not in what an f-string computes). The empty text and None mean unset, not a value."""
    for keyword in call.keywords:
        if keyword.arg == "default":
            for node in ast.walk(keyword.value):
                if not isinstance(node, ast.Constant) or node.value in ("", None):
                    continue
                if not ENV_NAME.fullmatch(str(node.value)):
                    yield "default=", node.value
        if keyword.arg == "help":
            texts = [n for n in ast.walk(keyword.value) if isinstance(n, ast.Constant)]
            for node in texts:
                for word in DEFAULT_IN_HELP.findall(str(node.value)):
                    yield "help", word


def duplicated_defaults(command: str) -> list[str]:
    """One line per flag of ``command`` writing a default its dataclass field holds."""
    found = []
    for place in command_flags(command):
        fields = list(fields_set_by(command, place.action.dest))
        if not fields:
            continue
        call = call_of(place)
        for where, literal in written_defaults(call):
            for cls, name, value in fields:
                if value is None or not any(same(literal, v) for v in spellings(name, value)):
                    continue
                flag = place.action.option_strings[0]
                found.append(
                    f"epd {command} {flag}: {literal!r} written in its {where} and in "
                    f"{cls.__name__}.{name} ({Path(place.path).name}:{call.lineno})"
                )
    return found


@pytest.mark.parametrize("command", sorted(OPTIONS))
def test_no_flag_writes_a_default_its_dataclass_holds(command: str) -> None:
    assert duplicated_defaults(command) == []


def differences(built: Any, prefix: str = "") -> Iterator[str]:
    """``Class.field: flags give X, the dataclass Y`` for each field of ``built`` (nested
    dataclasses field by field) whose value is not its dataclass's default."""
    for field in dataclasses.fields(built):
        name = f"{prefix or type(built).__name__}.{field.name}"
        value = getattr(built, field.name)
        if name in OWN_DEFAULTS:
            continue
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            continue
        if dataclasses.is_dataclass(value) and dataclasses.is_dataclass(default):
            yield from differences(value, name)
        elif value != default:
            yield f"{name}: the flags give {value!r}, the dataclass {default!r}"


def parse(command: str, *flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"epd {command}")
    __import__(COMMANDS[command][0], fromlist=["add_arguments"]).add_arguments(parser)
    return parser.parse_args(list(flags))


def built_options(command: str) -> list[Any]:
    """The options dataclasses ``epd COMMAND`` builds from its flags, as its cli builds them."""
    from epd.common.server_cli import server_options
    from epd.launch import topology_cli
    from epd.scheduler.cli import scheduler_config
    from epd.server.decode.cli import decode_config
    from epd.server.encode.cli import encode_config
    from epd.server.engine.engine_cli import engine_options, transformers_options
    from epd.server.prefill.cli import prefill_config
    from epd.server.route.cli import route_config

    builders: dict[str, tuple[tuple[str, ...], Callable[[argparse.Namespace], list[Any]]]] = {
        "scheduler": ((), lambda a: [scheduler_config(a), server_options(a)]),
        "encode": (("--model", "m"), lambda a: [encode_config(a), server_options(a)]),
        "prefill": (
            ("--model", "m"),
            lambda a: [
                prefill_config(a),
                engine_options(a, None, "cpu"),
                transformers_options(a, "cpu"),
                server_options(a),
            ],
        ),
        "decode": (
            ("--model", "m"),
            lambda a: [decode_config(a), engine_options(a, None, "cpu"), server_options(a)],
        ),
        "route": (("--model", "m"), lambda a: [route_config(a), server_options(a)]),
        "up": (
            (),
            lambda a: [topology_cli.topology_of(a), WatchOptions(max_restarts=a.max_restarts)],
        ),
    }
    required, build = builders[command]
    return build(parse(command, *required))


@pytest.mark.parametrize("command", sorted(OPTIONS))
def test_flags_left_unset_build_the_dataclass_defaults(command: str) -> None:
    found = [line for built in built_options(command) for line in differences(built)]
    assert found == [], f"epd {command}"


def test_a_duplicated_default_is_named() -> None:
    source = 'add("--cache-mb", type=float, default=256.0, help="budget (default 256)")'
    call = ast.parse(source).body[0].value  # type: ignore[attr-defined]
    assert list(written_defaults(call)) == [("default=", 256.0), ("help", "256")]
    assert same("256", 256.0) and same(256.0, 256.0) and not same(1, True)
    assert 20.0 in spellings("max_bytes", 20 * MiB)
