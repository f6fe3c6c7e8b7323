"""The ports ``epd up`` gives its services, from ``--base-port`` BASE (no I/O).

Route BASE, scheduler +1, the first prefill worker +2, the first decode worker +3, encoders
+4..+9, OpenAI HTTP +10, then the other engine replicas from +11 (``prefill1..``, then
``decode1..``), and each service's Prometheus metrics at +20 plus its own offset.
``Topology.port_offsets`` lists a deployment's; ``topology.check_ports`` refuses a combination
where two would meet.
"""

from __future__ import annotations

from dataclasses import dataclass

ROUTE_OFFSET = 0
SCHEDULER_OFFSET = 1
PREFILL_OFFSET = 2
DECODE_OFFSET = 3
ENCODER_OFFSET = 4
HTTP_OFFSET = 10
REPLICA_OFFSET = 11
METRICS_OFFSET = 20
# epd up's own metrics (the autoscaler's), after every service's.
LAUNCHER_METRICS_OFFSET = 40


@dataclass(frozen=True, slots=True)
class EngineWorker:
    """One engine worker to start: ``name`` of its service (log, ``--cpus``, endpoints file),
    ``worker_id`` it registers as, ``command`` (``prefill`` or ``decode``), port ``offset``."""

    name: str
    worker_id: str
    command: str
    offset: int


def engine_workers(num_prefill: int, num_decode: int) -> list[EngineWorker]:
    """``prefill`` (worker ``prefill0``), ``prefill1``.., then ``decode`` (``decode0``),
    ``decode1``..: the first of each at its own offset, the others in the replicas' block."""
    prefill = [_replica("prefill", i, PREFILL_OFFSET, REPLICA_OFFSET) for i in range(num_prefill)]
    after = REPLICA_OFFSET + num_prefill - 1
    return prefill + [_replica("decode", i, DECODE_OFFSET, after) for i in range(num_decode)]


def _replica(command: str, index: int, first_offset: int, block_start: int) -> EngineWorker:
    if index == 0:
        return EngineWorker(command, f"{command}0", command, first_offset)
    return EngineWorker(f"{command}{index}", f"{command}{index}", command, block_start + index - 1)
