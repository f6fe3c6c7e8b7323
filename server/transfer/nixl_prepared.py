"""Prepared NIXL READs, kept for regions that recur (pooled blocks on both sides).

``initialize_xfer`` validates and resolves both descriptor lists and builds a new request on
every READ (~30 us here, plus ~3 us to release it). For a pair of regions that comes back, the
lists are prepared once (``prep_xfer_dlist``), the READ request is built once from them
(``make_prepped_xfer``) and then reposted with each READ's own notification: ~1 us.

What is kept holds pointers into NIXL's record of the registrations it names, so it is released
before that record goes: a local block's lists and requests before the block is deregistered,
a remote agent's before the agent is removed or its metadata fails to load (NIXL then erases the
agent's whole record). A successful reload keeps existing records as they are (NIXL never
replaces one), so what is kept stays valid across new metadata blobs of the same agent.

A request is taken out while its READ runs and put back after it succeeded (one in flight per
pair: the local block belongs to that READ); if anything was dropped in between, it is released
instead. Not thread-safe by itself: the agent serialises every call under one lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

Region = tuple[int, int, int]
Regions = tuple[Region, ...]
LOCAL = ""  # the agent name of lists of this agent's own receive blocks
ListKey = tuple[str, str, Regions]  # (agent name or LOCAL, memory type, regions)
RequestKey = tuple[str, str, Regions, Regions, bool]  # (agent, memory type, local, remote, notify)


class PreparedReads:
    """Bounded LRU caches of prepared descriptor lists and of READ requests of one agent."""

    def __init__(self, agent: Any, capacity: int = 256) -> None:
        self._agent = agent
        self._capacity = capacity
        self._lists: OrderedDict[ListKey, Any] = OrderedDict()
        self._requests: OrderedDict[RequestKey, Any] = OrderedDict()
        self._epoch = 0

    def take(self, agent_name: str, memory_type: str, local: Regions, remote: Regions,
             notification: bytes) -> tuple[RequestKey, Any, int]:  # fmt: skip
        """A READ request of ``remote`` regions of ``agent_name`` into registered ``local`` ones,
        taken out of the cache or built now: (key, request, epoch) for ``give_back``. Raises what
        NIXL raises for regions it does not know."""
        key = (agent_name, memory_type, local, remote, bool(notification))
        request = self._requests.pop(key, None)
        if request is None:
            indices = list(range(len(local)))
            request = self._agent.make_prepped_xfer(
                "READ", self._list(LOCAL, "DRAM", local), indices,
                self._list(agent_name, memory_type, remote), indices, notification)  # fmt: skip
        return key, request, self._epoch

    def give_back(self, key: RequestKey, request: Any, epoch: int) -> None:
        """Keep a request whose READ succeeded, unless something was dropped since ``take``."""
        if epoch != self._epoch:
            self._agent.release_xfer_handle(request)
            return
        self._requests[key] = request
        if len(self._requests) > self._capacity:
            self._agent.release_xfer_handle(self._requests.popitem(last=False)[1])

    def _list(self, agent_name: str, memory_type: str, regions: Regions) -> Any:
        key = (agent_name, memory_type, regions)
        handle = self._lists.get(key)
        if handle is not None:
            self._lists.move_to_end(key)
            return handle
        handle = self._agent.prep_xfer_dlist(agent_name, list(regions), memory_type)
        self._lists[key] = handle
        if len(self._lists) > self._capacity:
            self._agent.release_dlist_handle(self._lists.popitem(last=False)[1])
        return handle

    def drop_agent(self, agent_name: str) -> int:
        """Release everything that names remote ``agent_name``; returns how many handles."""
        return self._drop(lambda name, local, remote: name == agent_name)

    def drop_local(self, address: int, length: int) -> int:
        """Release everything that names local memory in ``[address, address + length)``."""
        end = address + length
        return self._drop(lambda name, local, remote: any(address <= start < end
                                                          for start, _, _ in local))  # fmt: skip

    def drop_remote(self) -> int:
        """Release everything that names a remote agent (lists of local blocks stay)."""
        return self._drop(lambda name, local, remote: name != LOCAL)

    def _drop(self, matches: Callable[[str, Regions, Regions], bool]) -> int:
        lists = [key for key in self._lists if matches(*_sides(key))]
        requests = [key for key in self._requests if matches(key[0], key[2], key[3])]
        for list_key in lists:
            self._agent.release_dlist_handle(self._lists.pop(list_key))
        for request_key in requests:
            self._agent.release_xfer_handle(self._requests.pop(request_key))
        self._epoch += 1  # NOTE: also when nothing matched: a request may be out, in flight
        return len(lists) + len(requests)

    def __len__(self) -> int:
        return len(self._lists) + len(self._requests)


def _sides(key: ListKey) -> tuple[str, Regions, Regions]:
    """(agent name, local regions, remote regions) of a list's key."""
    name, _, regions = key
    return (name, regions, ()) if name == LOCAL else (name, (), regions)
