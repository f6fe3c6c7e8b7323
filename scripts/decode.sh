#!/usr/bin/env bash
# Run a decode worker on vLLM (AsyncLLM as a KV consumer: it pulls each request's KV cache from
# the prefill worker named in the KvHandle, over NIXL, then streams tokens).
#
#   scripts/decode.sh --model DIR [FLAGS]        # all flags: scripts/decode.sh --help
#
# Main flags (environment fallbacks in parentheses):
#   --model DIR --model-id NAME
#   --scheduler HOST:PORT (EPD_SCHEDULER)  --worker-id ID (EPD_WORKER_ID)  --weight W
#   --max-model-len N  --kv-cache-mb MB  --max-pending N  --dtype float32|bfloat16|float16
#   --kv-host ADDR (EPD_KV_HOST)  --kv-port N (EPD_KV_PORT, 0 = free port): NIXL handshake listener
#   --host/--port (EPD_HOST/EPD_PORT, default 127.0.0.1:50081), --auth-token, --tls-*,
#   --trace-exporter (EPD_TRACE_EXPORTER), --log-level (EPD_LOG_LEVEL)
# Health is NOT_SERVING until the engine is warm; SIGTERM drains, then stops the engine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec "${EPD_VENV:-$ROOT/.venv}/bin/epd" decode "$@"
