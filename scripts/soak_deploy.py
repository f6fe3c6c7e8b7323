"""The deployment side of ``bench_soak.py``: start ``epd up --keep`` as a child process (its
launcher restarts a service that dies) or attach to a running one, find the pid of each service
from the endpoints file the launcher rewrites after each restart, signal one service, read the
memory of each service's process tree, and list /dev/shm."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from process_cpu import process_tree

from epd.common.channels import create_channel
from epd.common.clients import HealthClient
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from epd.v1 import scheduler_service_pb2_grpc as scheduler_grpc

SHM_DIR = Path("/dev/shm")
ROLE_PREFIXES = {
    "encoder": "encode",
    "prefill": "prefill",
    "decode": "decode",
    "scheduler": "scheduler",
    "route": "route",
}


@dataclass
class Served:
    """A deployment under test: its OpenAI base URL and where the launcher writes its
    endpoints (None when attached by ``--url`` alone: no pids, so no kills nor memory)."""

    url: str
    endpoints_file: Path | None
    launcher: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    pids_seen: set[int] = field(default_factory=set)
    shm_mapped: set[str] = field(default_factory=set)
    kills_by_role: dict[str, int] = field(default_factory=dict)

    def pids(self) -> dict[str, int]:
        """Pid of each service now (service name: pid); every pid is remembered in
        ``pids_seen``."""
        if self.endpoints_file is None:
            return {}
        with contextlib.suppress(OSError, ValueError):
            pids: dict[str, int] = json.loads(self.endpoints_file.read_text())["pids"]
            self.pids_seen.update(pids.values())
            return pids
        return {}

    def endpoints(self) -> dict[str, str]:
        """gRPC endpoint of each service now (service name: host:port)."""
        if self.endpoints_file is None:
            return {}
        with contextlib.suppress(OSError, ValueError):
            found = json.loads(self.endpoints_file.read_text())
            return {
                name: endpoint
                for name, endpoint in found.items()
                if name != "http" and isinstance(endpoint, str) and ":" in endpoint
            }
        return {}

    def metrics_urls(self) -> dict[str, str]:
        """Prometheus URL of each service now (service name: URL)."""
        if self.endpoints_file is None:
            return {}
        with contextlib.suppress(OSError, ValueError):
            urls: dict[str, str] = json.loads(self.endpoints_file.read_text()).get("metrics", {})
            return urls
        return {}

    async def is_whole(self, num_workers: int) -> bool:
        """Whether every service answers SERVING and the scheduler lists ``num_workers`` live
        workers: the deployment is as it was before a kill, not merely answering."""
        endpoints = self.endpoints()
        if "scheduler" not in endpoints:
            return False
        for endpoint in endpoints.values():
            async with create_channel(endpoint) as channel:
                if not await HealthClient(channel, endpoint).is_serving(timeout=2):
                    return False
        return await live_workers(endpoints["scheduler"]) >= num_workers

    def kill(self, role: str, signum: int) -> tuple[str, int]:
        """Send ``signum`` to one service of ``role`` (replicas in turn); (service, pid)."""
        names = sorted(n for n in self.pids() if n.startswith(ROLE_PREFIXES[role]))
        if not names:
            raise RuntimeError(f"no {role} service in {self.endpoints_file}")
        turn = self.kills_by_role.get(role, 0)
        self.kills_by_role[role] = turn + 1
        name = names[turn % len(names)]
        pid = self.pids()[name]
        os.kill(pid, signum)
        return name, pid

    def memory(self) -> dict[str, tuple[int, int]]:
        """(pid, RSS bytes summed over its process tree) of each service alive; the pids of the
        trees are remembered in ``pids_seen`` and the /dev/shm names they map in ``shm_mapped``
        (these segments are this deployment's)."""
        found = {}
        for name, pid in self.pids().items():
            tree = process_tree(pid)
            self.pids_seen.update(tree)
            self.shm_mapped.update(shm_mapped_by(tree))
            if rss := tree_rss(tree):  # NOTE: 0 when dead and not restarted yet
                found[name] = (pid, rss)
        return found


def shm_mapped_by(tree: list[int]) -> set[str]:
    """The /dev/shm names the processes of ``tree`` map now (segments, named semaphores)."""
    names = set()
    for process in tree:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{process}/maps").read_text().splitlines():
                path = line.split(maxsplit=5)[-1]
                if path.startswith(f"{SHM_DIR}/"):
                    names.add(path.removeprefix(f"{SHM_DIR}/").removesuffix(" (deleted)"))
    return names


def tree_rss(tree: list[int]) -> int:
    """Resident memory of the processes of ``tree`` (a service and its engine processes)."""
    total = 0
    for process in tree:
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{process}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def shm_names() -> set[str]:
    """Names in /dev/shm now."""
    return set(os.listdir(SHM_DIR))


def ours(names: set[str], pids: set[int], mapped: set[str]) -> set[str]:
    """The names of ``names`` this deployment made: epd segments (``epd-PID-...``) of ``pids``,
    and names its processes were seen mapping (``mapped``). Others may be another program's
    on a shared machine."""
    kept = set()
    for name in names:
        parts = name.split("-")
        is_epd = parts[0] == "epd" and len(parts) > 1 and parts[1].isdigit()
        if name in mapped or (is_epd and int(parts[1]) in pids):
            kept.add(name)
    return kept


def start(up_args: list[str], work_dir: Path, timeout_s: float) -> Served:
    """Start ``epd up --keep --no-demo`` with ``up_args`` in its own session; return once its
    endpoints file is written (every service healthy). RuntimeError with the log's tail when it
    exits first or takes longer than ``timeout_s``."""
    endpoints = work_dir / "endpoints.json"
    log = work_dir / "epd-up.log"
    command = [sys.executable, "-m", "epd", "up", "--keep", "--no-demo"]
    command += ["--endpoints-file", str(endpoints), "--run-dir", str(work_dir / "run"), *up_args]
    with open(log, "wb") as out:
        launcher = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + timeout_s
    while not endpoints.exists():
        if launcher.poll() is not None or time.monotonic() > deadline:
            stop_launcher(launcher)
            raise RuntimeError(f"epd up did not start ({' '.join(command)}):\n{tail(log)}")
        time.sleep(0.5)
    time.sleep(0.2)  # NOTE: the file is written in one call; let it land before reading
    written: dict[str, Any] = json.loads(endpoints.read_text())
    served = Served(str(written["http"]), endpoints, launcher, log)
    served.pids()
    return served


def stop_launcher(launcher: subprocess.Popen[bytes], grace_s: float = 60.0) -> int:
    """SIGTERM ``epd up`` (it stops its deployment), SIGKILL its group after ``grace_s``;
    its exit status."""
    if launcher.poll() is None:
        launcher.send_signal(signal.SIGTERM)
    try:
        return launcher.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        return launcher.wait()


def tail(path: Path, lines: int = 20) -> str:
    """The last lines of a log."""
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"


async def live_workers(scheduler: str) -> int:
    """Live workers the scheduler at ``scheduler`` lists (0 when it cannot be asked)."""
    if not scheduler:
        return 0
    async with create_channel(scheduler) as channel:
        stub = scheduler_grpc.SchedulerServiceStub(channel)
        try:
            listing = await stub.ListWorkers(scheduler_pb.ListWorkersRequest(), timeout=2)
        except grpc.aio.AioRpcError:
            return 0
    return sum(w.state == scheduler_pb.WORKER_STATE_LIVE for w in listing.workers)
