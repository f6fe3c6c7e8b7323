#!/usr/bin/env bash
# Run a decode worker on vLLM (AsyncLLM as a KV consumer: it pulls each request's KV cache from
# the prefill worker named in the KvHandle, over NIXL, then streams tokens).
#
#   scripts/decode.sh --model DIR [FLAGS]        # all flags: scripts/decode.sh --help
#
# Main flags (environment fallbacks in parentheses):
#   --model DIR --model-id NAME
#   --scheduler HOST:PORT (EPD_SCHEDULER)  --worker-id ID (EPD_WORKER_ID)  --weight W
#   --device auto|cpu|cuda (EPD_DEVICE)  --dtype auto|float32|bfloat16|float16 (EPD_DTYPE; auto:
#          bfloat16 on CUDA, float32 on CPU)  --enforce-eager/--no-enforce-eager (EPD_ENFORCE_EAGER;
#          eager on CPU, compiled on CUDA)  --max-model-len N (EPD_MAX_MODEL_LEN)
#   --kv-cache-mb MB (EPD_KV_CACHE_MB; 256 on CPU, on CUDA sized by --gpu-memory-utilization F
#          (EPD_GPU_MEMORY_UTILIZATION))  --tensor-parallel-size N (EPD_TENSOR_PARALLEL_SIZE)
#   --max-num-seqs N (EPD_MAX_NUM_SEQS)  --max-num-batched-tokens N (EPD_MAX_NUM_BATCHED_TOKENS)
#          --max-pending N
#   --kv-host ADDR (EPD_KV_HOST)  --kv-port N (EPD_KV_PORT, 0 = free port): NIXL handshake listener
#   --host/--port (EPD_HOST/EPD_PORT, default 127.0.0.1:50081), --auth-token, --tls-*,
#   --trace-exporter (EPD_TRACE_EXPORTER), --log-level (EPD_LOG_LEVEL)
# Health is NOT_SERVING until the engine is warm; SIGTERM drains, then stops the engine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec "${EPD_VENV:-$ROOT/.venv}/bin/epd" decode "$@"
