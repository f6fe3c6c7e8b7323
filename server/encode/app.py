"""Assemble an encode server: vision tower, batcher, caches, data plane, registration."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import setproctitle
import torch
from prometheus_client import CollectorRegistry

from epd.common.advertise import advertised_host
from epd.common.cpus import allowed_cpus
from epd.common.flags import flag
from epd.common.metrics import new_registry
from epd.common.roles import Role
from epd.common.server import ServerOptions, ServiceBinding
from epd.scheduler.convert import held_to_proto
from epd.server.encode.batcher import DynamicBatcher
from epd.server.encode.cache import EmbeddingCache
from epd.server.encode.fast_tower import ATTENTIONS, PATCH_EMBEDDINGS
from epd.server.encode.metrics import EncodeMetrics
from epd.server.encode.servicer import EncodeServicer
from epd.server.encode.vision import DTYPES, PREPROCESS_DEVICES, VisionEncoder
from epd.server.encode.worker import EncodeWorker
from epd.server.engine.settings import MODEL_ID_FLAG
from epd.server.media.grid import ImageGridder
from epd.server.media.hashing import processor_fingerprint
from epd.server.media.loader import MediaLoader
from epd.server.media.metrics import register_media_metrics
from epd.server.media.policy import MediaPolicy
from epd.server.media.video_loader import VideoLoader
from epd.server.media.video_planner import VideoPlanner
from epd.server.store.base import EMBEDDING_STORES, MOONCAKE, NONE, EmbeddingStore, NoStore
from epd.server.store.mooncake import MooncakeSettings, MooncakeStore
from epd.server.transfer.leases import DEFAULT_LEASE_TTL_S
from epd.server.transfer.metrics import register_plane_metrics
from epd.server.transfer.options import TransferOptions
from epd.server.transfer.plane import DataPlane
from epd.server.worker.registration import LoadFn
from epd.server.worker.serve_worker import Named, WorkerApp, WorkerSpec, serve_worker
from epd.v1 import encode_service_pb2_grpc as pb_grpc
from epd.v1 import scheduler_service_pb2 as scheduler_pb

SERVICE_NAME = "epd.v1.EncodeService"
ACCELERATOR_BATCH_SIZE = 8
CPU_MAX_INLINE_MS = 10.0


def non_negative(text: str) -> float:
    """A number of ms, 0 or more (``--max-inline-ms``)."""
    value = float(text)
    if not value >= 0:
        raise ValueError(f"must not be negative, got {text!r}")
    return value


@dataclass
class EncodeConfig:
    """Everything an encode server needs besides network options; the defaults of ``epd
    encode``'s flags (ValueError for a negative size, wait or thread count)."""

    model_dir: Path
    model_id: str = field(default="", metadata=MODEL_ID_FLAG)
    device: str = field(
        default="auto",
        metadata=flag(
            "cpu, cuda, cuda:N, xpu or auto: the accelerator where there is one, else CPU",
            env="EPD_DEVICE",
            old_env="EPD_ENCODER_DEVICE",
        ),
    )
    dtype: str = field(
        default="auto",
        metadata=flag(
            "vision tower dtype",
            choices=("auto", *DTYPES),
            default_means="bfloat16 on an accelerator, float32 on CPU",
        ),
    )
    worker_id: str = ""
    weight: float = 1.0
    # images per tower call at most (0: max_batch_size_for the device)
    max_batch_size: int = field(
        default=0,
        metadata=flag(
            "images per vision-tower call at most",
            default_means=f"{ACCELERATOR_BATCH_SIZE} on an accelerator, 1 on CPU, where a batch "
            "costs its images' sum and only delays the first",
        ),
    )
    max_batch_wait_ms: float = field(
        default=0.0,
        metadata=flag(
            "how long the first image of a batch waits for others",
            env="EPD_MAX_BATCH_WAIT_MS",
            default_means="a batch takes the images already queued, which under load are those "
            "that arrived while the tower ran",
        ),
    )
    cache_mb: float = field(
        default=256.0,
        metadata=flag(
            "encoder cache budget in MiB, held in the memory of --device (GPU memory for a GPU "
            "encoder), 0 disables"
        ),
    )
    media: MediaPolicy = field(default_factory=MediaPolicy)
    scheduler: str | None = None
    transfer_kind: str | None = field(
        default=None,
        metadata=flag(
            "data-plane backend for results, unless a request asks for one",
            env="EPD_TRANSFER_KIND",
            name="transfer",
            choices=("shm", "nixl", "inline"),
            none_word="auto",
            default_means="shm on the same host, nixl to another host when nixl is installed, "
            "else inline",
        ),
    )
    lease_ttl_s: float = field(
        default=DEFAULT_LEASE_TTL_S,
        metadata=flag("seconds an unreleased result is kept"),
    )
    heartbeat_interval_s: float | None = None  # None: a third of the scheduler's lease TTL
    # batches expected within this many ms run on the event loop (None: see max_inline_ms_for)
    max_inline_ms: float | None = field(
        default=None,
        metadata=flag(
            "batches expected to finish within this many ms run on the event loop instead of "
            "the tower's thread, whose hand-off costs more than that on small CPU machines",
            env="EPD_MAX_INLINE_MS",
            type=non_negative,
            none_word="auto",
            default_means=f"{CPU_MAX_INLINE_MS:g} on CPU, 0 on an accelerator; 0: always the "
            "tower's thread",
        ),
    )
    transfer: TransferOptions = field(default_factory=TransferOptions)
    preprocess_threads: int = field(
        default=0,
        metadata=flag(
            "threads that decode images and run the model's image processor, in parallel with "
            "the tower",
            env="EPD_PREPROCESS_THREADS",
            default_means="one per CPU this process may use",
        ),
    )
    preprocess_device: str = field(
        default="auto",
        metadata=flag(
            "where the image processor runs: auto (the tower's device where the processor can "
            "run there: transformers' torchvision backend; else CPU) or cpu",
            choices=PREPROCESS_DEVICES,
        ),
    )
    attention: str = field(
        default="auto",
        metadata=flag(
            "the tower's attention: packed (one SDPA call per run of equally long images or "
            "windows of a batch packed in one sequence), sdpa or eager (transformers' own, per "
            "image or window) or auto: packed on an accelerator where the family's tower packs "
            "images (Qwen), else transformers' default",
            name="vision-attention",
            choices=ATTENTIONS,
        ),
    )
    patch_embedding: str = field(
        default="auto",
        metadata=flag(
            "a patch-embedding convolution whose stride is its kernel (Qwen's) runs as a matrix "
            "product (matmul, as vLLM runs it) or as the convolution (conv); auto: matmul on an "
            "accelerator, conv on CPU",
            choices=PATCH_EMBEDDINGS,
        ),
    )

    embedding_store: str = field(
        default=NONE,
        metadata=flag(
            "the deployment-wide embedding store: none (each encoder's own cache only) or "
            "mooncake (Mooncake Store: looked up before encoding, what is encoded published to "
            "it in the background; a store that is down, full or slow never fails a request)",
            env="EPD_EMBEDDING_STORE",
            choices=EMBEDDING_STORES,
        ),
    )
    store_master: str = field(
        default="",
        metadata=flag(
            "HOST:PORT of the Mooncake master (--embedding-store mooncake)",
            env="EPD_STORE_MASTER",
        ),
    )
    store_metadata_server: str = field(
        default="",
        metadata=flag(
            "URL of Mooncake's HTTP metadata server, e.g. http://HOST:PORT/metadata "
            "(mooncake_master --enable_http_metadata_server serves one)",
            env="EPD_STORE_METADATA_SERVER",
        ),
    )
    store_timeout_ms: float = field(
        default=50.0,
        metadata=flag(
            "a store lookup not answered within this many ms is abandoned and the image encoded",
            env="EPD_STORE_TIMEOUT_MS",
        ),
    )
    store_segment_mb: int = field(
        default=256,
        metadata=flag(
            "MiB of this encoder's host memory lent to the store (Mooncake keeps values in its "
            "clients' segments)"
        ),
    )
    store_buffer_mb: int = field(
        default=64,
        metadata=flag(
            "MiB of the store client's transfer buffer; bounds one image's stored embeddings"
        ),
    )
    store_publish_queue: int = field(
        default=64,
        metadata=flag(
            "encoded images waiting to be published to the store; beyond it they are dropped "
            "(counted)"
        ),
    )

    def __post_init__(self) -> None:
        sizes = (self.max_batch_size, self.max_batch_wait_ms, self.cache_mb)
        if min(sizes) < 0 or (self.max_inline_ms is not None and self.max_inline_ms < 0):
            raise ValueError("batch size, batch wait, inline ms and cache must not be negative")
        if self.preprocess_threads < 0:
            raise ValueError("preprocess threads must be 0 (one per CPU) or more")
        if not self.lease_ttl_s > 0:
            raise ValueError(f"lease TTL must be positive, got {self.lease_ttl_s}")
        if self.embedding_store not in EMBEDDING_STORES:
            raise ValueError(
                f"unknown embedding store {self.embedding_store!r}; one of "
                f"{', '.join(EMBEDDING_STORES)}"
            )
        if self.embedding_store == MOONCAKE:
            self.mooncake_settings()

    def mooncake_settings(self, local_hostname: str = "127.0.0.1") -> MooncakeSettings:
        """The Mooncake client's settings of these flags, joining as ``local_hostname``
        (ValueError for a missing address or a size out of range)."""
        return MooncakeSettings(
            self.store_master,
            self.store_metadata_server,
            local_hostname=local_hostname,
            timeout_s=self.store_timeout_ms / 1000,
            segment_bytes=self.store_segment_mb << 20,
            buffer_bytes=self.store_buffer_mb << 20,
            max_queued=self.store_publish_queue,
        )


