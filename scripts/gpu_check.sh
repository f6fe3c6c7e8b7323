#!/usr/bin/env bash
# Every GPU check in one command, for a lent GPU machine (Python 3.12, torch with CUDA, no vLLM,
# no network; ../shared/GPU.md). Budget: about 10 minutes. Steps:
#   1. install the carried wheels (--wheels DIR, default .whl) and this checkout into /tmp/site;
#   2. the CUDA tests (the encoder and the embeddings device) and the suite's encoder tests;
#   3. bench_encode on the GPU for the small preset (fast tower, on one and on two encoder
#      processes sharing the GPU, and transformers' own tower) and a real-size tower (32 x 1280);
#   4. E/PD (transformers engine) with GPU encoders only, CPU only, and GPU + CPU under
#      per_image, per_request (equal split, 8:1 and the split the measured capacities give) and
#      adaptive, each as a share of the ideal (GPU alone + CPU alone) (bench_e2e);
#   5. JPEG decoding, Pillow against torchvision's CPU decoder and nvjpeg: time and whether the
#      pixels equal Pillow's, which the mm_hash is a hash of (bench_jpeg_decode);
#   6. the small tower eager against torch.compile with CUDA graphs (bench_tower_compile);
#   7. video: one clip per request through E/PD with one, two and three encoders on the GPU
#      sharing each clip in chunks, and monolithic vLLM given the same frames where vLLM is
#      installed (bench_e2e --video; the engine is vLLM where installed, else transformers,
#      which takes no video yet: without vLLM this step fails);
#   8. the embedding store: put/get of embeddings through a Mooncake master against encoding
#      (bench_store; needs Mooncake: --store-wheels DIR holding its cp312 wheel and the .deb
#      files of libibverbs1 and librdmacm1, which gpu_wheels.sh --store downloads; skipped
#      when Mooncake cannot load);
#   9. autoscaling: a burst then quiet against epd up --encoders 1:3 and fixed counts
#      (bench_autoscale, a shortened burst);
#  10. time to first token at low load, hop by hop, E/PD with the encoder on the GPU, and
#      monolithic vLLM on the same requests where vLLM is installed (bench_hops; issue 43's
#      1.2x target, which this 2-core machine's floor prevents, docs/benchmarks/hops.md).
# Figures go to OUT (default $OUT, else .epd/gpu_check) as JSON files, one per step.
# A step that fails or outlives its share of the budget is reported and the next one runs; the
# exit status is the number of failed steps. --steps 2,3,7 runs only those steps (after step 1):
# all of them take more than one device call's 10 minutes, so a session runs them in two calls
# (--steps 2,3,4,5,6 and --steps 7,8,9,10). --cpu-only runs steps 2-8 and 10 on CPU with the
# tiny model and few requests (step 7 one E/PD with two encoders, on vLLM; step 10 without
# monolithic vLLM): what CI runs.
# scripts/gpu_wheels.sh downloads the wheels.
#
#   scripts/gpu_check.sh [--cpu-only] [--steps LIST] [--wheels DIR] [--store-wheels DIR]
#       [--out DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CPU_ONLY=0
STEPS=""
WHEELS="$ROOT/.whl"
STORE_WHEELS="$ROOT/.whl-store"
DEST="${OUT:-$ROOT/.epd/gpu_check}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cpu-only) CPU_ONLY=1; shift ;;
    --wheels) WHEELS="$2"; shift 2 ;;
    --store-wheels) STORE_WHEELS="$2"; shift 2 ;;
    --out) DEST="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    -h|--help) sed -n '2,37p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$DEST"
