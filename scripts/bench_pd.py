"""Prefill/decode benchmark: TTFT and decode tokens/s of E/PD, EPD and E/P/D against monolithic
vLLM with raw images, on the same machine in the same run (ratios to monolithic).

Paths (sequential requests = low load; every request has its own random image, so no cache hits):
- monolithic: AsyncLLM.generate with the decoded image, in-process (vLLM runs the vision tower);
- E/PD: as the route does by default: Encode over gRPC to the encode service (embeddings in
  shared memory), then PrefillDecode with the embeddings' references to a prefill_decode worker
  on a plain vLLM engine (the same engine as monolithic);
- engine from embeddings: the same engine given embeddings the encoder made before the clock
  started (what vLLM itself takes from embeddings: no RPC, no tower);
- EPD: the raw image over gRPC to an encode_prefill worker (same engine);
- E/P/D: Encode -> Prefill (KV producer) -> Decode (KV consumer; KV pulled over NIXL). TTFT is
  when Prefill returns the first token.
Every path but monolithic first loads the image as the route does (decode, mm_hash, grid).
All servers run in this process on loopback (each vLLM EngineCore in its own child process).
Calls go through the clients the route uses: a plain RPC per call on one channel per server.
``--gap-s`` sleeps before each request, so every process starts it idle, as at a low rate.

    .venv/bin/python scripts/bench_pd.py [--presets tiny,small] [--requests N] [--tokens N]
                                         [--no-pd] [--gap-s 0.3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

SIZES = {"tiny": (96, 128), "small": (336, 448)}
Timed = tuple[float, float, int]  # (ttft_s, decode_s, num_tokens)


def png(seed: int, size: tuple[int, int]) -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


async def timed(tokens: AsyncIterator[int], start: float) -> Timed:
    first = last = 0.0
    count = 0
    async for _ in tokens:
        last = time.perf_counter()
        first = first or last
        count += 1
    return first - start, last - first, count


class Bench:
    """Engines and in-process servers of one model preset."""

    def __init__(self, model_dir: Path, num_tokens: int) -> None:
        self.model_dir = model_dir
        self.num_tokens = num_tokens
        self.closers: list[Callable[[], Awaitable[Any]]] = []

    async def start(self, with_pd: bool) -> None:
        from epd.common.channels import create_channel
        from epd.common.clients import DecodeClient, EncoderClient, PrefillClient
        from epd.common.roles import Role
        from epd.server.decode.app import DecodeConfig, build_decode_server
        from epd.server.encode.app import EncodeConfig, build_encode_server
        from epd.server.engine.vllm_engine import VllmEngine
        from epd.server.engine.vllm_options import VllmOptions
        from epd.server.media.grid import ImageGridder
        from epd.server.media.hashing import processor_fingerprint
        from epd.server.media.loader import MediaLoader
        from epd.server.media.policy import MediaPolicy
        from epd.server.prefill.app import PrefillConfig, build_prefill_server

        def options(role: str | None) -> VllmOptions:
            return VllmOptions(kv_role=role, kv_cache_bytes=128 << 20, max_model_len=4096)

        roles = [None, "kv_producer", "kv_consumer"] if with_pd else [None]
        engines = await asyncio.gather(
            *(
                VllmEngine.start(self.model_dir, model_id="m", options=options(role))
                for role in roles
            )
        )
        self.engine = engines[0]
        self.closers += [engine.close for engine in engines]
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)

        async def serve(app: Any, client_class: Any) -> Any:
            self.closers.insert(0, app.stop)
            endpoint = f"127.0.0.1:{app.port}"
            channel = create_channel(endpoint)
            client = client_class(channel, endpoint)
            self.closers.insert(0, channel.close)
            return client

        encoder = await build_encode_server(EncodeConfig(self.model_dir, max_batch_wait_ms=0))
        self.host_id = encoder.worker.plane.host_id
        self.encode = await serve(encoder, EncoderClient)
        self.loader = MediaLoader(
            MediaPolicy(),
            model_id=encoder.worker.model_id,
            processor_fingerprint=processor_fingerprint(self.model_dir),
        )
        self.gridder = ImageGridder(self.model_dir)
        aggregated = await build_prefill_server(PrefillConfig(self.model_dir), self.engine)
        self.plane = aggregated.worker.plane
        self.aggregated = await serve(aggregated, PrefillClient)
        raw_config = PrefillConfig(self.model_dir, mode=Role.ENCODE_PREFILL)
        self.epd = await serve(await build_prefill_server(raw_config, self.engine), PrefillClient)
        if with_pd:
            self.prefill = await serve(
                await build_prefill_server(
                    PrefillConfig(self.model_dir, mode=Role.PREFILL), engines[1]
                ),
                PrefillClient,
            )
            self.decode = await serve(
                await build_decode_server(DecodeConfig(), engines[2]), DecodeClient
            )

    async def close(self) -> None:
        for close in self.closers:
            await close()

    def prompt_ids(self) -> list[int]:
        text = (
            "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>describe the "
            "picture<|im_end|>\n<|im_start|>assistant\n"
        )
        return list(self.tokenizer.encode(text))

    def sampling(self) -> Any:
        from epd.v1 import generation_pb2

        return generation_pb2.SamplingParams(max_tokens=self.num_tokens, ignore_eos=True)

    async def monolithic(self, data: bytes, request_id: str) -> Timed:
        from epd.server.engine.base import EngineImage, Sampling

        start = time.perf_counter()
        image = EngineImage("", image=Image.open(io.BytesIO(data)).convert("RGB"))
        chunks = self.engine.generate(
            request_id,
            self.prompt_ids(),
            [image],
            Sampling(max_tokens=self.num_tokens, ignore_eos=True),
        )
        return await timed((t async for c in chunks for t in c.token_ids), start)

    async def loaded(self, data: bytes) -> Any:
        """The image as the route loads it: a MediaItem with its mm_hash, and its grid."""
        from epd.v1 import multimodal_pb2

        image = await self.loader.load(data=data)
        t, h, w = self.gridder.grid_of_size(image.width, image.height)
        item = multimodal_pb2.MediaItem(mm_hash=image.mm_hash, data=data)
        return item, multimodal_pb2.ImageGrid(t=t, h=h, w=w)

    def encode_call(self, item: Any) -> Any:
        from epd.v1 import encode_service_pb2

        return self.encode.Encode(
            encode_service_pb2.EncodeRequest(items=[item], consumer_host_id=self.host_id)
        )

    async def encoded(self, data: bytes) -> Any:
        """Encode, then a prompt with the embeddings' reference (the route's default way; the
        stream's end is not waited for, as the route does not)."""
        from epd.v1 import generation_pb2, multimodal_pb2

        item, grid = await self.loaded(data)
        result = await anext(self.encode_call(item))
        image = multimodal_pb2.ImageInput(
            mm_hash=result.mm_hash, grid=result.grid, embeddings=result.embeddings
        )
        return generation_pb2.Prompt(token_ids=self.prompt_ids(), images=[image])

    async def release(self, prompt: Any) -> None:
        from epd.v1 import encode_service_pb2

        await self.encode.Release(
            encode_service_pb2.ReleaseRequest(
                lease_ids=[image.embeddings.lease_id for image in prompt.images]
            )
        )

    async def e_pd(self, data: bytes, request_id: str) -> Timed:
        from epd.v1 import prefill_service_pb2 as pb

        start = time.perf_counter()
        prompt = await self.encoded(data)
        call = self.aggregated.PrefillDecode(
            pb.PrefillDecodeRequest(request_id=request_id, prompt=prompt, sampling=self.sampling())
        )
        result = await timed((t async for r in call for t in r.token_ids), start)
        await self.release(prompt)
        return result

    async def engine_embeddings(self, data: bytes, request_id: str) -> Timed:
        """The engine alone from embeddings (encoded and read before the clock starts): what
        vLLM itself takes for a prompt whose image is encoded already, no RPC."""
        from epd.server.engine.base import EngineImage, Sampling

        prompt = await self.encoded(data)
        image = prompt.images[0]
        embeddings = self.plane.get(image.embeddings, copy=True)
        await self.release(prompt)
        grid = (image.grid.t, image.grid.h, image.grid.w)
        start = time.perf_counter()
        chunks = self.engine.generate(
            request_id,
            self.prompt_ids(),
            [EngineImage(image.mm_hash, grid=grid, embeddings=embeddings)],
            Sampling(max_tokens=self.num_tokens, ignore_eos=True),
        )
        return await timed((t async for c in chunks for t in c.token_ids), start)

    async def epd_raw(self, data: bytes, request_id: str) -> Timed:
        from epd.v1 import generation_pb2, multimodal_pb2
        from epd.v1 import prefill_service_pb2 as pb

        start = time.perf_counter()
        item, grid = await self.loaded(data)
        image = multimodal_pb2.ImageInput(mm_hash=item.mm_hash, grid=grid, media=item)
        call = self.epd.PrefillDecode(
            pb.PrefillDecodeRequest(
                request_id=request_id,
                sampling=self.sampling(),
                prompt=generation_pb2.Prompt(token_ids=self.prompt_ids(), images=[image]),
            )
        )
        return await timed((t async for r in call for t in r.token_ids), start)

    async def e_p_d(self, data: bytes, request_id: str) -> Timed:
        from epd.v1 import decode_service_pb2 as decode_pb
        from epd.v1 import prefill_service_pb2 as pb

        start = time.perf_counter()
        prompt = await self.encoded(data)
        first = await self.prefill.Prefill(
            pb.PrefillRequest(request_id=request_id, prompt=prompt, sampling=self.sampling())
        )
        first_at = time.perf_counter()
        await self.release(prompt)
        call = self.decode.Decode(
            decode_pb.DecodeRequest(
                request_id=request_id,
                prompt_token_ids=prompt.token_ids,
                sampling=self.sampling(),
                first_token_id=first.first_token_id,
                kv_handle=first.kv_handle,
            )
        )
        wait_s, decode_s, count = await timed(
            (t async for r in call for t in r.token_ids), first_at
        )
        return first_at - start, wait_s + decode_s, count + 1


