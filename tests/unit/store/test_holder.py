"""The segment holder against a real master: encoders that lend no segment store into the
holder's, so what one stored outlives it and another reads it; the values leave with the holder.
``epd store-holder`` started as ``epd up`` starts it serves health once joined and leaves on
SIGTERM; bad flags are refused."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest
import torch

from epd.common.channels import wait_for_health
from epd.launch.launcher import Deployment
from epd.launch.store_service import HOLDER_NAME, start_store
from epd.server.encode.cache import CachedEmbedding
from epd.server.store.base import Lookup, Publish
from epd.server.store.client import MooncakeSettings
from epd.server.store.holder import HolderConfig, SegmentHolder
from epd.server.store.mooncake import MooncakeStore
from tests.mooncake import settings_of, skip_without_mooncake

HASH = "00112233445566778899aabbccddeeff"


async def connected(settings: MooncakeSettings) -> MooncakeStore:
    store = MooncakeStore(settings)
    assert await store.wait_connected(30), "the store client did not join the master"
    return store


async def stored_once(store: MooncakeStore, entry: CachedEmbedding) -> None:
    store.publish(HASH, entry)
    for _ in range(500):
        if store.counts.publishes:
            break
        await asyncio.sleep(0.02)
    assert store.counts.publishes == {Publish.STORED: 1}


async def test_what_an_encoder_stored_outlives_it_in_the_holder_and_leaves_with_it(
    tmp_path,
) -> None:
    """The holder runs as ``epd up`` runs it, a process of its own: in this process its segment
    would be freed under a reader's transfer when it leaves."""
    skip_without_mooncake()
    deployment = Deployment(tmp_path, dict(os.environ))
    try:
        store = start_store(deployment, 32)
        await store.ready_args()
        address = store.master.address
        holder = deployment.children[-1]
        original = CachedEmbedding(torch.randn(64, 128), (1, 16, 16))
        writer = await connected(settings_of(address, segment_bytes=0))
        await stored_once(writer, original)
        await writer.close()
        reader = await connected(settings_of(address, segment_bytes=0))
        found = await reader.lookup(HASH)
        holder.process.send_signal(signal.SIGTERM)
        assert holder.process.wait(60) == 0
        gone = await reader.lookup(HASH)
        await reader.close()
    finally:
        deployment.stop(grace_s=10)
    assert found is not None and torch.equal(found.embeddings, original.embeddings)
    assert gone is None
    assert reader.counts.lookups == {Lookup.HIT: 1, Lookup.MISS: 1}


async def test_epd_store_holder_serves_health_once_joined_and_leaves_on_sigterm(
    tmp_path,
) -> None:
    skip_without_mooncake()
    deployment = Deployment(tmp_path, dict(os.environ))
    try:
        store = start_store(deployment, 16)
        args = await store.ready_args()
        holder = deployment.children[-1]
        assert holder.name == HOLDER_NAME
        await wait_for_health(holder.endpoint, timeout_s=5)
        holder.process.send_signal(signal.SIGTERM)
        assert holder.process.wait(60) == 0
    finally:
        deployment.stop(grace_s=10)
    assert args[-2:] == ["--store-segment-mb", "0"]
    log = holder.log.read_text()
    assert "lending 16 MiB to the embedding store" in log
    assert "left the embedding store" in log
    assert "Traceback" not in log


async def test_deployment_stop_lets_the_holder_leave_before_the_master_stops(tmp_path) -> None:
    skip_without_mooncake()
    deployment = Deployment(tmp_path, dict(os.environ))
    try:
        await start_store(deployment, 16).ready_args()
    finally:
        deployment.stop(grace_s=30)
    log = (tmp_path / f"{HOLDER_NAME}.log").read_text()
    assert "left the embedding store" in log
    assert "Failed to unmount" not in log and "Failed to ping master" not in log


async def test_a_holder_closed_before_any_master_answers_stops_at_once() -> None:
    skip_without_mooncake()
    holder = SegmentHolder(HolderConfig("127.0.0.1:1", "http://127.0.0.1:1/metadata").settings("x"))
    assert not await holder.wait_joined(0.5)
    await asyncio.wait_for(holder.close(), 5)
    assert not await holder.wait_joined(5)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--store-metadata-server", "http://h:1/metadata"], "--store-master HOST:PORT"),
        (
            ["--store-master", "h:1", "--store-metadata-server", "u", "--store-segment-mb", "0"],
            "at least 1 MiB",
        ),
    ],
)
def test_bad_flags_are_refused_with_their_reason(flags: list[str], says: str) -> None:
    command = [sys.executable, "-m", "epd", HOLDER_NAME, *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert says in done.stderr and "Traceback" not in done.stderr
