"""Start a local deployment as child processes, wait for health, stop everything on exit.

Each service runs as ``python -m epd <service> ...`` with its log in the run folder; dependants
start only once what they need is healthy, and slow starters (the vLLM engine) start in parallel
with the rest. Children get SIGTERM (drain) on exit, then SIGKILL after a grace period. A child
that dies is found by ``reap_dead`` (``monitor`` watches for it); the shared-memory segments of
dead children are removed then and on stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from epd.common.advertise import endpoint
from epd.common.channels import PLAINTEXT, TlsFiles, wait_for_health
from epd.launch.free_ports import free_port
from epd.launch.ports import (
    ENCODER_OFFSET,
    HTTP_OFFSET,
    METRICS_OFFSET,
    ROUTE_OFFSET,
    SCHEDULER_OFFSET,
    EngineWorker,
)
from epd.launch.public_entry import INTERNAL_SERVER_ARGS, LOOPBACK, PublicEntry
from epd.launch.topology import PREFILL_MODES, Topology
from epd.server.engine.rpc_leftovers import cleanup_rpc_dirs
from epd.server.store.base import MOONCAKE
from epd.server.transfer.shm_leftovers import cleanup_leftovers
from epd.server.transfer.shm_orphans import cleanup_orphans

if TYPE_CHECKING:
    from epd.launch.store_service import StartedStore


@dataclass
class Child:
    """One running service, reached at ``host`` (over ``tls``: its certificate verified);
    ``env``: its variables beyond the deployment's; ``stop_wave``: ``Deployment.stop`` stops it
    once every child of a lower wave has ended."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path
    http_port: int | None = None
    command: list[str] = field(default_factory=list)
    metrics_port: int | None = None
    num_restarts: int = 0
    is_reported: bool = False
    host: str = LOOPBACK
    tls: TlsFiles = PLAINTEXT
    env: dict[str, str] = field(default_factory=dict)
    stop_wave: int = 0

    @property
    def endpoint(self) -> str:
        return endpoint(self.host, self.port)

    @property
    def metrics_url(self) -> str | None:
        """Where Prometheus scrapes this service (None: metrics off)."""
        if self.metrics_port is None:
            return None
        return f"http://{endpoint(self.host, self.metrics_port)}/metrics"

    def describe_exit(self) -> str:
        """One line: which child ended, how, and where its log is."""
        code = self.process.returncode
        if code is not None and code < 0:
            how = f"was killed by {_signal_name(-code)}"
        else:
            how = f"exited with code {code}"
        return f"{self.name} (pid {self.process.pid}) {how}; log {self.log}"