async def measure(
    preset_name: str, num_requests: int, num_tokens: int, with_pd: bool, gap_s: float = 0.0
) -> dict[str, dict[str, float]]:
    from epd.server.models.tiny.build import build_tiny_model, preset

    with tempfile.TemporaryDirectory() as folder:
        model_dir = build_tiny_model(Path(folder) / preset_name, preset(preset_name))
        bench = Bench(model_dir, num_tokens)
        await bench.start(with_pd)
        paths = {
            "monolithic": bench.monolithic,
            "E/PD": bench.e_pd,
            "engine from embeddings": bench.engine_embeddings,
            "EPD": bench.epd_raw,
        }
        if with_pd:
            paths["E/P/D"] = bench.e_p_d
        results: dict[str, list[Timed]] = {name: [] for name in paths}
        try:
            seed = 0
            for i in range(num_requests + 1):  # request 0 of each path warms it up
                for name, run in paths.items():
                    seed += 1
                    await asyncio.sleep(gap_s)
                    outcome = await run(png(seed, SIZES[preset_name]), f"{name}-{i}")
                    if i:
                        results[name].append(outcome)
        finally:
            await bench.close()
    return {name: summarise(timings) for name, timings in results.items()}


def summarise(timings: list[Timed]) -> dict[str, float]:
    ttft = statistics.median(t for t, _, _ in timings) * 1000
    rate = statistics.median((n - 1) / d for _, d, n in timings if d > 0)
    return {"ttft_ms": ttft, "decode_tok_s": rate}


