#!/usr/bin/env bash
# Run the route: the public RouteService (Generate, ListModels) and, with --http-port, the
# OpenAI-compatible HTTP API (/v1/chat/completions, /v1/models, /health).
#
#   scripts/route.sh --model DIR --scheduler HOST:PORT [FLAGS]   # all flags: scripts/route.sh --help
#
# Main flags (environment fallbacks in parentheses):
#   --model DIR            tokenizer, chat template and processor settings of the served model
#   --model-id NAME        model name the workers registered (default: the directory name)
#   --scheduler HOST:PORT  (EPD_SCHEDULER, default 127.0.0.1:50051)
#   --http-port N          (EPD_HTTP_PORT; 0 = a free port; default: no HTTP)
#   --host/--port          (EPD_HOST/EPD_PORT, default 127.0.0.1:50050), --auth-token, --tls-*,
#   --media-max-mb, --media-max-pixels, --allow-private-networks, --allow-local-files (image rules)
#   --trace-exporter none|console|otlp-grpc[=EP]|otlp-http[=EP]|json:PATH (EPD_TRACE_EXPORTER)
# The topology (E/P/D, E/PD, EP/D, EPD) follows from the workers registered with the scheduler.
# Health is SERVING once listening; SIGTERM drains in-flight requests.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec "${EPD_VENV:-$ROOT/.venv}/bin/epd" route "$@"