EncodeApp = WorkerApp[EncodeWorker]
"""A running encode server (``stop`` drains, stops, frees every payload; ``worker.plane`` holds
them, ``info.device`` is the tower's device)."""


def max_batch_size_for(device_type: str) -> int:
    """Images per tower call by default: several on an accelerator, where a batch of
    ``ACCELERATOR_BATCH_SIZE`` costs a fraction of as many single calls; one on CPU, where a
    tower of real size is compute-bound, a batch costs its images' sum or more, and only delays
    the first image's result."""
    return 1 if device_type == "cpu" else ACCELERATOR_BATCH_SIZE


def max_inline_ms_for(device_type: str) -> float:
    """Batches expected to finish within this many ms run on the event loop by default: on CPU,
    where handing a small batch to the tower's thread and back costs more than running it; never
    on an accelerator, whose tower calls the event loop would wait for."""
    return CPU_MAX_INLINE_MS if device_type == "cpu" else 0.0


def threads_of(config: EncodeConfig) -> tuple[ThreadPoolExecutor, ThreadPoolExecutor]:
    """The preparing pool and the tower's thread. Each preparing thread computes with one torch
    thread (the pool is the parallelism), the tower with as many as the process has (torch's
    default, or ``epd encode --threads``): torch's threads per calling thread, so neither
    oversubscribes the CPUs with the other's."""
    tower_threads = torch.get_num_threads()
    pool = ThreadPoolExecutor(
        config.preprocess_threads or len(allowed_cpus()),
        thread_name_prefix="epd-prepare",
        initializer=_start_thread,
        initargs=("epd-prepare", 1),
    )
    tower = ThreadPoolExecutor(
        1,
        thread_name_prefix="epd-tower",
        initializer=_start_thread,
        initargs=("epd-tower", tower_threads),
    )
    return pool, tower