def report(figures: dict[str, dict[str, dict[str, float]]]) -> None:
    header = f"{'TTFT ms':>8} {'x mono':>7} {'decode tok/s':>13} {'x mono':>7}"
    print(f"{'preset':7} {'path':22} {header}")
    for preset_name, paths in figures.items():
        mono = paths["monolithic"]
        for name, row in paths.items():
            print(
                f"{preset_name:7} {name:22} {row['ttft_ms']:8.1f} "
                f"{row['ttft_ms'] / mono['ttft_ms']:7.2f} {row['decode_tok_s']:13.1f} "
                f"{row['decode_tok_s'] / mono['decode_tok_s']:7.2f}"
            )
    print("target: E/PD TTFT <= 1.2x monolithic on tiny at low load")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--presets", default="tiny,small", help="model presets (tiny,small)")
    parser.add_argument("--requests", type=int, default=10, help="requests per path (default 10)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per request (default 32)")
    parser.add_argument("--no-pd", action="store_true", help="skip E/P/D (two fewer engines)")
    parser.add_argument(
        "--gap-s", type=float, default=0.0, help="idle before each request (default 0)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = parser.parse_args()
    figures = {
        name: asyncio.run(measure(name, args.requests, args.tokens, not args.no_pd, args.gap_s))
        for name in args.presets.split(",")
    }
    if args.json:
        print(json.dumps(figures))
    else:
        report(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
