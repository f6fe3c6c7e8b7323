"""NIXL READs and notifications between two real agents in this process: registrations, peers
(new metadata, bad metadata, forgotten peers), typed errors of failed READs, notifications."""

from __future__ import annotations

import mmap
import threading
import time
from collections.abc import Iterator

import pytest
import torch

from epd.common.errors import InvalidArgument, NotFound, Unavailable
from epd.server.transfer import nixl_agent
from epd.server.transfer.nixl_agent import NixlAgent
from epd.server.transfer.options import NixlOptions

pytestmark = pytest.mark.skipif(not nixl_agent.is_available(), reason="nixl is not installed")

SIZE = 4096


class Buffer:
    """An anonymous mapping and its address (kept alive by the test)."""

    def __init__(self, size: int = SIZE) -> None:
        self.memory = mmap.mmap(-1, size)
        self.address = torch.frombuffer(self.memory, dtype=torch.uint8).data_ptr()

    def fill(self, data: bytes) -> None:
        self.memory[: len(data)] = data


class Inbox:
    """Notifications an agent receives (its progress thread delivers them)."""

    def __init__(self, agent: NixlAgent) -> None:
        self.messages: list[bytes] = []
        self._cv = threading.Condition()
        agent.add_listener(self._on)

    def _on(self, peer: str, message: bytes) -> None:
        with self._cv:
            self.messages.append(message)
            self._cv.notify_all()

    def wait_for(self, count: int, timeout_s: float = 5.0) -> list[bytes]:
        with self._cv:
            self._cv.wait_for(lambda: len(self.messages) >= count, timeout_s)
            return list(self.messages)


@pytest.fixture(scope="module")
def agents() -> Iterator[tuple[NixlAgent, NixlAgent]]:
    producer, consumer = NixlAgent("epd-test-producer"), NixlAgent("epd-test-consumer")
    yield producer, consumer
    producer.stop_progress()
    consumer.stop_progress()


@pytest.fixture
def pair(
    agents: tuple[NixlAgent, NixlAgent],
) -> Iterator[tuple[NixlAgent, NixlAgent, Buffer, Buffer]]:
    """A registered remote buffer of the producer, known to the consumer, and a registered local
    one of the consumer; afterwards the consumer holds no registration."""
    producer, consumer = agents
    remote, local = Buffer(), Buffer()
    producer.register(remote.address, SIZE)
    consumer.register(local.address, SIZE)
    consumer.connect(producer.name, producer.metadata(remote.address))
    yield producer, consumer, remote, local
    consumer.deregister(local.address)
    consumer.forget(producer.name)
    producer.deregister(remote.address)
    assert consumer.num_registered_regions == 0


def read(
    consumer: NixlAgent, producer: NixlAgent, local: Buffer, remote: Buffer, length: int
) -> bytes:
    consumer.read([(local.address, length, 0)], [(remote.address, length, 0)], producer.name)
    return bytes(local.memory[:length])


def test_reads_see_the_remote_bytes_of_the_moment(
    pair: tuple[NixlAgent, NixlAgent, Buffer, Buffer],
) -> None:
    producer, consumer, remote, local = pair
    remote.fill(b"first")
    assert read(consumer, producer, local, remote, 5) == b"first"
    remote.fill(b"again")
    assert read(consumer, producer, local, remote, 5) == b"again"


def test_notifications_reach_the_listeners_and_a_dead_peer_is_only_logged(
    pair: tuple[NixlAgent, NixlAgent, Buffer, Buffer], caplog: pytest.LogCaptureFixture
) -> None:
    producer, consumer, remote, local = pair
    inbox = Inbox(producer)
    read(consumer, producer, local, remote, 8)
    consumer.notify("epd-test-nobody", b"lost")  # an agent it never loaded
    consumer.notify(producer.name, b"after the read")
    assert inbox.wait_for(1) == [b"after the read"]
    assert "cannot notify NIXL agent 'epd-test-nobody'" in caplog.text
    time.sleep(0.05)
    assert inbox.wait_for(2, timeout_s=0.05) == [b"after the read"]
    producer.remove_listener(inbox._on)


def test_a_local_region_registered_again_reads_fine(
    pair: tuple[NixlAgent, NixlAgent, Buffer, Buffer],
) -> None:
    producer, consumer, remote, local = pair
    read(consumer, producer, local, remote, 8)
    consumer.deregister(local.address)
    consumer.register(local.address, SIZE)
    remote.fill(b"reborn")
    assert read(consumer, producer, local, remote, 6) == b"reborn"


def test_new_metadata_of_the_same_agent_keeps_its_regions_readable(
    pair: tuple[NixlAgent, NixlAgent, Buffer, Buffer],
) -> None:
    producer, consumer, remote, local = pair
    read(consumer, producer, local, remote, 8)
    other = Buffer()
    producer.register(other.address, SIZE)
    try:
        consumer.connect(producer.name, producer.metadata_of([other.address, remote.address]))
        remote.fill(b"kept")
        assert read(consumer, producer, local, remote, 4) == b"kept"
        other.fill(b"other")
        assert read(consumer, producer, local, other, 5) == b"other"
    finally:
        producer.deregister(other.address)


