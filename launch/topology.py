"""What ``epd up`` starts: the topologies, their services, their engine replicas and ports.

``Topology`` holds ``epd up``'s topology flags, each declared on its field, and derives from them
the services to start, their flags and their ports (``ports``: the layout from ``--base-port``;
``encoders``: the encoders' devices and the groups that scale together).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from epd.common.cpus import format_cpu_list
from epd.common.flags import flag
from epd.common.roles import Role
from epd.launch.cpu_layout import Service
from epd.launch.encoders import (
    AUTO_DEVICE,
    CPU_DEVICE,
    ENCODER_DEVICE,
    EncoderGroup,
    EncoderRange,
    encoder_range,
)
from epd.launch.ports import (
    ENCODER_OFFSET,
    HTTP_OFFSET,
    LAUNCHER_METRICS_OFFSET,
    METRICS_OFFSET,
    REPLICA_OFFSET,
    ROUTE_OFFSET,
    SCHEDULER_OFFSET,
    EngineWorker,
    engine_workers,
)
from epd.scheduler.config import DEFAULT_POLICY
from epd.scheduler.model import Policy
from epd.server.store.base import EMBEDDING_STORES, NONE

TOPOLOGIES = {
    "epd": "E/P/D: encoder(s), prefill worker(s) handing KV to decode worker(s)",
    "e-pd": "E/PD: encoder(s), aggregated prefill+decode worker(s)",
    "ep-d": "EP/D: worker(s) that encode and prefill, handing KV to decode worker(s)",
    "epd1": "EPD: worker(s) that encode, prefill and decode",
    "dual-encoder": "E/PD with two encoders: one on the accelerator (where there is one), one "
    "on CPU",
}
PREFILL_MODES = {
    "epd": ["--mode", Role.PREFILL.label],
    "e-pd": ["--mode", Role.PREFILL_DECODE.label],
    "ep-d": ["--mode", Role.ENCODE_PREFILL.label, "--kv-transfer"],
    "epd1": ["--mode", Role.ENCODE_PREFILL.label],
    "dual-encoder": ["--mode", Role.PREFILL_DECODE.label],
}
ENGINES = ("auto", "vllm", "transformers")
# NOTE: the launcher's own choice, not `epd prefill`'s default (epd.server.engine.device's
# CPU_KV_CACHE_MB, 256): it starts several engines (prefill, decode, replicas) on one machine,
# each with a KV cache of this size on CPU.
LAUNCHER_CPU_KV_CACHE_MB = 128


def names(text: str) -> tuple[str, ...]:
    """``"cuda,cuda,cpu"`` -> ("cuda", "cuda", "cpu")."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def counts(text: str) -> tuple[int, ...]:
    """``"2,1"`` -> (2, 1); ValueError names what is wrong."""
    try:
        return tuple(int(part) for part in names(text))
    except ValueError:
        raise ValueError(f"{text!r}: expected integers like 2,1") from None


