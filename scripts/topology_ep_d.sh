#!/usr/bin/env bash
# Start a local EP/D: scheduler, encode_prefill worker handing KV to a decode worker, route
# as child processes of one launcher (epd up --topology ep-d --keep): each service waits for what
# it needs to be healthy, engines start in parallel, every endpoint is printed, Ctrl-C or SIGTERM
# stops every child. Logs and spans (JSON lines) go to .epd/run/TIMESTAMP/.
#
#   scripts/topology_ep_d.sh [--model DIR] [--base-port N] [--default-policy P] [--encoders N] [--no-demo]
#
# Ports: --base-port N puts the route on N, scheduler N+1, prefill N+2, decode N+3, encoders
# N+4.., OpenAI HTTP N+10; without it every service takes a free port. --model defaults to the
# tiny test model (built into .epd/models/tiny if absent). All flags: epd up --help.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec "${EPD_VENV:-$ROOT/.venv}/bin/epd" up --topology ep-d --keep "$@"
