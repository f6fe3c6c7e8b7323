#!/usr/bin/env bash
# Run the scheduler service (worker registry, encoder assignment, prefill/decode choice).
#
#   scripts/scheduler.sh [FLAGS]        # all flags: scripts/scheduler.sh --help
#
# Flags (each has an environment variable fallback):
#   --default-policy per_image|per_request|adaptive   EPD_SCHEDULER_POLICY (default adaptive)
#   --split-ratio ACCELERATOR:CPU, e.g. 8:1           EPD_SPLIT_RATIO (default: worker weights)
#   --ttl-s SECONDS   evict workers silent this long  EPD_SCHEDULER_TTL_S (default 10)
#   --host / --port   listen address                  EPD_HOST (127.0.0.1) / EPD_PORT (50051)
#   --auth-token, --tls-cert, --tls-key, --tls-client-ca, --max-message-mb, --drain-grace-s
#   --trace-exporter none|console|otlp-grpc[=URL]|otlp-http[=URL]|json:PATH   EPD_TRACE_EXPORTER
#   --log-level DEBUG|INFO|WARNING|ERROR              EPD_LOG_LEVEL
# Stops on SIGTERM/SIGINT after draining (health NOT_SERVING first).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec "${EPD_VENV:-$ROOT/.venv}/bin/epd" scheduler "$@"
