#!/usr/bin/env bash
# Run a prefill worker on vLLM (AsyncLLM; its EngineCore runs in a child process).
#
#   scripts/prefill.sh --model DIR [FLAGS]        # all flags: scripts/prefill.sh --help
#
# Main flags (environment fallbacks in parentheses):
#   --model DIR --model-id NAME
#   --mode prefill|prefill_decode|encode_prefill   KV handed to decode (P/D), aggregated PD from
#          embeddings, or aggregated from raw images too; --kv-transfer: encode_prefill also
#          serves Prefill (EP/D)
#   --kv-host ADDR (EPD_KV_HOST)  --kv-port N (EPD_KV_PORT, 0 = free port): NIXL handshake listener
#   --scheduler HOST:PORT (EPD_SCHEDULER)  --worker-id ID (EPD_WORKER_ID)  --weight W
#   --device auto|cpu|cuda (EPD_DEVICE)  --dtype auto|float32|bfloat16|float16 (EPD_DTYPE; auto:
#          bfloat16 on CUDA, float32 on CPU)  --enforce-eager/--no-enforce-eager (EPD_ENFORCE_EAGER;
#          eager on CPU, compiled on CUDA)  --max-model-len N (EPD_MAX_MODEL_LEN)
#   --kv-cache-mb MB (EPD_KV_CACHE_MB; 256 on CPU, on CUDA sized by --gpu-memory-utilization F
#          (EPD_GPU_MEMORY_UTILIZATION))  --tensor-parallel-size N (EPD_TENSOR_PARALLEL_SIZE)
#   --max-num-seqs N (EPD_MAX_NUM_SEQS)  --max-num-batched-tokens N (EPD_MAX_NUM_BATCHED_TOKENS)
#          --max-pending N
#   --host-id ID (EPD_HOST_ID), --shm-mapped-bytes, --nixl-*: data plane (--help)
#   --host/--port (EPD_HOST/EPD_PORT, default 127.0.0.1:50071), --auth-token, --tls-*,
#   --trace-exporter (EPD_TRACE_EXPORTER), --log-level (EPD_LOG_LEVEL), media flags (--help)
# Health is NOT_SERVING until the engine is warm; SIGTERM drains, then stops the engine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec "${EPD_VENV:-$ROOT/.venv}/bin/epd" prefill "$@"
