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
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from epd.client.cpu_layout import Service
from epd.client.public_entry import INTERNAL_SERVER_ARGS, LOOPBACK, PublicEntry
from epd.common.advertise import endpoint
from epd.common.channels import wait_for_health
from epd.common.cpus import format_cpu_list
from epd.server.transfer.shm_leftovers import cleanup_leftovers
from epd.server.transfer.shm_orphans import cleanup_orphans


def free_port() -> int:
    """A port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Child:
    """One running service, reached at ``host`` (with TLS verified by ``tls_ca_file`` when set);
    ``env``: its variables beyond the deployment's."""

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
    tls_ca_file: str | None = None
    env: dict[str, str] = field(default_factory=dict)

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
        ``run_dir/name.log``; with ``metrics``, also ``--metrics-port`` (base port + 20 +
        offset, or a free one). ``tail``: what must end the command (``-- VLLM_ARG ...``);
        ``env``: variables of this child beyond the deployment's."""
        port = self.port(offset)
        command = [sys.executable, "-m", "epd", *args, "--port", str(port)]
        metrics_port = self.port(20 + offset) if self.metrics else None
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

    def reap_dead(self) -> list[Child]:
        """Children that exited since the last call: each is waited for, what is left of its
        process group (vLLM's engine core) is killed, and dead processes' shared memory is
        removed (``shm_orphans``, ``shm_leftovers``). Each dead child is returned once."""
        dead = [c for c in self.children if not c.is_reported and c.process.poll() is not None]
        for child in dead:
            child.is_reported = True
            _signal_group(child.process.pid, signal.SIGKILL)
        if dead:
            cleanup_orphans()
            cleanup_leftovers()
        return dead

    async def wait_healthy(self, child: Child, timeout_s: float) -> None:
        """Wait for ``child`` to report SERVING; fail early if it exits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if child.process.poll() is not None:
                child.is_reported = True
                raise RuntimeError(f"{child.describe_exit()}; last log lines:\n{tail(child.log)}")
            try:
                await wait_for_health(child.endpoint, timeout_s=2.0, tls_ca_file=child.tls_ca_file)
                return
            except Exception:  # noqa: BLE001 - keep polling until the deadline
                continue
        raise RuntimeError(f"{child.name} not healthy after {timeout_s:.0f}s; log {child.log}")

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM every child (dependants first), SIGKILL what is left of its process group
        after ``grace_s``; returns once every group is empty (vLLM's engine cores included) and
        the shared memory of dead processes (a child killed with SIGKILL left its own) is
        removed."""
        for child in reversed(self.children):
            if child.process.poll() is None:
                # NOTE: the child alone: it stops its own processes. vLLM's EngineCore takes a
                # second SIGTERM (from a signal to the whole group) as "exit now", mid-teardown,
                # and Python's resource_tracker then reported its leaked semaphore/shared memory.
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(max(0.0, deadline - time.monotonic()))
            while _group_alive(child.process.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            _signal_group(child.process.pid, signal.SIGKILL)
            child.process.wait()
            settle = time.monotonic() + 5.0  # NOTE: bounded: unreaped zombies still answer
            while _group_alive(child.process.pid) and time.monotonic() < settle:
                time.sleep(0.05)
        self.children.clear()
        cleanup_orphans()
        cleanup_leftovers()


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


TOPOLOGIES = {
    "epd": "E/P/D: encoder(s), a prefill worker handing KV to a decode worker",
    "e-pd": "E/PD: encoder(s), an aggregated prefill+decode worker",
    "ep-d": "EP/D: a worker that encodes and prefills, handing KV to a decode worker",
    "epd1": "EPD: one worker that encodes, prefills and decodes",
    "dual-encoder": "E/PD with two encoders: one on the accelerator (where there is one), one "
    "on CPU",
}
PREFILL_MODES = {
    "epd": ["--mode", "prefill"],
    "e-pd": ["--mode", "prefill_decode"],
    "ep-d": ["--mode", "encode_prefill", "--kv-transfer"],
    "epd1": ["--mode", "encode_prefill"],
    "dual-encoder": ["--mode", "prefill_decode"],
}
ENGINES = ("auto", "vllm", "transformers")
AUTO_DEVICE = "auto"
CPU_DEVICE = "cpu"
ENCODER_DEVICE = re.compile(r"auto|cpu|(cuda|xpu)(:\d+)?")


@dataclass(frozen=True, slots=True)
class Topology:
    """What ``start_topology`` starts: one of TOPOLOGIES, encoders, policy, engine settings.

    ``kv_cache_mb``: None leaves the KV cache size to the engines (on CUDA: sized from their
    memory share). ``engine_flags``: more flags for every engine worker (prefill, decode).
    ``vllm_args``: vLLM engine arguments in vLLM's spelling, after ``--`` on those workers.
    ``cpus``: (service name, CPU list) of the services to pin (``client.cpu_layout``).
    ``devices``: the device of each encoder, in order (their count follows it); empty: every
    encoder on ``auto`` (the accelerator where there is one, else CPU), and for dual-encoder one
    on ``auto`` and one on CPU.
    """

    name: str = "epd"
    num_encoders: int = 1
    policy: str = "adaptive"
    split_ratio: str = ""
    kv_cache_mb: int | None = 128
    http: bool = True
    encoder_threads: tuple[int, ...] = ()
    engine: str = "auto"
    engine_flags: tuple[str, ...] = ()
    vllm_args: tuple[str, ...] = ()
    cpus: tuple[tuple[str, str], ...] = ()
    devices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.name not in TOPOLOGIES:
            raise ValueError(f"unknown topology {self.name!r}; one of {sorted(TOPOLOGIES)}")
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; one of {', '.join(ENGINES)}")
        if self.engine == "transformers" and self.has_decode:
            raise ValueError(
                f"the transformers engine does not hand KV to decode workers; "
                f"topology {self.name} needs vllm (or use e-pd, epd1, "
                "dual-encoder)"
            )
        if self.devices and self.name in ("ep-d", "epd1"):
            raise ValueError(
                f"topology {self.name} starts no encoder (its worker encodes); encoder devices "
                "apply to epd, e-pd and dual-encoder"
            )
        for device in self.devices:
            if not ENCODER_DEVICE.fullmatch(device):
                raise ValueError(
                    f"encoder device {device!r}: expected auto, cpu, cuda, cuda:N, xpu or xpu:N"
                )
        if any(t < 0 for t in self.encoder_threads):
            raise ValueError("encoder threads must be 0 (torch's default) or more")
        if len(self.encoder_threads) > len(self.encoder_devices):
            raise ValueError(
                f"{len(self.encoder_threads)} encoder thread counts for "
                f"{len(self.encoder_devices)} encoders"
            )

    def encoder_args(self, index: int) -> list[str]:
        """Extra flags of encoder ``index``: its device and, when given, its thread count."""
        flags = ["--device", self.encoder_devices[index]]
        if index < len(self.encoder_threads) and self.encoder_threads[index]:
            flags += ["--threads", str(self.encoder_threads[index])]
        return flags

    @property
    def encoder_devices(self) -> list[str]:
        """Device of each encoder to start (none where the prefill worker encodes)."""
        if self.name in ("ep-d", "epd1"):
            return []
        if self.devices:
            return list(self.devices)
        if self.name == "dual-encoder":
            return [AUTO_DEVICE, CPU_DEVICE]
        return [AUTO_DEVICE] * self.num_encoders

    @property
    def has_decode(self) -> bool:
        """Whether a decode worker is started."""
        return self.name in ("epd", "ep-d")

    @property
    def num_engines(self) -> int:
        """Engine workers started (they share the machine's accelerator)."""
        return 2 if self.has_decode else 1

    def services(
        self, accelerator: bool, engines_on_accelerator: bool | None = None
    ) -> list[Service]:
        """The services ``start_topology`` starts, on a machine with an ``accelerator`` (where
        encoders on ``auto`` go) or not; engines work on it when ``engines_on_accelerator``
        (default: when there is one), encoders when their device is not CPU."""
        engines = ["prefill", "decode"] if self.has_decode else ["prefill"]
        on_accelerator = accelerator if engines_on_accelerator is None else engines_on_accelerator
        encoders = [
            Service(f"encode{i}", device != CPU_DEVICE and (device != AUTO_DEVICE or accelerator))
            for i, device in enumerate(self.encoder_devices)
        ]
        return [
            Service("scheduler"),
            Service("route"),
            *(Service(name, on_accelerator) for name in engines),
            *encoders,
        ]

    def with_cpus(self, plan: dict[str, list[int]]) -> Topology:
        """This topology with the services of ``plan`` pinned to its CPU lists."""
        pins = tuple((name, format_cpu_list(cpus)) for name, cpus in plan.items())
        return replace(self, cpus=pins)

    def cpu_args(self, name: str) -> list[str]:
        """``--cpus LIST`` for service ``name`` when it is pinned."""
        pinned = dict(self.cpus)
        return ["--cpus", pinned[name]] if name in pinned else []

    def engine_args(self) -> list[str]:
        """The engine settings every engine worker gets."""
        size = [] if self.kv_cache_mb is None else ["--kv-cache-mb", str(self.kv_cache_mb)]
        return [*size, *self.engine_flags]

    def engine_tail(self) -> list[str]:
        """What ends every engine worker's command: ``--`` and the vLLM arguments, if any."""
        return ["--", *self.vllm_args] if self.vllm_args else []


async def start_topology(
    deployment: Deployment,
    model_dir: Path,
    model_id: str,
    topology: Topology,
    entry: PublicEntry | None = None,
) -> Child:
    """Start the scheduler, then the workers of ``topology`` in parallel (engines take ~35 s),
    then the route once they are healthy; ports: route BASE, scheduler +1, prefill +2,
    decode +3, encoders +4.., OpenAI HTTP +10. The route listens as ``entry`` says (default:
    on loopback, plaintext), the others on loopback (``INTERNAL_SERVER_ARGS``). Returns the
    route."""
    entry = entry or PublicEntry()
    internal = INTERNAL_SERVER_ARGS
    model = ["--model", str(model_dir), "--model-id", model_id]
    policy = ["--default-policy", topology.policy]
    if topology.split_ratio:
        policy += ["--split-ratio", topology.split_ratio]
    pin = topology.cpu_args
    scheduler = deployment.start("scheduler", 1, "scheduler", *internal, *policy, *pin("scheduler"))
    await deployment.wait_healthy(scheduler, 60)
    registry = ["--scheduler", scheduler.endpoint]
    engine = [*internal, *model, *registry, *topology.engine_args()]
    workers = [
        deployment.start(
            "prefill",
            2,
            "prefill",
            *engine,
            "--worker-id",
            "prefill0",
            *PREFILL_MODES[topology.name],
            "--engine",
            topology.engine,
            *pin("prefill"),
            tail=topology.engine_tail(),
        )
    ]
    if topology.has_decode:
        workers.append(
            deployment.start(
                "decode",
                3,
                "decode",
                *engine,
                "--worker-id",
                "decode0",
                *pin("decode"),
                tail=topology.engine_tail(),
            )
        )
    for i in range(len(topology.encoder_devices)):
        workers.append(
            deployment.start(
                f"encode{i}",
                4 + i,
                "encode",
                *internal,
                *model,
                *registry,
                "--worker-id",
                f"encode{i}",
                *topology.encoder_args(i),
                *pin(f"encode{i}"),
            )
        )
    await asyncio.gather(
        *(deployment.wait_healthy(w, 120 if w.name.startswith("encode") else 400) for w in workers)
    )
    http = ["--http-port", str(deployment.port(10))] if topology.http else []
    route = deployment.start(
        "route",
        0,
        "route",
        *entry.route_args(),
        *model,
        *registry,
        *http,
        *pin("route"),
        env=entry.route_env(),
    )
    route.http_port = int(http[1]) if http else None
    route.host, route.tls_ca_file = entry.dial_host, entry.ca_file
    await deployment.wait_healthy(route, 60)
    return route
