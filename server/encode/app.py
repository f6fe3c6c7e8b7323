"""Assemble an encode server: vision tower, batcher, caches, data plane, registration."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import setproctitle
import torch
from prometheus_client import CollectorRegistry

from epd.common.advertise import advertised_host
from epd.common.cpus import allowed_cpus
from epd.common.held_items import held_to_proto
from epd.common.metrics import new_registry
from epd.common.roles import Role
from epd.common.server import ServerOptions, ServiceBinding
from epd.server.encode.batcher import DynamicBatcher
from epd.server.encode.cache import EmbeddingCache
from epd.server.encode.config import ACCELERATOR_BATCH_SIZE, CPU_MAX_INLINE_MS, EncodeConfig
from epd.server.encode.metrics import EncodeMetrics
from epd.server.encode.servicer import EncodeServicer
from epd.server.encode.vision import VisionEncoder
from epd.server.encode.worker import EncodeWorker
from epd.server.media.grid import ImageGridder
from epd.server.media.loader import MediaLoader
from epd.server.media.video_loader import VideoLoader
from epd.server.media.video_planner import VideoPlanner
from epd.server.store.base import MOONCAKE, EmbeddingStore, NoStore
from epd.server.store.mooncake import MooncakeStore
from epd.server.transfer.plane import DataPlane
from epd.server.worker.registration import LoadFn
from epd.server.worker.serve_worker import Named, WorkerApp, WorkerSpec, serve_worker
from epd.v1 import encode_service_pb2_grpc as pb_grpc
from epd.v1 import scheduler_service_pb2 as scheduler_pb

__all__ = ["EncodeApp", "EncodeConfig", "build_encode_server", "build_encode_worker"]

SERVICE_NAME = "epd.v1.EncodeService"
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
    loader = MediaLoader.for_model(config.media, config.model_dir, model_id=model_id, executor=pool)
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
    return registry


def _load_of(worker: EncodeWorker) -> LoadFn:
    def load() -> scheduler_pb.WorkerLoad:
        held = worker.cache.journal.take()
        return scheduler_pb.WorkerLoad(
            queue_depth=worker.batcher.queue_depth,
            num_in_flight=worker.num_in_flight,
            item_latency_ms=worker.batcher.stats.item_latency_ms,
            batches_finished=worker.batcher.stats.num_batches,
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