def at_least_one(text: str) -> int:
    """A whole number of at least 1; ValueError otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise ValueError(f"expected at least 1, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class Topology:
    """What ``start_topology`` starts: one of TOPOLOGIES, encoders, policy, engine settings.

    ``kv_cache_mb``: None leaves the KV cache size to the engines (on CUDA: sized from their
    memory share); ``epd up`` gives None on CUDA, ``LAUNCHER_CPU_KV_CACHE_MB`` on CPU.
    ``engine_flags``: more flags for every engine worker (prefill, decode).
    ``vllm_args``: vLLM engine arguments in vLLM's spelling, after ``--`` on those workers.
    ``scheduler_flags``: more flags for the scheduler (the autoscaling signal's settings).
    ``route_flags``: more flags for the route (its tool and reasoning parsers).
    ``cpus``: (service name, CPU list) of the services to pin (``client.cpu_layout``).
    ``devices``: the device of each encoder, in order (their count follows it); empty: every
    encoder on ``auto`` (the accelerator where there is one, else CPU), and for dual-encoder one
    on ``auto`` and one on CPU. ``num_prefill``: replicas of the prefill-side worker (whatever
    its mode); ``num_decode``: replicas of the decode worker, 1 where there is none.
    """

    name: str = field(
        default="epd",
        metadata=flag(
            "; ".join(f"{name}: {meaning}" for name, meaning in TOPOLOGIES.items()),
            name="topology",
            choices=tuple(sorted(TOPOLOGIES)),
        ),
    )
    num_encoders: EncoderRange = field(
        default=EncoderRange(),
        metadata=flag(
            "number of encoders for epd and e-pd, each on --encoder-devices' default; MIN:MAX "
            "(e.g. 1:3) scales them on the scheduler's signal (per device where "
            "--encoder-devices is given), --scale-up-after-s and --scale-down-after-s apart",
            name="encoders",
            type=encoder_range,
            metavar="N|MIN:MAX",
            default_help="default: 1",
        ),
    )
    policy: str = field(
        default=DEFAULT_POLICY.value,
        metadata=flag(
            "encoder assignment policy when a request names none",
            name="default-policy",
            choices=tuple(policy.value for policy in Policy),
        ),
    )
    split_ratio: str = field(
        default="",
        metadata=flag(
            "ACCELERATOR:CPU shares for per_request, e.g. 8:1", default_help="default: weights"
        ),
    )
    kv_cache_mb: int | None = LAUNCHER_CPU_KV_CACHE_MB
    http: bool = True
    encoder_threads: tuple[int, ...] = field(
        default=(),
        metadata=flag(
            "CPU threads of each encoder in order, e.g. 2,1 makes the second encoder of "
            "dual-encoder the slower one",
            type=counts,
            default_help="default: torch's default",
        ),
    )
    engine: str = field(
        default="auto",
        metadata=flag(
            "prefill workers' engine: vllm, transformers (no vLLM needed; e-pd, epd1 and "
            "dual-encoder only) or auto: vllm when installed",
            choices=ENGINES,
        ),
    )
    engine_flags: tuple[str, ...] = ()
    vllm_args: tuple[str, ...] = ()
    scheduler_flags: tuple[str, ...] = ()
    route_flags: tuple[str, ...] = ()
    cpus: tuple[tuple[str, str], ...] = ()
    devices: tuple[str, ...] = field(
        default=(),
        metadata=flag(
            "the device of each encoder, in order, e.g. cuda,cuda,cpu (the number of encoders "
            "follows the list; several may share one GPU): auto, cpu, cuda, cuda:N, xpu or xpu:N",
            name="encoder-devices",
            type=names,
            metavar="LIST",
            default_help="default: every encoder on auto, the accelerator where there is one, "
            "else CPU; dual-encoder: auto,cpu",
        ),
    )
    num_prefill: int = field(
        default=1,
        metadata=flag(
            "replicas of the prefill-side engine worker (prefill for epd, encode+prefill for "
            "ep-d, prefill+decode for e-pd and dual-encoder, encode+prefill+decode for epd1): "
            "services prefill, prefill1.., worker ids prefill0.., sharing the accelerator; the "
            "scheduler picks among them by cached prefix, then load",
            name="prefill-workers",
            type=at_least_one,
            metavar="N",
        ),
    )
    embedding_store: str = field(
        default=NONE,
        metadata=flag(
            "mooncake: start a Mooncake master (service store-master, on free ports) and a "
            "segment holder lending it memory (service store-holder), and point every encoder "
            "at it, a deployment-wide embedding store whose values outlive encoder restarts; "
            "none: each encoder's own cache only",
            choices=EMBEDDING_STORES,
        ),
    )
    store_segment_mb: int = field(
        default=1024,
        metadata=flag(
            "MiB of host memory the store's holder lends it (--embedding-store mooncake): every "
            "stored embedding lives there",
            type=at_least_one,
            metavar="MIB",
        ),
    )
    num_decode: int = field(
        default=1,
        metadata=flag(
            "replicas of the decode worker of epd and ep-d: services decode, decode1.., worker "
            "ids decode0..",
            name="decode-workers",
            type=at_least_one,
            metavar="N",
        ),
    )

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
        if self.num_prefill < 1 or self.num_decode < 1:
            raise ValueError("prefill and decode workers: at least 1 of each")
        if self.num_decode != 1 and not self.has_decode:
            raise ValueError(
                f"topology {self.name} starts no decode worker (its prefill workers decode); "
                "decode workers apply to epd and ep-d"
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
        if self.embedding_store != NONE and not self.encoder_devices:
            raise ValueError(
                f"topology {self.name} starts no encoder (its worker encodes); an embedding "
                "store applies to epd, e-pd and dual-encoder"
            )
        if any(t < 0 for t in self.encoder_threads):
            raise ValueError("encoder threads must be 0 (torch's default) or more")
        if len(self.encoder_threads) > len(self._group_devices):
            raise ValueError(
                f"{len(self.encoder_threads)} encoder thread counts for "
                f"{len(self._group_devices)} encoders"
            )

    def encoder_args(self, index: int) -> list[str]:
        """Extra flags of encoder ``index`` (a slot): its device and, when given, its thread
        count (``--encoder-threads`` counts per device entry when the encoders scale)."""
        flags = ["--device", self.encoder_devices[index]]
        group = index // self._slots_per_group
        if group < len(self.encoder_threads) and self.encoder_threads[group]:
            flags += ["--threads", str(self.encoder_threads[group])]
        return flags

    @property
    def encoder_devices(self) -> list[str]:
        """Device of each encoder slot, those started later by autoscaling included (none where
        the prefill worker encodes)."""
        return [d for d in self._group_devices for _ in range(self._slots_per_group)]

    @property
    def encoder_groups(self) -> list[EncoderGroup]:
        """The encoders by the group each scales with: one per device entry (every slot of
        ``auto`` without ``--encoder-devices``) when they scale, one per encoder otherwise."""
        size, span = self._slots_per_group, self.num_encoders
        low, high = (span.minimum, span.maximum) if span.scales else (1, 1)
        return [
            EncoderGroup(device, tuple(range(i * size, (i + 1) * size)), low, high)
            for i, device in enumerate(self._group_devices)
        ]

    @property
    def initial_encoders(self) -> list[int]:
        """The slots started with the deployment: each group's first ``minimum``."""
        return [slot for g in self.encoder_groups for slot in g.slots[: g.minimum]]

    @property
    def scales_encoders(self) -> bool:
        """Whether ``--encoders MIN:MAX`` scales encoders (a topology that starts some)."""
        return self.num_encoders.scales and bool(self._group_devices)

    @property
    def _slots_per_group(self) -> int:
        return self.num_encoders.maximum if self.num_encoders.scales else 1

    @property
    def _group_devices(self) -> list[str]:
        """One device per group: the listed devices, dual-encoder's pair, or ``auto`` once per
        encoder (once when they scale)."""
        if self.name in ("ep-d", "epd1"):
            return []
        if self.devices:
            return list(self.devices)
        if self.name == "dual-encoder":
            return [AUTO_DEVICE, CPU_DEVICE]
        return [AUTO_DEVICE] * (1 if self.num_encoders.scales else self.num_encoders.minimum)

    @property
    def has_decode(self) -> bool:
        """Whether decode workers are started."""
        return self.name in ("epd", "ep-d")

    @property
    def engine_workers(self) -> list[EngineWorker]:
        """The engine workers to start: ``prefill`` (worker ``prefill0``), ``prefill1``..,
        then ``decode`` (``decode0``), ``decode1``.. where the topology has decode workers."""
        return engine_workers(self.num_prefill, self.num_decode if self.has_decode else 0)

    @property
    def num_engines(self) -> int:
        """Engine workers started (they share the machine's accelerator)."""
        return len(self.engine_workers)

    def port_offsets(self, metrics: bool = True) -> list[tuple[str, int]]:
        """(what, offset from the base port) of every port the deployment listens on."""
        services = [
            ("route", ROUTE_OFFSET),
            ("scheduler", SCHEDULER_OFFSET),
            *((w.name, w.offset) for w in self.engine_workers),
            *((f"encode{i}", ENCODER_OFFSET + i) for i in range(len(self.encoder_devices))),
        ]
        http = [("OpenAI HTTP", HTTP_OFFSET)] if self.http else []
        scraped = [(f"{n} metrics", METRICS_OFFSET + o) for n, o in services] if metrics else []
        if metrics and self.scales_encoders:
            scraped.append(("launcher metrics", LAUNCHER_METRICS_OFFSET))
        return [*services, *http, *scraped]

    def services(
        self, accelerator: bool, engines_on_accelerator: bool | None = None
    ) -> list[Service]:
        """The services ``start_topology`` starts, on a machine with an ``accelerator`` (where
        encoders on ``auto`` go) or not; engines work on it when ``engines_on_accelerator``
        (default: when there is one), encoders when their device is not CPU."""
        on_accelerator = accelerator if engines_on_accelerator is None else engines_on_accelerator
        encoders = [
            Service(f"encode{i}", device != CPU_DEVICE and (device != AUTO_DEVICE or accelerator))
            for i, device in enumerate(self.encoder_devices)
        ]
        return [
            Service("scheduler"),
            Service("route"),
            *(Service(worker.name, on_accelerator) for worker in self.engine_workers),
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


def check_ports(topology: Topology, metrics: bool) -> None:
    """ValueError when, from a fixed base port, two of ``topology``'s ports would be the same
    (too many encoders or engine replicas for their blocks)."""
    offsets = topology.port_offsets(metrics)
    taken = Counter(offset for _, offset in offsets)
    clashes = [name for name, offset in offsets if taken[offset] > 1]
    if clashes:
        raise ValueError(
            f"--base-port: {' and '.join(clashes[:2])} would share a port (fixed ports fit "
            f"{HTTP_OFFSET - ENCODER_OFFSET} encoders and {METRICS_OFFSET - REPLICA_OFFSET} "
            "engine replicas beyond the first prefill and decode workers; without --base-port "
            "every port is a free one)"
        )
