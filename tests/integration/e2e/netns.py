"""Two "hosts" on one machine for tests: network namespaces joined by a veth pair.

Each host has its own network namespace (one address on the veth, loopback up), its own
``/dev/shm`` (a folder bind-mounted over it in every process started there) and its own host id
($EPD_HOST_ID), so nothing that only works on one host (shared memory, 127.0.0.1) can pass for
working across hosts. Needs root and ``ip``; ``skip_reason`` says why not when they are missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SUBNET = "10.99.0"
# NOTE: NIXL's agents speak UCX over TCP on the veth alone (no shared memory, no cross-memory
# attach: those would work between the namespaces and hide a cross-host bug); `self` carries an
# agent's READs of its own memory (a consumer in its producer's process).
UCX_ENV = {"UCX_TLS": "tcp,self", "NIXL_LOG_LEVEL": "WARN"}


def skip_reason() -> str | None:
    """Why two hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` to create network namespaces"
    return None


@dataclass(frozen=True)
class Host:
    """One namespace: its name, its address on the veth, its veth end and its /dev/shm."""

    namespace: str
    address: str
    device: str
    shm_dir: Path

    @property
    def host_id(self) -> str:
        return f"host-{self.namespace}"

    def command(self, *args: str) -> list[str]:
        """``args`` run in this host: its namespace, its /dev/shm."""
        # NOTE: `ip netns exec` gives each process a mount namespace of its own (a slave of
        # ours), so the bind mount is seen by that process and its children only.
        return [
            "ip",
            "netns",
            "exec",
            self.namespace,
            "sh",
            "-c",
            f'mount --bind {self.shm_dir} /dev/shm && exec "$@"',
            "sh",
            *args,
        ]

    def environment(self) -> dict[str, str]:
        """Our environment plus this host's id and UCX settings."""
        return {
            **os.environ,
            **UCX_ENV,
            "EPD_HOST_ID": self.host_id,
            # NOTE: a link that goes down is found within ~2 s (default 5 s, so ~10 s)
            "EPD_GRPC_KEEPALIVE_S": "1",
            "UCX_NET_DEVICES": self.device,
        }

    def spawn(self, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        """Start ``python args`` here, in a session of its own, its output in ``log``."""
        with open(log, "wb") as out:
            return subprocess.Popen(
                self.command(sys.executable, *args),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,
            )

    def python(self, *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
        """Run ``python args`` here and wait for it."""
        return subprocess.run(
            self.command(sys.executable, *args),
            capture_output=True,
            text=True,
            env=self.environment(),
            timeout=timeout_s,
        )

    def default_routes(self) -> str:
        """This host's IPv4 and IPv6 default routes, as ``ip route`` lists them; empty: none."""
        return "".join(
            subprocess.run(
                ["ip", "-n", self.namespace, *family, "route", "show", "default"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            for family in ([], ["-6"])
        )

    def set_link(self, state: str) -> None:
        """``up`` or ``down`` this host's end of the veth."""
        ip("-n", self.namespace, "link", "set", self.device, state)


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def two_hosts(work_dir: Path) -> Iterator[tuple[Host, Host]]:
    """Hosts a (SUBNET.1) and b (SUBNET.2) joined by a veth pair, with no default route (each
    reaches the other's address on the veth's subnet); deleted on exit."""
    tag = str(os.getpid())
    hosts = tuple(
        Host(f"epd{side}{tag}", f"{SUBNET}.{i}", f"veth{side}{tag}"[:15], work_dir / f"shm-{side}")
        for i, side in ((1, "a"), (2, "b"))
    )
    a, b = hosts
    try:
        for host in hosts:
            ip("netns", "add", host.namespace)
            host.shm_dir.mkdir(mode=0o1777)
        ip(
            "link",
            "add",
            a.device,
            "netns",
            a.namespace,
            "type",
            "veth",
            "peer",
            "name",
            b.device,
            "netns",
            b.namespace,
        )
        for host in hosts:
            ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.device)
            ip("-n", host.namespace, "link", "set", host.device, "up")
            ip("-n", host.namespace, "link", "set", "lo", "up")
        yield a, b
    finally:
        for host in hosts:  # NOTE: deleting a namespace deletes its veth end and the pair
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)
