"""The issue's own measurement: each system driven by vLLM's serving benchmark client
(``vllm.benchmarks.serve``, unchanged), one after the other, with the same arguments.

Systems start as in ``bench_e2e.py`` (``--systems``: epd topologies through ``epd up``'s
launcher, ``vllm`` monolithic, ``vllm-ec`` vLLM's own encoder split). For each system the
client runs ``random-mm`` requests (one random ``--image-size`` picture each, ``--input-len``
prompt and ``--output-len`` output tokens, ``--ignore-eos``, ``--backend openai-chat``) at every
``--rates`` request rate (0: unpaced) under ``--concurrency`` requests at once, a new seed per
level so no picture repeats. It prints TTFT p50, TPOT p50 and requests/s per level from the
client's own result file, and each as a ratio to monolithic vLLM (and to vLLM's split) at the
same level.

    .venv/bin/python scripts/bench_vllm_client.py [--model DIR] [--systems e-pd,epd,vllm]
        [--concurrency 40] [--rates 0,2] [--requests 64] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_e2e import tiny_model_dir
from e2e_serving import log, serving

from epd.launch.cpu_layout import LAYOUTS

BENCH_SERVE = """import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""
FIGURES = ("median_ttft_ms", "median_tpot_ms", "request_throughput", "output_throughput")


def client_command(
    args: argparse.Namespace, base_url: str, model_dir: Path, rate: float, seed: int, out: Path
) -> list[str]:
    """vLLM's benchmark client for one level, its result written to ``out``."""
    side = args.image_size
    return [
        sys.executable,
        "-c",
        BENCH_SERVE,
        "--backend",
        "openai-chat",
        "--base-url",
        base_url.removesuffix("/v1"),
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        "tiny",
        "--tokenizer",
        str(model_dir),
        "--dataset-name",
        "random-mm",
        "--num-prompts",
        str(args.requests),
        "--random-input-len",
        str(args.input_len),
        "--random-output-len",
        str(args.output_len),
        "--ignore-eos",
        "--random-mm-base-items-per-request",
        "1",
        "--random-mm-limit-mm-per-prompt",
        '{"image": 1, "video": 0}',
        "--random-mm-bucket-config",
        f"{{({side}, {side}, 1): 1.0}}",
        "--request-rate",
        str(rate) if rate > 0 else "inf",
        "--max-concurrency",
        str(args.concurrency),
        "--seed",
        str(seed),
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
    ]


async def measure_system(
    system: str, model_dir: Path, run_dir: Path, args: argparse.Namespace, first_seed: int
) -> list[dict[str, Any]]:
    """One row per rate for ``system``: the client's figures from its result file."""
    rows = []
    async with serving(system, model_dir, run_dir, args) as (url, _):
        for level, rate in enumerate(args.rate_list):
            out = run_dir / f"result-{level}.json"
            command = client_command(args, url, model_dir, rate, first_seed + level, out)
            done = await asyncio.to_thread(
                subprocess.run, command, capture_output=True, text=True, timeout=1800
            )
            if done.returncode != 0 or not out.exists():
                print(done.stdout[-2000:] + done.stderr[-2000:], file=sys.stderr)
                raise SystemExit(f"{system}: vLLM's benchmark client failed at rate {rate:g}")
            result = json.loads(out.read_text())
            row = {"system": system, "rate": rate, "concurrency": args.concurrency}
            row |= {"completed": result["completed"], "failed": result["failed"]}
            row |= {name: round(result[name], 2) for name in FIGURES}
            rows.append(row)
            log(args, format_row(row))
    return rows


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's TTFT, TPOT and requests/s as ratios to vllm's and vllm-ec's at its rate."""
    for reference_name, suffix in (("vllm", "vs_vllm"), ("vllm-ec", "vs_vllm_ec")):
        references = {r["rate"]: r for r in rows if r["system"] == reference_name}
        for row in rows:
            reference = references.get(row["rate"])
            if reference is None:
                continue
            for name in ("median_ttft_ms", "median_tpot_ms", "request_throughput"):
                if reference[name]:
                    row[f"{name}_{suffix}"] = round(row[name] / reference[name], 2)


def format_row(row: dict[str, Any]) -> str:
    def times(name: str) -> str:
        value = row.get(name)
        return f"{value:>7.2f}x" if value is not None else f"{'-':>8}"

    rate = f"{row['rate']:g}" if row["rate"] else "max"
    return (
        f"{row['system']:<10}{rate:>5}{row['completed']:>5}{row['failed']:>5}"
        f"{row['median_ttft_ms']:>9.1f}{row['median_tpot_ms']:>9.1f}"
        f"{row['request_throughput']:>8.2f}{row['output_throughput']:>8.1f}"
        f"  {times('median_ttft_ms_vs_vllm')} {times('median_tpot_ms_vs_vllm')}"
        f" {times('request_throughput_vs_vllm')}  {times('median_ttft_ms_vs_vllm_ec')}"
        f" {times('median_tpot_ms_vs_vllm_ec')} {times('request_throughput_vs_vllm_ec')}"
    )


HEADER = (
    f"{'system':<10}{'rate':>5}{'ok':>5}{'fail':>5}{'TTFT p50':>9}{'TPOT p50':>9}{'req/s':>8}"
    f"{'tok/s':>8}  {'TTFT/vllm':>8} {'TPOT/vllm':>8} {'req/s/vllm':>8}  {'TTFT/v-ec':>8}"
    f" {'TPOT/v-ec':>8} {'req/s/v-ec':>8}"
)


async def main(args: argparse.Namespace) -> int:
    model_dir = (args.model or tiny_model_dir()).resolve()
    run_root = Path(tempfile.mkdtemp(prefix="epd-vllm-client-"))
    rows: list[dict[str, Any]] = []
    log(args, HEADER)
    for index, system in enumerate(args.systems.split(",")):
        first_seed = 1000 * (index + 1)
        rows += await measure_system(system, model_dir, run_root / system, args, first_seed)
    add_ratios(rows)
    if args.json:
        print(json.dumps({"model": str(model_dir), "rows": rows}))
    else:
        print(f"\n{args.concurrency} requests at once, ms and requests/s (vLLM's client)")
        print(HEADER)
        for row in rows:
            print(format_row(row))
    return 0 if all(r["failed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="model directory (default: the tiny model)")
    parser.add_argument(
        "--systems", default="e-pd,epd,vllm", help="as bench_e2e.py's (default e-pd,epd,vllm)"
    )
    parser.add_argument("--concurrency", type=int, default=40, help="at most this many at once")
    parser.add_argument("--rates", default="0,2", help="requests/s per level, 0 = unpaced")
    parser.add_argument("--requests", type=int, default=64, help="requests per level")
    parser.add_argument("--input-len", type=int, default=64, help="prompt tokens (default 64)")
    parser.add_argument("--output-len", type=int, default=16, help="output tokens (default 16)")
    parser.add_argument("--image-size", type=int, default=224, help="picture side (default 224)")
    parser.add_argument(
        "--cpu-layout",
        choices=LAYOUTS,
        default="auto",
        help="epd systems: how their services share the CPUs (default auto)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parsed = parser.parse_args()
    parsed.rate_list = [float(part) for part in parsed.rates.split(",") if part.strip()]
    parsed.split_ratio, parsed.encoder_threads = "", ()
    sys.exit(asyncio.run(main(parsed)))
