"""How an engine's vLLM processes are started and stopped: the environment vLLM reads while an
engine is created (the EngineCore process inherits it), the NIXL handshake port, and the ZMQ
context vLLM's shutdown leaves behind. The one module besides the cli modules that sets
environment variables: around an engine's creation, restored after."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from epd.common.cpus import allowed_cpus, pin_threads
from epd.server.engine.device import device_type
from epd.server.engine.vllm_inputs import SIDE_CHANNEL_ENV_LOCK
from epd.server.engine.vllm_options import VllmOptions
from epd.server.engine.vllm_stats import LoadTracker

logger = logging.getLogger(__name__)


def side_channel_port(host: str, attempts: int = 64) -> int:
    """A free port for vLLM's NIXL handshake listener, below the kernel's ephemeral range.

    The listener binds seconds after the port is chosen, inside the EngineCore; a port from the
    ephemeral range (what binding port 0 gives) can be taken meanwhile by any outgoing connection
    or by another engine's ZMQ and gloo sockets, and then vLLM's listener thread dies and the
    engine start waits for it forever (seen with prefill and decode starting together).
    """
    low = _ephemeral_low()
    for _ in range(attempts):
        port = random.randrange(EPHEMERAL_FLOOR, low)
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {EPHEMERAL_FLOOR}-{low - 1} on {host}")


EPHEMERAL_FLOOR = 20000


def _ephemeral_low() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return max(low, EPHEMERAL_FLOOR + 1000)


def destroy_zmq_context(llm: Any) -> None:
    """Destroy the ZMQ context of ``llm``'s EngineCore client: vLLM 0.32's shutdown closes the
    client's sockets but leaves their context to the garbage collector, which warns about it
    (``ResourceWarning: Unclosed context``). The in-process client (KV transfer) has none."""
    resources = getattr(getattr(llm, "engine_core", None), "resources", None)
    context = getattr(resources, "ctx", None)
    if context is not None:
        context.destroy(linger=0)


def create_llm(args: Any, options: VllmOptions, tracker: LoadTracker, rpc_dir: Path) -> Any:
    """An AsyncLLM as ``options`` say whose ZMQ ipc sockets (its own and its EngineCore's) live
    in ``rpc_dir``."""
    from vllm.v1.engine.async_llm import AsyncLLM

    on_cpu = device_type(options.device) == "cpu"
    cpus, threads = model_cpus(options.cpu_threads, kv=bool(options.kv_role)) if on_cpu else ([], 0)
    with SIDE_CHANNEL_ENV_LOCK, environment(engine_environment(options, rpc_dir, threads)):
        llm = AsyncLLM.from_engine_args(args, stat_loggers=[tracker.factory])
    if on_cpu:
        keep_on_cpus(engine_core_pids(llm), cpus)
    return llm


def engine_core_pids(llm: Any) -> list[int]:
    """Process ids of ``llm``'s EngineCore processes (none for an in-process client)."""
    resources = getattr(getattr(llm, "engine_core", None), "resources", None)
    manager = getattr(resources, "engine_manager", None)
    return [process.pid for process in getattr(manager, "processes", []) if process.pid]


def keep_on_cpus(pids: list[int], cpus: list[int]) -> None:
    """Put every thread of the EngineCore processes ``pids`` back on ``cpus`` (the service's).

    On CPU, vLLM's NIXL connector pins the thread that builds it to the last CPU of each NUMA
    node, to keep KV loads off the cores of vLLM's worker process. With the model in the
    EngineCore that thread is the model's, and every thread started after it (the model's
    other torch threads among them) inherits that one CPU: E/P/D's prefill and decode engines
    both ran on the last core.
    """
    for pid in pids:
        pin_threads(pid, cpus)


def engine_environment(options: VllmOptions, rpc_dir: Path, threads: int = 0) -> dict[str, str]:
    """The variables vLLM reads while an engine is created (its EngineCore process inherits
    them). ``threads``: on CPU, the model's threads (``model_cpus``; 0: ``options.cpu_threads``,
    else every CPU but one)."""
    environ = {"VLLM_RPC_BASE_PATH": str(rpc_dir)}
    if device_type(options.device) == "cpu":
        # NOTE: on CPU the model runs inside the EngineCore process (uni executor). vLLM's CPU
        # default, a worker process fed through a shared-memory queue, busy-polls that queue for
        # a second after every step, and the EngineCore busy-waits for the worker: both spin on
        # cores the encoder, route and engine need (docs/performance.md has the figures).
        # OMP_NUM_THREADS keeps the model's threads where vLLM's worker would have them; set
        # by vLLM's own code it would become 1 (``set_torch_threads_for_runtime``).
        threads = threads or options.cpu_threads or default_cpu_threads()
        environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS=str(threads))
    if options.kv_role:
        environ.update(
            VLLM_NIXL_SIDE_CHANNEL_HOST=options.side_channel.host,
            VLLM_NIXL_SIDE_CHANNEL_PORT=str(options.side_channel.port),
        )
    return environ


