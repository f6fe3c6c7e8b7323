"""Every container of the chart runs an `epd` command whose real argument parser takes the
flags the chart passes, with the environment Kubernetes gives it (the ConfigMap, the downward
API): no flag or variable the CLI does not know, and the values land where they should."""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from epd.cli import COMMANDS, add_config_argument
from epd.common.server_cli import server_options
from tests.integration.e2e.netns import UCX_ENV, Host
from tests.unit.deploy.chart import (
    EXAMPLES,
    POD,
    ROOT,
    component,
    environment,
    only_container,
    render,
    workloads,
)
from tests.unit.deploy.commands import ParserError, parse_container, parser_for

VALUES = [None, *EXAMPLES]
ENV_IN_HELP = re.compile(r"env (EPD_[A-Z0-9_]+)")
ENV_LITERAL = re.compile(r"^EPD_[A-Z0-9_]+$")
SOURCE_FOLDERS = ("server", "common", "scheduler", "client", "launch", "epd")


@cache
def help_variables(command: str) -> frozenset[str]:
    """EPD_* variables `epd COMMAND --help` names as fallbacks of its flags."""
    parser = argparse.ArgumentParser()
    importlib.import_module(COMMANDS[command][0]).add_arguments(parser)
    add_config_argument(parser)
    return frozenset(ENV_IN_HELP.findall(" ".join(parser.format_help().split())))


@cache
def process_wide_variables() -> frozenset[str]:
    """EPD_* variables read by library code rather than as a flag's fallback: those named in
    the source (string literals) and in no command's --help."""
    found: set[str] = set()
    for folder in SOURCE_FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            if "v1" in path.relative_to(ROOT).parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    found.update(m for m in [node.value] if ENV_LITERAL.match(m))
    services = ("scheduler", "route", "encode", "prefill", "decode")
    return frozenset(found - set().union(*(help_variables(c) for c in services)))


def foreign_variables_tested_across_hosts() -> set[str]:
    """Variables for other software (UCX, NIXL) that the two-host test gives its processes."""
    host = Host("a", "10.0.0.1", "veth0", Path("/nonexistent"))
    added = set(UCX_ENV) | (set(host.environment()) - set(os.environ))
    return {name for name in added if not name.startswith("EPD_")}


@cache
def hub_variables_read() -> frozenset[str]:
    """Of the hub variables the chart gives (HF_HOME, HF_TOKEN), those huggingface_hub, which
    resolves a hub id --model, reads: seen by running it with them set and nothing else of its."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_HOME="/chart/hub-home", HF_TOKEN="hf_chart")
    code = (
        "import huggingface_hub, huggingface_hub.constants as c;"
        "print(c.HF_HUB_CACHE, huggingface_hub.get_token())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    cache_dir, token = done.stdout.split()
    read = {"HF_HOME"} if cache_dir == "/chart/hub-home/hub" else set()
    return frozenset(read | ({"HF_TOKEN"} if token == "hf_chart" else set()))


def containers(values: Path | None) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    objects = render(*([values] if values else []))
    found = []
    for workload in workloads(objects):
        container = only_container(workload)
        found.append((component(workload), container, environment(objects, container)))
    assert found
    return found


@pytest.mark.parametrize("values", VALUES, ids=lambda v: v.stem if v else "default")
def test_every_container_parses_with_the_real_cli(
    values: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, container, env in containers(values):
        args = parse_container(container, env, monkeypatch)
        options = server_options(args)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert options.port == ports["grpc"], name
        assert options.host == "0.0.0.0", name
        advertised = options.advertised_endpoint(options.port, getattr(args, "scheduler", None))
        assert advertised == f"{POD['status.podIP']}:{options.port}", name
        assert options.metrics_port == ports.get("metrics"), name
        if hasattr(args, "kv_port"):
            assert (args.kv_host, args.kv_port) == (POD["status.podIP"], ports["kv"]), name
        if hasattr(args, "http_port"):
            assert args.http_port == ports["http"], name


def check_variable(variable: str, known: frozenset[str], where: str) -> None:
    if variable.startswith("EPD_"):
        assert variable in known, f"{where}: no process there reads ${variable}"
    else:
        foreign = foreign_variables_tested_across_hosts() | hub_variables_read()
        assert variable in foreign, f"{where}: ${variable}"


@pytest.mark.parametrize("values", VALUES, ids=lambda v: v.stem if v else "default")
def test_every_variable_is_one_its_process_reads(values: Path | None) -> None:
    """A container's own variables are read by its command; the shared ConfigMap's by at least
    one command of the release. Variables of other software are those the two-host test sets
    and those huggingface_hub reads for a hub id model."""
    found = containers(values)
    everyone: set[str] = set()
    for _, container, _ in found:
        everyone |= help_variables(container["command"][1])
    for name, container, env in found:
        command = container["command"][1]
        for entry in container.get("env", []):
            known = help_variables(command) | process_wide_variables()
            check_variable(entry["name"], known, f"{name} (epd {command})")
        for variable in env:
            check_variable(variable, frozenset(everyone) | process_wide_variables(), "ConfigMap")


def test_workers_register_with_the_scheduler_service(monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render()
    [scheduler] = [o for o in objects if o["kind"] == "Service" and component(o) == "scheduler"]
    [port] = [p["port"] for p in scheduler["spec"]["ports"] if p["name"] == "grpc"]
    for workload in workloads(objects):
        container = only_container(workload)
        if container["command"][1] == "scheduler":
            continue
        args = parse_container(container, environment(objects, container), monkeypatch)
        assert args.scheduler == f"{scheduler['metadata']['name']}:{port}", component(workload)


def test_an_unknown_flag_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ParserError, match="--gpu-count"):
        parser_for("prefill", {}, monkeypatch).parse_args(["--model", "/m", "--gpu-count", "1"])


def test_every_variable_in_the_source_is_a_flags_fallback() -> None:
    """No library code reads a variable of its own: each EPD_* name is a flag's fallback shown
    in an `epd` command's --help (EPD_HOST_ID and EPD_GRPC_KEEPALIVE_S were read inside
    libraries); those not a service's are the client's (epd chat)."""
    assert process_wide_variables() <= help_variables("chat")
    services = ("scheduler", "route", "encode", "prefill", "decode")
    assert all("EPD_HOST_ID" in help_variables(c) for c in services if c != "scheduler")
    assert all("EPD_GRPC_KEEPALIVE_S" in help_variables(c) for c in services)
