"""``epd up``: start a local deployment (E/P/D by default) as child processes, answer one request
with an image, print the answer and the trace across services, stop everything (or ``--keep``).
A child that dies is reported in one line; it fails the run, or with ``--keep`` is restarted."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NoReturn

from epd.client.errors import EpdClientError
from epd.client.messages import user
from epd.client.sdk import AsyncEpdClient
from epd.common.cpus import allowed_cpus
from epd.common.flags import add_dataclass_arguments, flag, refused
from epd.common.telemetry import DEFAULT_SPAN_FILE_MB
from epd.common.telemetry_cli import mebibytes
from epd.launch.autoscale_cli import (
    add_scaling_arguments,
    autoscale,
    scaling_groups,
    scaling_options,
    scheduler_flags,
)
from epd.launch.cpu_layout import LAYOUTS, MIN_SPLIT_CPUS, describe, lay_out, parse_pins
from epd.launch.entry_cli import add_entry_arguments, public_entry
from epd.launch.launcher import Child, Deployment, start_topology
from epd.launch.monitor import ChildDied, WatchOptions, until_a_child_dies, watch
from epd.launch.public_entry import PublicEntry, child_env
from epd.launch.topology import TOPOLOGIES, Topology, check_ports
from epd.launch.topology_cli import add_topology_arguments, topology_of
from epd.launch.traces import summarise
from epd.launch.up_engine import add_engine_arguments, check_engine_args, engine_settings
from epd.server.engine.device import (
    CPU,
    cuda_device_index,
    device_type,
    resolve_device,
    xpu_available,
)
from epd.server.engine.engine_cli import vllm_installed
from epd.server.media.media_cli import add_passed_on_media_arguments, route_media_flags
from epd.server.models.model_cli import add_model_arguments, resolve_model_arguments
from epd.server.route.tools_cli import add_passed_on_tool_arguments, route_tool_flags

DEFAULT_MODEL = Path(".epd/models/tiny")
SPAN_FILE = "spans.jsonl"


@dataclass(frozen=True, slots=True)
class UpRun:
    """The settings of one ``epd up`` run besides its model, topology and engines: how it lays
    out and numbers its services, its demo request, where it writes. Its fields declare their
    flags."""

    model_id: str = field(
        default="",
        metadata=flag(
            "model name",
            default_help="default: the hub id, or the directory name",
            aliases=("served-model-name",),
        ),
    )
    cpu_layout: str = field(
        default="auto",
        metadata=flag(
            "how the services share the CPUs this process may use: shared (every service on "
            "every CPU), split (scheduler and route on the first CPUs, each engine and encoder "
            "on its own, threads sized to them) or auto: split when each CPU-bound engine and "
            f"encoder gets at least {MIN_SPLIT_CPUS} CPUs, else shared",
            choices=LAYOUTS,
        ),
    )
    cpus: tuple[str, ...] = field(
        default=(),
        metadata=flag(
            "pin one service by hand, e.g. --cpus prefill=0-7 --cpus encode0=8-11 (names: "
            "scheduler, route, prefill, prefill1.., decode, decode1.., encode0..); the layout "
            "places the others on the CPUs left (repeatable)",
            metavar="NAME=LIST",
            repeatable=True,
        ),
    )
    base_port: int = field(
        default=0,
        metadata=flag(
            "route on BASE, scheduler BASE+1, prefill BASE+2, decode BASE+3, encoders "
            "BASE+4..BASE+9, OpenAI HTTP BASE+10, the other engine replicas (prefill1.., then "
            "decode1..) BASE+11..BASE+19",
            default_means="free ports",
        ),
    )
    question: str = field(
        default="What is in this picture?", metadata=flag("the question of the demo request")
    )
    image: Path | None = field(
        default=None,
        metadata=flag("image of the demo request", default_help="default: a generated picture"),
    )
    max_tokens: int = field(default=16, metadata=flag("tokens to generate"))
    no_demo: bool = field(
        default=False,
        metadata=flag("skip the demo request (with --keep: just start the deployment)"),
    )
    endpoints_file: Path | None = field(
        default=None,
        metadata=flag(
            "once ready, write the endpoints of every service there as JSON (its 'metrics' "
            "maps each service to its Prometheus URL)"
        ),
    )
    metrics: bool = field(
        default=True,
        metadata=flag(
            "every service serves Prometheus metrics on a free port (BASE+20+its offset with "
            "--base-port); the URLs are printed",
            negatable=True,
        ),
    )
    keep: bool = field(
        default=False,
        metadata=flag(
            "leave the deployment running after the demo (Ctrl-C stops it). A service that "
            "dies is reported in one line (name, pid, exit code or signal, log) and restarted, "
            "up to --max-restarts times, then the deployment stops (exit 1). Without --keep a "
            "service that dies stops the deployment at once (exit 1)"
        ),
    )
    run_dir: Path = field(
        default=Path(".epd/run"),
        metadata=flag("logs and spans go to RUN_DIR/TIMESTAMP"),
    )
    trace_max_mb: int = field(
        default=DEFAULT_SPAN_FILE_MB,
        metadata=flag(
            f"every service appends its spans to RUN_DIR/TIMESTAMP/{SPAN_FILE}, rotated to "
            f"{SPAN_FILE}.1 when it reaches half this size: the two hold at most this many MiB; "
            "0: no cap",
            env="EPD_TRACE_FILE_MAX_MB",
            type=mebibytes,
        ),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``epd up``: ``UpRun``'s, ``Topology``'s, the engines' and ``WatchOptions``'."""
    add_model_arguments(
        parser,
        required=False,
        what=f"resolved once and passed to every service as a directory; default {DEFAULT_MODEL}, "
        "the tiny model, built there if absent",
    )
    add_topology_arguments(parser)
    add_engine_arguments(parser)
    add_entry_arguments(parser)
    add_dataclass_arguments(parser, UpRun)
    add_dataclass_arguments(parser, WatchOptions)
    add_scaling_arguments(parser)
    add_passed_on_tool_arguments(parser)
    add_passed_on_media_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Start, ask, print, stop (or keep)."""
    try:
        _plan(args)
        _resolve_model(args)
    except ValueError as e:
        return refused("up", e)
    deployment = _deployment(args)
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    try:
        return asyncio.run(_up(args, deployment))
    except KeyboardInterrupt:
        print("\nstopping", flush=True)
        return 130
    except ChildDied as e:
        for line in [*str(e).splitlines(), "stopping the deployment"]:
            print(f"epd up: {line}", file=sys.stderr, flush=True)
        return 1
    except RuntimeError as e:
        print(f"epd up: {e}", file=sys.stderr)
        return 1
    finally:
        deployment.stop()
        signal.signal(signal.SIGTERM, previous)


def _plan(args: argparse.Namespace) -> None:
    """Check the flags and fill in what they imply (topology, ports, device, CPU plan, entry);
    ValueError names what is wrong."""
    if args.max_tokens < 1:
        raise ValueError("--max-tokens must be at least 1")
    args.watch = WatchOptions(max_restarts=args.max_restarts)
    args.scaling = scaling_options(args)
    topology = replace(
        topology_of(args),
        scheduler_flags=scheduler_flags(args),
        route_flags=route_tool_flags(args) + route_media_flags(args),
    )
    args.planned_topology = topology
    scaling_groups(topology)
    if args.base_port:
        check_ports(topology, args.metrics)
    check_engine_args(args)
    args.device = resolve_device(args.device)
    args.cpu_plan = cpu_plan(args, topology)
    args.entry = public_entry(args)


def _resolve_model(args: argparse.Namespace) -> None:
    """The model to serve: ``--model``, else the embedded tiny model (built on first use, and
    again when this epd's builder differs from the one that built it)."""
    if args.model is None:
        from epd.server.models.tiny.build import build_tiny_model, is_current

        if not is_current(DEFAULT_MODEL):
            again = " again (an older epd built it)" if DEFAULT_MODEL.exists() else ""
            print(f"building the tiny model in {DEFAULT_MODEL}{again} ...", flush=True)
            build_tiny_model(DEFAULT_MODEL)
    args.model = args.model or str(DEFAULT_MODEL)
    resolve_model_arguments(args)


def _deployment(args: argparse.Namespace) -> Deployment:
    """The deployment's run directory and the environment its services start with (each
    service keeps its own tracing name, so the trace printed shows each hop)."""
    run_dir = (args.run_dir / time.strftime("%Y%m%d-%H%M%S")).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **{k: v for k, v in child_env(os.environ).items() if k != "OTEL_SERVICE_NAME"},
        "EPD_TRACE_EXPORTER": f"json:{run_dir / SPAN_FILE}",
        "EPD_TRACE_FILE_MAX_MB": str(args.trace_max_mb),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if getattr(args, "config", None):
        # NOTE: each service applies the file's keys it has a flag for, and its own section.
        env["EPD_CONFIG"] = str(Path(args.config).resolve())
    cap = f"at most {args.trace_max_mb} MiB with {SPAN_FILE}.1" if args.trace_max_mb else "no cap"
    print(f"logs and spans in {run_dir} ({SPAN_FILE}: {cap})", flush=True)
    args.run_dir_resolved = run_dir
    args.span_file = run_dir / SPAN_FILE
    return Deployment(run_dir, env, base_port=args.base_port or None, metrics=args.metrics)


async def _up(args: argparse.Namespace, deployment: Deployment) -> int:
    route, status = await until_a_child_dies(deployment, _start_and_ask(args, deployment))
    if status != 0 or not args.keep:
        return status
    entry: PublicEntry = args.entry
    at = entry.public_endpoint(route.port)
    chat = entry.chat_command(route.port)
    print(f"\nrunning; route at {at} ({chat}); Ctrl-C stops everything", flush=True)

    def rewrite_endpoints(child: Child | None = None) -> None:
        if args.endpoints_file:
            _write_endpoints(args.endpoints_file, deployment, route, entry, args)

    if not args.planned_topology.scales_encoders:
        await watch(deployment, args.watch, _report, rewrite_endpoints)
    scheduler = next(c for c in deployment.children if c.name == "scheduler").endpoint
    task = asyncio.ensure_future(autoscale(args, deployment, scheduler, _report, rewrite_endpoints))
    task.add_done_callback(_report_failure)
    try:
        await watch(deployment, args.watch, _report, rewrite_endpoints)
    finally:
        task.cancel()


def _report(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _report_failure(task: asyncio.Task[NoReturn]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        _report(f"epd up: the autoscaler stopped: {error!r}")


async def _start_and_ask(args: argparse.Namespace, deployment: Deployment) -> tuple[Child, int]:
    """Start the deployment and, unless --no-demo, ask the demo question; (route, exit status)."""
    model_id: str = args.model_id
    planned: Topology = args.planned_topology
    plan: dict[str, list[int]] = args.cpu_plan
    kv_cache_mb, engine_flags = engine_settings(
        args, args.device, planned.num_engines, engines_pinned="prefill" in plan
    )
    topology = replace(
        planned,
        kv_cache_mb=kv_cache_mb,
        engine_flags=engine_flags,
        vllm_args=tuple(args.vllm_args),
        http=planned.http and vllm_installed(),
    ).with_cpus(plan)
    if planned.http and not topology.http:
        print("OpenAI HTTP off: it parses bodies with vLLM's request models (install vLLM)")
    print(f"CPUs: {describe(plan)}", flush=True)
    wait = "" if topology.engine == "transformers" else " (vLLM engines take ~35 s)"
    print(f"starting {TOPOLOGIES[topology.name]}{wait} ...", flush=True)
    start = time.monotonic()
    entry: PublicEntry = args.entry
    route = await start_topology(deployment, args.model.resolve(), model_id, topology, entry)
    print(f"ready in {time.monotonic() - start:.0f}s; logs in {deployment.run_dir}")
    for child in deployment.children:
        at = entry.public_endpoint(child.port) if child is route else child.endpoint
        print(f"  {child.name:<10} {at}  (log {child.log.name})")
    if route.http_port:
        url = entry.http_url(route.http_port)
        print(f"  {'openai':<10} {url} (chat/completions, completions, models)")
    for child in deployment.children:
        if child.metrics_url:
            print(f"  {child.name:<10} metrics {child.metrics_url}")
    if args.endpoints_file:
        _write_endpoints(args.endpoints_file, deployment, route, entry, args)
    if not args.no_demo and await _demo(args, route.endpoint, model_id) != 0:
        return route, 1
    return route, 0


async def _demo(args: argparse.Namespace, endpoint: str, model_id: str) -> int:
    deployment_dir = args.run_dir_resolved
    image = args.image or _demo_image(deployment_dir / "demo.png")
    entry: PublicEntry = args.entry
    print(f"\nuser: [image {image}] {args.question}\nassistant: ", end="", flush=True)
    async with AsyncEpdClient(
        endpoint, auth_token=entry.auth_token, tls_ca_file=entry.ca_file
    ) as client:
        try:
            tokens: list[int] = []
            async for chunk in client.stream(
                [user(args.question, image=image)], model=model_id, max_tokens=args.max_tokens
            ):
                print(chunk.text, end="", flush=True)
                tokens.extend(chunk.token_ids)
        except EpdClientError as e:
            print(f"\nrequest failed: {e}", file=sys.stderr)
            return 1
    print(f"\n(tokens {tokens}; the tiny model has random weights, so the words are noise)\n")
    await asyncio.sleep(0.5)
    print(summarise(deployment_dir / SPAN_FILE), flush=True)
    return 0


def cpu_plan(args: argparse.Namespace, topology: Topology) -> dict[str, list[int]]:
    """The CPUs of each service to pin, from --cpu-layout and --cpus; ValueError when they
    cannot be met."""
    has_accelerator = cuda_device_index() is not None or xpu_available()
    services = topology.services(has_accelerator, device_type(args.device) != CPU)
    pins = parse_pins(args.cpus, [service.name for service in services])
    return lay_out(services, allowed_cpus(), args.cpu_layout, pins)


def _write_endpoints(
    path: Path, deployment: Deployment, route: Child, entry: PublicEntry, args: argparse.Namespace
) -> None:
    endpoints: dict[str, object] = {c.name: c.endpoint for c in deployment.children}
    endpoints["route"] = entry.public_endpoint(route.port)
    endpoints["http"] = entry.http_url(route.http_port) if route.http_port else None
    endpoints["pids"] = {c.name: c.process.pid for c in deployment.children}
    endpoints["run_dir"] = str(deployment.run_dir)
    metrics = {c.name: c.metrics_url for c in deployment.children if c.metrics_url}
    if launcher := getattr(args, "launcher_metrics_url", None):
        metrics["launcher"] = launcher
    endpoints["metrics"] = metrics
    # NOTE: rewritten as encoders come and go: a reader never sees half of it.
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(endpoints, indent=1))
    partial.replace(path)


def _demo_image(path: Path) -> Path:
    from epd.server.engine.generate_cli import demo_image

    demo_image().save(path)
    return path
