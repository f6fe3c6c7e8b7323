#!/usr/bin/env bash
# Every GPU check of the encoder tier in one command, for a lent GPU machine (Python 3.12, torch
# with CUDA, no vLLM, no network; ../shared/GPU.md). Budget: under 5 minutes. Steps:
#   1. install the carried wheels (--wheels DIR, default .whl) and this checkout into /tmp/site;
#   2. the CUDA tests (the encoder and the embeddings device) and the suite's encoder tests;
#   3. bench_encode on the GPU for the small preset (fast tower, on one and on two encoder
#      processes sharing the GPU, and transformers' own tower) and a real-size tower (32 x 1280);
#   4. E/PD (transformers engine) with GPU encoders only, CPU only, and GPU + CPU under
#      per_image, per_request (equal split, 8:1 and the split the measured capacities give) and
#      adaptive, each as a share of the ideal (GPU alone + CPU alone) (bench_e2e);
#   5. JPEG decoding, Pillow against torchvision's CPU decoder and nvjpeg: time and whether the
#      pixels equal Pillow's, which the mm_hash is a hash of (bench_jpeg_decode);
#   6. the small tower eager against torch.compile with CUDA graphs (bench_tower_compile).
# Figures go to OUT (default $OUT, else .epd/gpu_check) as JSON files, one per step.
# A step that fails or outlives its share of the budget is reported and the next one runs; the
# exit status is the number of failed steps. --cpu-only runs the same steps on CPU with the tiny
# model and few requests: what CI runs. scripts/gpu_wheels.sh downloads the wheels.
#
#   scripts/gpu_check.sh [--cpu-only] [--wheels DIR] [--out DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CPU_ONLY=0
WHEELS="$ROOT/.whl"
DEST="${OUT:-$ROOT/.epd/gpu_check}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cpu-only) CPU_ONLY=1; shift ;;
    --wheels) WHEELS="$2"; shift 2 ;;
    --out) DEST="$2"; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$DEST"
PYTHON="${PYTHON:-python3}"
step() { printf '\n==> %s\n' "$*"; }
FAILED=0
# Runs "$@" for at most $1 seconds; stdout to $2 (a file under DEST) unless it is "-".
bounded() {
  local seconds=$1 out=$2; shift 2
  local rc=0
  if [[ $out == - ]]; then timeout "$seconds" "$@" || rc=$?; else
    timeout "$seconds" "$@" > "$DEST/$out" || rc=$?; cat "$DEST/$out"; fi
  if [[ $rc != 0 ]]; then echo "gpu_check: FAILED ($rc): $*" >&2; FAILED=$((FAILED + 1)); fi
}

if [[ $CPU_ONLY == 1 ]]; then
  PYTHON="${EPD_VENV:-$ROOT/.venv}/bin/python"
  DEVICE=cpu; GPU=cpu; SMALL=(--preset tiny --images 8); BIG=(); JPEG=(--repeats 2)
  # NOTE: the suite runs every encoder test; here one file shows the step works.
  TESTS=(tests/unit/encode/test_fast_tower.py)
  SYSTEMS="e-pd@cpu,e-pd:per_image@cpu/cpu"
  E2E=(--concurrency 4 --requests 8 --tokens 2 --images 1 --engine transformers)
else
  step "install the carried wheels and this checkout into /tmp/site"
  if [[ -d "$WHEELS" ]]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
      "$WHEELS"/*.whl
  fi
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site \
    --upgrade --ignore-requires-python .
  "$PYTHON" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device here'"
  DEVICE=cuda; GPU=cuda; SMALL=(--preset small --images 64); JPEG=()
  TESTS=(tests/unit/encode tests/unit/media)
  BIG=(--vision-depth 32 --vision-embed-dim 1280 --max-pixels 200704)
  SYSTEMS="e-pd@cuda,e-pd@cpu,e-pd:per_image@cuda/cpu,e-pd:per_request@cuda/cpu,e-pd:adaptive@cuda/cpu"
  E2E=(--concurrency 16 --requests 48 --tokens 8 --images 4)
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [[ $CPU_ONLY == 0 ]]; then
  # NOTE: pytest puts the checkout first on sys.path, where its epd/ folder (stubs only) would
  # shadow the installed package: it is moved aside while this runs.
  mv epd .epd-stubs-aside
  trap 'mv .epd-stubs-aside epd' EXIT
fi

step "encoder tests on $DEVICE"
bounded 120 - "$PYTHON" -m pytest -q -p no:cacheprovider "${TESTS[@]}" -k "not vllm"

step "bench_encode on $DEVICE"
bounded 120 bench_encode_small.json "$PYTHON" scripts/bench_encode.py --device "$DEVICE" \
  "${SMALL[@]}" --encoders 1,2 --json
if [[ $CPU_ONLY == 0 ]]; then  # NOTE: on CPU, auto is transformers' own tower already
  bounded 90 bench_encode_small_stock_tower.json "$PYTHON" scripts/bench_encode.py \
    --device "$DEVICE" "${SMALL[@]}" --vision-attention sdpa --patch-embedding conv --json
fi
if [[ ${#BIG[@]} -gt 0 ]]; then
  big=/tmp/epd-tower-32x1280
  [[ -f $big/config.json ]] || bounded 60 - "$PYTHON" -m epd model tiny --preset small \
    "${BIG[@]}" --out "$big"
  bounded 90 bench_encode_32x1280.json "$PYTHON" scripts/bench_encode.py --device "$DEVICE" \
    --model "$big" --images 32 --json
fi

step "E/PD: encoders on $GPU only, CPU only, both under each policy"
model_args=()
[[ $CPU_ONLY == 1 ]] || model_args=(--model /tmp/epd-small)
if [[ $CPU_ONLY == 0 && ! -f /tmp/epd-small/config.json ]]; then
  bounded 60 - "$PYTHON" -m epd model tiny --preset small --out /tmp/epd-small
fi
bounded 240 bench_e2e.json "$PYTHON" scripts/bench_e2e.py "${model_args[@]}" \
  --systems "$SYSTEMS" "${E2E[@]}" --csv "" --json
if [[ $CPU_ONLY == 0 && -s $DEST/bench_e2e.json ]]; then
  measured=$("$PYTHON" -c "
import json, sys
rows = json.load(open(sys.argv[1]))['rows']
rate = {r['system']: r['req_s'] for r in rows}
print(f\"{max(1, round(rate['e-pd@cuda'] / rate['e-pd@cpu']))}:1\")" "$DEST/bench_e2e.json")
  bounded 60 "bench_e2e_split_${measured/:/to}.json" "$PYTHON" scripts/bench_e2e.py \
    --model /tmp/epd-small --systems "e-pd:per_request@cuda/cpu" --split-ratio "$measured" \
    "${E2E[@]}" --csv "" --json
fi
step "JPEG decoding on $DEVICE against Pillow's"
bounded 60 jpeg_decode.json "$PYTHON" scripts/bench_jpeg_decode.py --device "$DEVICE" \
  "${JPEG[@]}" --json
if [[ $CPU_ONLY == 0 ]]; then  # NOTE: last: the step most likely to outlive its share
  step "the small tower eager against torch.compile (CUDA graphs) at batch 1 and 8"
  bounded 100 tower_compile_small.json "$PYTHON" scripts/bench_tower_compile.py \
    --device "$DEVICE" --preset small --json
fi
step "figures in $DEST; $FAILED step(s) failed"
exit "$FAILED"