PYTHON="${PYTHON:-python3}"
step() { printf '\n==> %s\n' "$*"; }
# Whether step $1 runs (every step unless --steps names some).
want() { [[ -z $STEPS || ",$STEPS," == *",$1,"* ]]; }
# Whether Mooncake's store loads; on the GPU machine, first from STORE_WHEELS (its wheel into
# /tmp/site, its system libraries unpacked from the .deb files into /tmp/store-libs).
store_loads() {
  if [[ $CPU_ONLY == 0 && -d $STORE_WHEELS ]] && ! "$PYTHON" -c "import mooncake.store" 2>/dev/null
  then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
      "$STORE_WHEELS"/*.whl || true
    for deb in "$STORE_WHEELS"/*.deb; do [[ -f $deb ]] && dpkg-deb -x "$deb" /tmp/store-libs; done
    local libs
    libs=$(find /tmp/store-libs -maxdepth 4 -name 'lib*.so.*' -printf '%h\n' 2>/dev/null \
      | sort -u | paste -sd: -)
    [[ -z $libs ]] || export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  "$PYTHON" -c "import mooncake.store" 2>/dev/null
}
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
  VIDEO=(--systems e-pd@cpu/cpu --clip-sizes 160x120 --clip-seconds 4 --concurrency 1
    --requests 2 --repeats 1 --tokens 2)
  STORE=(--repeats 3)
  HOPS=(--requests 5)
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
  VIDEO_SYSTEMS="e-pd@cuda,e-pd@cuda/cuda,e-pd@cuda/cuda/cuda"
  "$PYTHON" -c "import vllm" 2>/dev/null && VIDEO_SYSTEMS+=",vllm"
  VIDEO=(--model /tmp/epd-small --systems "$VIDEO_SYSTEMS" --clip-sizes 640x480
    --concurrency "1,4" --requests 12 --repeats 3 --tokens 8)
  STORE=(--model /tmp/epd-small --repeats 10)
  AUTOSCALE=(--model /tmp/epd-small --max-encoders 3 --concurrency 16 --burst-s 15 --quiet-s 12)
  HOPS=(--model /tmp/epd-small --requests 30)
  "$PYTHON" -c "import vllm" 2>/dev/null && HOPS+=(--vllm)
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [[ $CPU_ONLY == 0 ]]; then
  # NOTE: pytest puts the checkout first on sys.path, where its epd/ folder (stubs only) would
  # shadow the installed package: it is moved aside while this runs.
  mv epd .epd-stubs-aside
  trap 'mv .epd-stubs-aside epd' EXIT
  [[ -f /tmp/epd-small/config.json ]] || bounded 60 - "$PYTHON" -m epd model tiny \
    --preset small --out /tmp/epd-small
fi

if want 2; then
step "encoder tests on $DEVICE"
bounded 120 - "$PYTHON" -m pytest -q -p no:cacheprovider "${TESTS[@]}" -k "not vllm"
fi

if want 3; then
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
fi

if want 4; then
step "E/PD: encoders on $GPU only, CPU only, both under each policy"
model_args=()
[[ $CPU_ONLY == 1 ]] || model_args=(--model /tmp/epd-small)
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
fi

if want 5; then
step "JPEG decoding on $DEVICE against Pillow's"
bounded 60 jpeg_decode.json "$PYTHON" scripts/bench_jpeg_decode.py --device "$DEVICE" \
  "${JPEG[@]}" --json
fi
if [[ $CPU_ONLY == 0 ]] && want 6; then
  step "the small tower eager against torch.compile (CUDA graphs) at batch 1 and 8"
  bounded 100 tower_compile_small.json "$PYTHON" scripts/bench_tower_compile.py \
    --device "$DEVICE" --preset small --json
fi

if want 7; then
step "video: one clip per request over one, two and three encoders (and vLLM given its frames)"
if [[ $CPU_ONLY == 1 ]]; then
  # NOTE: a fresh tiny build: one in .epd/models made before video support has no video clause
  bounded 60 - "$PYTHON" -m epd model tiny --out "$DEST/tiny-video"
  VIDEO+=(--model "$DEST/tiny-video")
fi
bounded 300 bench_e2e_video.json "$PYTHON" scripts/bench_e2e.py --video "${VIDEO[@]}" --json
fi

if want 8; then
step "the embedding store (Mooncake) against encoding"
if store_loads; then
  bounded 90 bench_store.json "$PYTHON" scripts/bench_store.py "${STORE[@]}" --json
else
  echo "gpu_check: SKIPPED: Mooncake does not load here (carry --store-wheels DIR)" >&2
fi
fi

if [[ $CPU_ONLY == 0 ]] && want 9; then
  step "autoscaling encoders: a burst then quiet, 1:3 against fixed counts"
  bounded 240 bench_autoscale.json "$PYTHON" scripts/bench_autoscale.py "${AUTOSCALE[@]}" --json
fi
if want 10; then
step "time to first token at low load, hop by hop (and monolithic vLLM where installed)"
bounded 240 bench_hops.json "$PYTHON" scripts/bench_hops.py "${HOPS[@]}" --json
fi
step "figures in $DEST; $FAILED step(s) failed"
exit "$FAILED"
