"""The engine settings a prefill or decode worker is asked for, as ``epd prefill`` and ``epd
decode`` take them (their flags are generated from these fields, as vLLM's CLI from its
``EngineArgs``).

``auto`` and None leave a setting to the device the engine runs on (``device.defaults_for``):
``engine_cli.engine_options`` and ``transformers_options`` resolve them into the engine's own
options, ``VllmOptions`` or ``TransformersOptions``, whose defaults the other settings take.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from epd.common.flags import flag
from epd.server.engine.device import CPU, CUDA, DEFAULTS, DEVICE_CHOICES, DTYPE_CHOICES
from epd.server.engine.vllm_inputs import MIN_KV_LEASE_S
from epd.server.engine.vllm_options import VllmOptions

_CPU, _CUDA, _VLLM = DEFAULTS[CPU], DEFAULTS[CUDA], VllmOptions()


def _eager(eager: bool) -> str:
    return "eager" if eager else "compiled"


# ``--model-id``, the name clients use for a served model: every service that serves one has it.
MODEL_ID_FLAG = flag(
    "model name clients use",
    default_help="default: the hub id, or the directory name",
    aliases=("served-model-name",),
)


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """One engine's settings before its device is known (ValueError names a flag out of
    range)."""

    model_id: str = field(default="", metadata=MODEL_ID_FLAG)
    device: str = field(
        default="auto",
        metadata=flag(
            "where the engine runs: cuda (the current CUDA device, registered as cuda:N), cpu, "
            "or auto: cuda where usable, else cpu; vLLM runs on the device its build is for "
            "(scripts/install.sh --target)",
            env="EPD_DEVICE",
            choices=DEVICE_CHOICES,
        ),
    )
    dtype: str = field(
        default="auto",
        metadata=flag(
            "model dtype",
            env="EPD_DTYPE",
            choices=DTYPE_CHOICES,
            default_means=f"{_CUDA.dtype} on CUDA, {_CPU.dtype} on CPU",
        ),
    )
    max_model_len: int | None = field(
        default=_VLLM.max_model_len,
        metadata=flag(
            "longest prompt + output in tokens",
            env="EPD_MAX_MODEL_LEN",
            default_help="default: the model's own context (vLLM derives it from the model's "
            "config; the transformers engine reads max_position_embeddings); the KV cache must "
            "hold one request of this length, or the engine does not start",
        ),
    )
    kv_cache_mb: int | None = field(
        default=None,
        metadata=flag(
            "KV cache size in MiB",
            env="EPD_KV_CACHE_MB",
            default_help=f"default {_CPU.kv_cache_mb} on CPU, where vLLM's automatic sizing "
            "fails on small machines; on CUDA vLLM sizes it from --gpu-memory-utilization",
        ),
    )
    gpu_memory_utilization: float = field(
        default=_VLLM.gpu_memory_utilization,
        metadata=flag(
            "share of the GPU's memory this vLLM engine may use, weights and KV cache together; "
            "engines sharing a GPU need shares that add up to less than 1",
            env="EPD_GPU_MEMORY_UTILIZATION",
            default_means="vLLM's; CUDA only",
        ),
    )
    tensor_parallel_size: int = field(
        default=_VLLM.tensor_parallel_size,
        metadata=flag("GPUs the model is split across", env="EPD_TENSOR_PARALLEL_SIZE"),
    )
    max_num_seqs: int | None = field(
        default=None,
        metadata=flag(
            "sequences vLLM runs in one step",
            env="EPD_MAX_NUM_SEQS",
            default_help="default vLLM's for the device",
        ),
    )
    max_num_batched_tokens: int | None = field(
        default=None,
        metadata=flag(
            "tokens vLLM computes in one step, prompt chunks included",
            env="EPD_MAX_NUM_BATCHED_TOKENS",
            default_help="default vLLM's for the device",
        ),
    )
    enforce_eager: bool | None = field(
        default=None,
        metadata=flag(
            "run the model eagerly (--no-enforce-eager: compile it and capture CUDA graphs)",
            env="EPD_ENFORCE_EAGER",
            negatable=True,
            default_help=f"default {_eager(_CPU.enforce_eager)} on CPU, "
            f"{_eager(_CUDA.enforce_eager)} on CUDA",
        ),
    )
    max_pending: int = field(
        default=_VLLM.max_pending_requests,
        metadata=flag("requests admitted at once; more get RESOURCE_EXHAUSTED"),
    )
    cpu_threads: int | None = field(
        default=None,
        metadata=flag(
            "on CPU: the model's threads",
            env="EPD_CPU_THREADS",
            default_help="default for vLLM: as vLLM's CPU worker would bind them, "
            "VLLM_CPU_OMP_THREADS_BIND: a CPU list it names, or one per physical core of the "
            "first NUMA node less those vLLM reserves and at most every CPU but one; for the "
            "transformers engine: the --cpus count when given, else torch's default",
        ),
    )
    kv_host: str = field(
        default=_VLLM.side_channel.host,
        metadata=flag(
            "address of this worker's NIXL KV handshake listener, reachable by its peers",
            env="EPD_KV_HOST",
        ),
    )
    kv_port: int = field(
        default=_VLLM.side_channel.port,
        metadata=flag(
            "port of the NIXL handshake listener", env="EPD_KV_PORT", default_means="a free port"
        ),
    )
    kv_lease_s: int = field(
        default=_VLLM.kv_lease_s,
        metadata=flag(
            "seconds a prefill worker keeps KV blocks no decode worker has read (a request "
            "cancelled between prefill and decode); the same on prefill and decode workers, at "
            f"least {MIN_KV_LEASE_S}",
            env="EPD_KV_LEASE_S",
        ),
    )

    reasoning_parser: str | None = field(
        default=_VLLM.reasoning_parser,
        metadata=flag(
            "vLLM's reasoning parser of the model (deepseek_r1, qwen3, ...), as vllm serve's "
            "flag and the same as the route's: the engine starts a structured output (a JSON "
            "schema, a required or named tool call) after the model's reasoning, and takes "
            "thinking_token_budget; vLLM engine only",
            env="EPD_REASONING_PARSER",
            default_help="default: none",
        ),
    )

    def __post_init__(self) -> None:
        if self.kv_lease_s < MIN_KV_LEASE_S:
            raise ValueError(
                f"--kv-lease-s must be at least {MIN_KV_LEASE_S} (decode workers renew "
                f"the lease every lease/6 s), got {self.kv_lease_s}"
            )
        for name in ("max_pending", "tensor_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        for name in (
            "max_model_len",
            "kv_cache_mb",
            "max_num_seqs",
            "max_num_batched_tokens",
            "cpu_threads",
        ):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("--gpu-memory-utilization must be in (0, 1]")