def model_cpus(cpu_threads: int | None, *, kv: bool) -> tuple[list[int], int]:
    """(CPUs, thread count) of a CPU engine's model; ``kv``: the engine hands off KV.

    - ``cpu_threads`` given (a pinned service, or an explicit count): this process's CPUs, that
      many threads.
    - ``VLLM_CPU_OMP_THREADS_BIND`` naming CPUs: those, one thread each, as vLLM's worker.
    - vLLM's automatic binding (the default): as many threads as the CPUs it would bind (one per
      physical core of the first NUMA node, less those it reserves), and never more than every
      CPU but one (where vLLM has too few CPUs to reserve any, the EngineCore still needs one:
      it runs the model here), left on this process's CPUs: the services of a shared layout
      time-share every CPU, and an engine pinned beside the others measured slower on 2 cores
      (docs/performance.md).
    - vLLM binding none (``nobind``): this process's CPUs, every one but one.
    """
    if cpu_threads:
        return allowed_cpus(), cpu_threads
    bound, automatic = vllm_bound_cpus(kv=kv)
    if not bound:
        return allowed_cpus(), default_cpu_threads()
    if automatic:
        return allowed_cpus(), min(len(bound), default_cpu_threads())
    return bound, len(bound)


def vllm_bound_cpus(*, kv: bool) -> tuple[list[int], bool]:
    """The CPUs vLLM's CPU worker would bind its model threads to, and whether vLLM chose them
    itself (``OMPProcessManager``: with ``VLLM_CPU_OMP_THREADS_BIND=auto``, one logical CPU
    per physical core of the first allowed NUMA node, less the CPUs it reserves for the
    EngineCore and, with ``kv``, for NIXL) or the variable named them. No CPUs where vLLM binds
    none (``nobind``) or cannot say.

    vLLM applies this only in its multiprocess executor, which epd does not use on CPU (the
    model runs in the EngineCore), so epd asks the same class for its choice.
    """
    config = SimpleNamespace(
        parallel_config=SimpleNamespace(
            local_world_size=1, data_parallel_rank_local=None, _api_process_count=1
        ),
        kv_transfer_config=object() if kv else None,
    )
    try:
        from vllm.utils.ompmultiprocessing import OMPProcessManager

        manager = OMPProcessManager(config)  # type: ignore[arg-type]
    except (AssertionError, AttributeError, ImportError, OSError, RuntimeError, ValueError) as e:
        logger.warning("vLLM's CPU thread binding is unavailable (%s); using every CPU but one", e)
        return [], False
    if manager.skip_setup or not manager.cpu_lists:
        return [], False
    return sorted(manager.cpu_lists[0]), bool(manager.auto_setup)


def default_cpu_threads() -> int:
    """Torch threads of a CPU engine by default: every CPU this process may use but one."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in os.environ for the block (hold SIDE_CHANNEL_ENV_LOCK around it)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
