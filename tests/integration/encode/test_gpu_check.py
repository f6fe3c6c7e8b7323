"""``scripts/gpu_check.sh --cpu-only``: the lent GPU machine's one command runs end to end here,
on CPU with the tiny model, and writes every figure it promises (the autoscaling burst, GPU
only, aside)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_gpu_check_runs_on_cpu_and_writes_its_figures(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(ROOT / "scripts" / "gpu_check.sh"), "--cpu-only", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    encode = json.loads((tmp_path / "bench_encode_small.json").read_text())
    for given in ("bytes", "pixels"):
        assert encode[f"service_{given}_vs_direct_b8"] > 0
        assert encode[f"service_{given}_x2_vs_direct_b8"] > 0
        assert encode[f"service_{given}_dynamic_x2_tower_slowdown"] > 0
    assert all(encode[f"{stage}_ms"] > 0 for stage in ("decode", "hash", "preprocess", "tower"))
    jpeg = json.loads((tmp_path / "jpeg_decode.json").read_text())
    assert all(
        row["pillow"]["ms"] > 0 and row["pillow"]["max_difference"] == 0 for row in jpeg["rows"]
    )
    e2e = json.loads((tmp_path / "bench_e2e.json").read_text())
    systems = {row["system"] for row in e2e["rows"]}
    assert systems == {"e-pd@cpu", "e-pd:per_image@cpu/cpu"}
    assert all(row["failed"] == 0 and row["req_s"] > 0 for row in e2e["rows"])
    (mixed,) = [row for row in e2e["rows"] if "/" in row["system"]]
    assert mixed["share_of_ideal"] > 0
    video = json.loads((tmp_path / "bench_e2e_video.json").read_text())
    (clip,) = video["rows"]
    assert (clip["system"], clip["encoders"], clip["chunk_patches"]) == ("e-pd@cpu/cpu", 2, 2)
    assert clip["failed"] == 0 and clip["ttft_p50_ms"] > 0
    assert clip["first_ttft_p50_ms"] > 0 and clip["repeat_ttft_p50_ms"] > 0
    store = json.loads((tmp_path / "bench_store.json").read_text())
    assert store["rows"][0]["encode_ms"] > 0
    assert all(row["put_ms"] > 0 and row["get_ms"] > 0 for row in store["rows"])
    hops = json.loads((tmp_path / "bench_hops.json").read_text())
    assert hops["ttft_ms"] > 0 and "vllm_ttft_ms" not in hops
    calls = {(row["service"], row["rpc"]) for row in hops["hops"]}
    assert {("epd-scheduler", "Place"), ("epd-encode", "Encode")} <= calls
