"""The encode server's settings: the flags of ``epd encode``, each declared on its field."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from epd.common.flags import flag
from epd.server.encode.fast_tower import ATTENTIONS, PATCH_EMBEDDINGS
from epd.server.encode.vision import DTYPES, PREPROCESS_DEVICES
from epd.server.engine.settings import MODEL_ID_FLAG
from epd.server.media.policy import MediaPolicy
from epd.server.store.base import EMBEDDING_STORES, MOONCAKE, NONE
from epd.server.store.client import (
    STORE_MASTER_FLAG,
    STORE_METADATA_SERVER_FLAG,
    MooncakeSettings,
)
from epd.server.transfer.base import DEFAULT_LEASE_TTL_S
from epd.server.transfer.options import TransferOptions

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
    store_master: str = field(default="", metadata=STORE_MASTER_FLAG)
    store_metadata_server: str = field(default="", metadata=STORE_METADATA_SERVER_FLAG)
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
            "clients' segments, and they leave with the client); 0: none, the values live in "
            "the store's holder (epd store-holder; epd up starts one)"
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
