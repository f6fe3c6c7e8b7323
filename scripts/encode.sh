#!/usr/bin/env bash
# Run an encode server: images -> embeddings with the model's vision tower alone.
#
#   scripts/encode.sh --model DIR [FLAGS]        # all flags: scripts/encode.sh --help
#
# Main flags (environment fallbacks in parentheses):
#   --model DIR                 a supported checkpoint; only its vision weights are loaded
#   --device cpu|cuda[:N]|xpu|auto   (EPD_DEVICE, default auto: the accelerator if any)
#   --dtype auto|float32|float16|bfloat16   (auto: bfloat16 on an accelerator, float32 on CPU)
#   --preprocess-threads N --preprocess-device auto|cpu   decode and prepare images beside the tower
#   --vision-attention auto|packed|sdpa|eager   the tower's attention
#   --scheduler HOST:PORT       register and heartbeat there (EPD_SCHEDULER)
#   --worker-id ID --weight W   identity and share in the scheduler (EPD_WORKER_ID)
#   --max-batch-size N --max-batch-wait-ms MS --max-inline-ms MS   dynamic batching across requests
#   --cache-mb MB               encoder cache by mm_hash (0 disables)
#   --transfer auto|shm|nixl|inline  data plane for results (EPD_TRANSFER_KIND); --host-id ID
#                               (EPD_HOST_ID) overrides the host id that decides shm vs nixl/inline
#   --media-max-mb, --media-max-pixels, --media-fetch-timeout-s,
#   --allow-local-files (EPD_ALLOW_LOCAL_FILES=1), --allow-private-networks (EPD_ALLOW_PRIVATE_NETWORKS=1)
#   --host/--port (EPD_HOST/EPD_PORT, default 127.0.0.1:50061), --auth-token, --tls-*,
#   --trace-exporter (EPD_TRACE_EXPORTER), --log-level (EPD_LOG_LEVEL)
# Stops on SIGTERM/SIGINT: health NOT_SERVING, deregisters, finishes in-flight requests.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec "${EPD_VENV:-$ROOT/.venv}/bin/epd" encode "$@"