def test_unknown_region_bad_metadata_and_a_forgotten_peer(
    pair: tuple[NixlAgent, NixlAgent, Buffer, Buffer],
) -> None:
    producer, consumer, remote, local = pair
    read(consumer, producer, local, remote, 8)
    with pytest.raises(NotFound) as caught:
        consumer.read([(local.address, 8, 0)], [(4096, 8, 0)], producer.name)
    assert caught.value.reason == "NIXL_REGION_NOT_FOUND"
    remote.fill(b"after")
    assert read(consumer, producer, local, remote, 5) == b"after"
    with pytest.raises(InvalidArgument) as bad:
        consumer.connect(producer.name, b"not metadata")
    assert bad.value.reason == "NIXL_BAD_METADATA"
    consumer.connect(producer.name, producer.metadata(remote.address))  # loaded again
    assert read(consumer, producer, local, remote, 5) == b"after"
    consumer.forget(producer.name)
    with pytest.raises(NotFound):  # forgotten: its metadata must come again
        read(consumer, producer, local, remote, 5)
    consumer.connect(producer.name, producer.metadata(remote.address))
    assert read(consumer, producer, local, remote, 5) == b"after"


def failing_transfer(error_name: str) -> object:
    """A stand-in for ``nixl_agent.transfer`` that raises NIXL's exception of that name."""
    error = type(error_name, (Exception,), {})

    def transfer(handle: object, notif_msg: bytes = b"") -> str:
        raise error("injected")

    return transfer


def test_a_failed_post_raises_typed_errors_and_forgets_a_failed_peer(
    pair: tuple[NixlAgent, NixlAgent, Buffer, Buffer], monkeypatch: pytest.MonkeyPatch
) -> None:
    producer, consumer, remote, local = pair
    read(consumer, producer, local, remote, 8)
    nixl = consumer._agent
    monkeypatch.setattr(nixl, "transfer", failing_transfer("nixlNotFoundError"))
    with pytest.raises(NotFound) as not_found:
        read(consumer, producer, local, remote, 8)
    assert not_found.value.reason == "NIXL_REGION_NOT_FOUND"
    monkeypatch.setattr(nixl, "transfer", failing_transfer("nixlRemoteDisconnectError"))
    with pytest.raises(Unavailable) as unavailable:
        read(consumer, producer, local, remote, 8)
    assert unavailable.value.reason == "NIXL_TRANSFER_FAILED"
    monkeypatch.undo()
    with pytest.raises(NotFound):  # the peer was forgotten: its metadata must come again
        read(consumer, producer, local, remote, 8)
    consumer.connect(producer.name, producer.metadata(remote.address))
    remote.fill(b"back")
    assert read(consumer, producer, local, remote, 4) == b"back"


def test_agents_take_their_options_nixls_progress_thread_and_peer_error_handling() -> None:
    options = NixlOptions(ucx_error_handling="peer", progress_thread=True)
    producer = NixlAgent("epd-test-options-producer", options)
    consumer = NixlAgent("epd-test-options-consumer", options)
    remote, local = Buffer(), Buffer()
    try:
        assert producer._notifications._thread is None  # NIXL's thread makes progress, not ours
        producer.register(remote.address, SIZE)
        consumer.register(local.address, SIZE)
        consumer.connect(producer.name, producer.metadata(remote.address))
        remote.fill(b"options")
        assert read(consumer, producer, local, remote, 7) == b"options"
        inbox = Inbox(producer)
        consumer.notify(producer.name, b"polled by the caller")
        deadline = time.monotonic() + 5
        while not producer.poll() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert inbox.wait_for(1, timeout_s=0) == [b"polled by the caller"]
    finally:
        consumer.deregister(local.address)
        producer.deregister(remote.address)
        producer.stop_progress()
        consumer.stop_progress()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this build of NIXL may register GPU memory")
def test_gpu_memory_is_refused_by_nixl_without_cuda(agents: tuple[NixlAgent, NixlAgent]) -> None:
    """What the producer's and consumer's fallbacks rest on: NIXL without CUDA refuses to
    register VRAM (they then stage through host memory), and a region shared as host memory is
    not shared again as another memory type."""
    producer, _ = agents
    first = Buffer()
    with pytest.raises(Exception, match="NIXL_ERR_BACKEND"):
        producer.share(first.address, SIZE, "VRAM", 0)
    assert producer.num_registered_regions == 0
    assert producer.share(first.address, SIZE)
    assert not producer.share(first.address, SIZE, "VRAM", 0)
    assert producer.share(first.address, SIZE)
    producer.unshare(first.address)
    producer.unshare(first.address)
    assert producer.num_registered_regions == 0


def test_a_process_with_an_agent_exits_cleanly() -> None:
    """NIXL's wheel bundles libibverbs and libnl; with Debian's ibverbs-providers installed they
    loaded the system's providers and a second libnl, and every process that had started an
    agent segfaulted at exit (scripts/install.sh installs the store's libraries without them)."""
    import subprocess
    import sys

    program = (
        "from epd.server.transfer.nixl_agent import NixlAgent\n"
        "from epd.server.transfer.options import NixlOptions\n"
        "NixlAgent('exit-check', NixlOptions())\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