def _start_thread(name: str, torch_threads: int) -> None:
    """Name the calling pool thread ``name`` for the OS too (``top -H``, ``ps -L``, py-spy; the
    threads torch starts from it inherit the name) and give it ``torch_threads``."""
    setproctitle.setthreadtitle(name)
    # NOTE: torch sets up a thread's threads at its first parallel call, to the number set last
    # by any thread; set up now, so that the number set next is this thread's to keep.
    torch.get_num_threads()
    torch.set_num_threads(torch_threads)


async def build_encode_server(
    config: EncodeConfig, options: ServerOptions | None = None
) -> EncodeApp:
    """Load the vision tower, start serving, register with the scheduler (if any)."""
    options = options or ServerOptions()
    encoder = VisionEncoder(
        config.model_dir,
        device=config.device,
        dtype=config.dtype,
        preprocess_device=config.preprocess_device,
        attention=config.attention,
        patch_embedding=config.patch_embedding,
    )
    host = advertised_host(options.host, options.advertise_host, config.scheduler)
    worker = build_encode_worker(config, encoder, store_host=host)
    binding = ServiceBinding(
        SERVICE_NAME, EncodeServicer(worker), pb_grpc.add_EncodeServiceServicer_to_server
    )
    info = scheduler_pb.WorkerInfo(
        device=str(encoder.device),
        weight=config.weight,
        capacity=worker.batcher.max_items,
        model=worker.model_id,
    )
    spec = WorkerSpec(
        Role.ENCODE,
        worker,
        binding,
        info,
        worker.plane.host_id,
        _load_of(worker),
        scheduler=config.scheduler,
        requested_id=config.worker_id,
        registry=_registry_of(worker) if options.exports_metrics else None,
        # NOTE: a consumer reads the embeddings after Encode returned, and releases them once read.
        drains=worker,
        heartbeat_interval_s=config.heartbeat_interval_s,
        on_named=_naming(worker),
        close=lambda: _close(worker),
        resync=worker.cache.journal.resync,
    )
    return await serve_worker(spec, options)