@dataclass
class Deployment:
    """The children of one ``epd up``, in start order."""

    run_dir: Path
    env: dict[str, str]
    children: list[Child] = field(default_factory=list)
    base_port: int | None = None
    metrics: bool = False  # each service serves Prometheus metrics on a port of its own
    encoders: EncoderSlots | None = None  # set by start_topology where it starts encoders
    retiring: list[Child] = field(default_factory=list)  # draining, no longer watched

    def port(self, offset: int) -> int:
        """Port for the service at ``offset`` (base port + offset, or a free one)."""
        return self.base_port + offset if self.base_port else free_port()

    def start(
        self,
        name: str,
        offset: int,
        *args: str,
        tail: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> Child:
        """Start ``python -m epd <args> --port P <tail>`` with its output in
        ``run_dir/name.log``; with ``metrics``, also ``--metrics-port`` (base port +
        ``METRICS_OFFSET`` + offset, or a free one). ``tail``: what must end the command
        (``-- VLLM_ARG ...``); ``env``: variables of this child beyond the deployment's."""
        port = self.port(offset)
        command = [sys.executable, "-m", "epd", *args, "--port", str(port)]
        metrics_port = self.port(METRICS_OFFSET + offset) if self.metrics else None
        if metrics_port is not None:
            command += ["--metrics-port", str(metrics_port)]
        command += tail
        log = self.run_dir / f"{name}.log"
        env = env or {}
        child = Child(
            name,
            port,
            self._spawn(command, log, "wb", env),
            log,
            command=command,
            metrics_port=metrics_port,
            env=env,
        )
        self.children.append(child)
        return child

    def start_command(self, name: str, port: int, command: list[str]) -> Child:
        """Start ``command`` (a program other than epd, listening on ``port``) as a service
        like the others: its output in ``run_dir/name.log``, stopped and restarted with them."""
        log = self.run_dir / f"{name}.log"
        child = Child(name, port, self._spawn(command, log, "wb", {}), log, command=command)
        self.children.append(child)
        return child

    def restart(self, child: Child) -> None:
        """Start ``child``'s command again (same port), appending to its log."""
        with open(child.log, "ab") as out:
            out.write(f"\n--- epd up: {child.describe_exit()}; restarting it ---\n".encode())
        child.process = self._spawn(child.command, child.log, "ab", child.env)
        child.num_restarts += 1
        child.is_reported = False

    def _spawn(
        self, command: list[str], log: Path, mode: str, env: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        with open(log, mode) as out:
            return subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**self.env, **env},
                start_new_session=True,
            )

    def retire(self, child: Child) -> None:
        """Drain ``child`` for good: it leaves ``children`` (no longer watched nor restarted)
        and gets SIGTERM (it drains); ``has_retired`` says when it has exited."""
        self.children.remove(child)
        self.retiring.append(child)
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)

    def has_retired(self, child: Child, kill: bool = False) -> bool:
        """Whether retired ``child`` has exited (with ``kill``: SIGKILL first, for a drain that
        took too long); once it has, what is left of its group is killed, the leftovers of dead
        processes removed and it leaves ``retiring``."""
        if kill:
            _signal_group(child.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(5)
        if child.process.poll() is None or child not in self.retiring:
            return child.process.poll() is not None
        self.retiring.remove(child)
        _signal_group(child.process.pid, signal.SIGKILL)
        cleanup_orphans()
        cleanup_leftovers()
        return True

    def reap_dead(self) -> list[Child]:
        """Children that exited since the last call: each is waited for, what is left of its
        process group (vLLM's engine core) is killed, and dead processes' shared memory and
        engine socket folders are removed (``shm_orphans``, ``shm_leftovers``,
        ``rpc_leftovers``). Each dead child is returned once."""
        dead = [c for c in self.children if not c.is_reported and c.process.poll() is not None]
        for child in dead:
            child.is_reported = True
            _signal_group(child.process.pid, signal.SIGKILL)
        if dead:
            cleanup_orphans()
            cleanup_leftovers()
            cleanup_rpc_dirs()
        return dead

    async def wait_healthy(self, child: Child, timeout_s: float) -> None:
        """Wait for ``child`` to report SERVING; fail early if it exits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if child.process.poll() is not None:
                child.is_reported = True
                raise RuntimeError(f"{child.describe_exit()}; last log lines:\n{tail(child.log)}")
            try:
                await wait_for_health(child.endpoint, timeout_s=2.0, tls=child.tls)
                return
            except Exception:  # noqa: BLE001 - keep polling until the deadline
                continue
        raise RuntimeError(f"{child.name} not healthy after {timeout_s:.0f}s; log {child.log}")

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM every child (dependants first), wave by wave (``Child.stop_wave``: the
        embedding store's holder after the encoders, its master last), SIGKILL what is left of
        a process group once ``grace_s`` in all ran out; returns once every group is empty
        (vLLM's engine cores included) and the shared memory of dead processes (a child killed
        with SIGKILL left its own) is removed."""
        everyone = [*self.children, *self.retiring]
        deadline = time.monotonic() + grace_s
        for wave in sorted({child.stop_wave for child in everyone}):
            _stop_wave([child for child in everyone if child.stop_wave == wave], deadline)
        self.children.clear()
        self.retiring.clear()
        cleanup_orphans()
        cleanup_leftovers()
        cleanup_rpc_dirs()


def _stop_wave(children: list[Child], deadline: float) -> None:
    """SIGTERM ``children`` (the last started first) and wait for each process group to empty,
    SIGKILL what is left of it at ``deadline``."""
    for child in reversed(children):
        if child.process.poll() is None:
            # NOTE: the child alone: it stops its own processes. vLLM's EngineCore takes a
            # second SIGTERM (from a signal to the whole group) as "exit now", mid-teardown,
            # and Python's resource_tracker then reported its leaked semaphore/shared memory.
            child.process.send_signal(signal.SIGTERM)
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.process.wait(max(0.0, deadline - time.monotonic()))
        while _group_alive(child.process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal_group(child.process.pid, signal.SIGKILL)
        child.process.wait()
        settle = time.monotonic() + 5.0  # NOTE: bounded: unreaped zombies still answer
        while _group_alive(child.process.pid) and time.monotonic() < settle:
            time.sleep(0.05)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is still running (zombies of others aside)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def tail(path: Path, lines: int = 15) -> str:
    """The last lines of a log file."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


async def start_topology(
    deployment: Deployment,
    model_dir: Path,
    model_id: str,
    topology: Topology,
    entry: PublicEntry | None = None,
) -> Child:
    """Start the scheduler, then the workers of ``topology`` in parallel (engines take ~35 s),
    then the route once they are all healthy. Ports (``client.topology``): route BASE,
    scheduler +1, prefill +2, decode +3, encoders +4.., OpenAI HTTP +10, the other engine
    replicas (prefill1.., then decode1..) +11.., metrics +20 plus each offset. The route listens
    as ``entry`` says (default: on loopback, plaintext), the others on loopback
    (``INTERNAL_SERVER_ARGS``). Returns the route."""
    store = _start_store(deployment, topology)
    scheduler = _start_scheduler(deployment, topology)
    await deployment.wait_healthy(scheduler, 60)
    shared = ["--model", str(model_dir), "--model-id", model_id, "--scheduler", scheduler.endpoint]
    engine = [*INTERNAL_SERVER_ARGS, *shared, *topology.engine_args()]
    workers = [
        _start_engine(deployment, topology, worker, engine) for worker in topology.engine_workers
    ]
    encoder = [*INTERNAL_SERVER_ARGS, *shared, *(await store.ready_args() if store else [])]
    deployment.encoders = EncoderSlots(deployment, topology, encoder)
    workers += [deployment.encoders.start(slot) for slot in topology.initial_encoders]
    await asyncio.gather(
        *(deployment.wait_healthy(w, 120 if w.name.startswith("encode") else 400) for w in workers)
    )
    route = _start_route(deployment, topology, entry or PublicEntry(), shared)
    await deployment.wait_healthy(route, 60)
    return route


def _start_store(deployment: Deployment, topology: Topology) -> StartedStore | None:
    """With ``--embedding-store mooncake``, the Mooncake master, started first (so that it
    stops last; its holder starts once it serves); RuntimeError when Mooncake is not
    installed."""
    if topology.embedding_store != MOONCAKE:
        return None
    # NOTE: store_service builds on this module's Deployment.
    from epd.launch.store_service import start_store

    try:
        return start_store(deployment, topology.store_segment_mb)
    except ValueError as e:
        raise RuntimeError(str(e)) from e


def _start_scheduler(deployment: Deployment, topology: Topology) -> Child:
    policy = ["--default-policy", topology.policy, *topology.scheduler_flags]
    if topology.split_ratio:
        policy += ["--split-ratio", topology.split_ratio]
    pins = topology.cpu_args("scheduler")
    return deployment.start(
        "scheduler", SCHEDULER_OFFSET, "scheduler", *INTERNAL_SERVER_ARGS, *policy, *pins
    )


@dataclass(frozen=True, slots=True)
class EncoderSlots:
    """Starts the encoder of any slot of ``topology`` (``encodeN``: its name, worker id, port
    offset and CPUs), with the flags every encoder shares; the autoscaler starts them later."""

    deployment: Deployment
    topology: Topology
    shared: list[str]

    def start(self, slot: int) -> Child:
        """Start encoder ``slot`` (not waiting for it to be healthy)."""
        name = f"encode{slot}"
        return self.deployment.start(
            name,
            ENCODER_OFFSET + slot,
            "encode",
            *self.shared,
            "--worker-id",
            name,
            *self.topology.encoder_args(slot),
            *self.topology.cpu_args(name),
        )


def _start_route(
    deployment: Deployment, topology: Topology, entry: PublicEntry, shared: list[str]
) -> Child:
    """The route, listening as ``entry`` says, with OpenAI HTTP when ``topology.http``."""
    http = ["--http-port", str(deployment.port(HTTP_OFFSET))] if topology.http else []
    route = deployment.start(
        "route",
        ROUTE_OFFSET,
        "route",
        *entry.route_args(),
        *shared,
        *http,
        *topology.route_flags,
        *topology.cpu_args("route"),
        env=entry.route_env(),
    )
    route.http_port = int(http[1]) if http else None
    route.host, route.tls = entry.dial_host, TlsFiles(ca_file=entry.ca_file)
    return route


def _start_engine(
    deployment: Deployment, topology: Topology, worker: EngineWorker, engine: list[str]
) -> Child:
    is_prefill = worker.command == "prefill"
    role = [*PREFILL_MODES[topology.name], "--engine", topology.engine] if is_prefill else []
    return deployment.start(
        worker.name,
        worker.offset,
        worker.command,
        *engine,
        "--worker-id",
        worker.worker_id,
        *role,
        *topology.cpu_args(worker.name),
        tail=topology.engine_tail(),
    )