def build_encode_worker(
    config: EncodeConfig, encoder: VisionEncoder, *, store_host: str = "127.0.0.1"
) -> EncodeWorker:
    """The worker around ``encoder``: its threads, batcher, media loader, data plane (reaping),
    cache and embedding store (joined as ``store_host``, the address the encoder registers),
    unnamed until it serves."""
    model_id = config.model_id or config.model_dir.name
    pool, tower_thread = threads_of(config)
    device_type = encoder.device.type
    inline_ms = config.max_inline_ms
    batcher = DynamicBatcher(
        encoder.run,
        max_items=config.max_batch_size or max_batch_size_for(device_type),
        max_wait_s=config.max_batch_wait_ms / 1000,
        inline_below_s=(max_inline_ms_for(device_type) if inline_ms is None else inline_ms) / 1000,
        executor=tower_thread,
    )
    loader = MediaLoader(
        config.media,
        model_id=model_id,
        processor_fingerprint=processor_fingerprint(config.model_dir),
        executor=pool,
    )
    plane = DataPlane.from_options(
        config.transfer, lease_ttl_s=config.lease_ttl_s, forced_kind=config.transfer_kind
    )
    plane.start_reaper()
    return EncodeWorker(
        batcher,
        encoder.prepare,
        loader,
        plane,
        EmbeddingCache(int(config.cache_mb * (1 << 20))),
        worker_id="",
        model_id=model_id,
        gridder=ImageGridder(config.model_dir),
        pool=pool,
        store=embedding_store(config, store_host),
        prepare_video=encoder.prepare_video,
        videos=VideoLoader(
            VideoPlanner(config.model_dir, model_id), config.media, executor=pool, cache_items=4
        ),
    )


def embedding_store(config: EncodeConfig, local_hostname: str) -> EmbeddingStore:
    """The store ``--embedding-store`` names, connecting in the background; ValueError when
    Mooncake is asked for but cannot be loaded."""
    if config.embedding_store == MOONCAKE:
        return MooncakeStore(config.mooncake_settings(local_hostname))
    return NoStore()


def _registry_of(worker: EncodeWorker) -> CollectorRegistry:
    registry = new_registry()
    EncodeMetrics(worker, registry)
    register_media_metrics(worker.loader, registry)
    register_plane_metrics(worker.plane, registry)
    return registry


def _load_of(worker: EncodeWorker) -> LoadFn:
    def load() -> scheduler_pb.WorkerLoad:
        held = worker.cache.journal.take()
        return scheduler_pb.WorkerLoad(
            queue_depth=worker.batcher.queue_depth,
            num_in_flight=worker.num_in_flight,
            item_latency_ms=worker.batcher.stats.item_latency_ms,
            held_items=None if held is None else held_to_proto(held),
        )

    return load


def _naming(worker: EncodeWorker) -> Named:
    def name(worker_id: str, endpoint: str) -> None:
        worker.worker_id = worker_id
        worker.plane.set_producer_endpoint(endpoint)

    return name


async def _close(worker: EncodeWorker) -> None:
    await worker.close()
    worker.plane.close()
