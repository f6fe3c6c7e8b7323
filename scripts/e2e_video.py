"""``bench_e2e.py --video``: one clip per request, through epd with one, two and three encoders
and through monolithic vLLM given the same decoded frames, in one run.

Clips are synthetic (``video_clips.py``): ``--clip-seconds`` of a moving gradient and noise at
``--clip-fps``, one per ``--clip-sizes`` entry, each request a clip of its own (no cache hits).
An epd system with N encoders (``e-pd@auto/auto``: two) gets ``--video-chunk-patches`` =
ceil(temporal patches / N), so its clip is cut into N chunks the scheduler spreads over the N
encoders. Monolithic vLLM gets the frames epd's route keeps (decoded and sampled by epd, PNG,
lossless) as vLLM's ``video/jpeg`` frame list (``--media-io-kwargs`` takes all of them; Pillow
reads PNG there too), so both sides run the same pixels through the same processor and tower.

Per system and clip size: TTFT p50/p99, TPOT, tokens/s and requests/s at each concurrency; TTFT
p50 against the same system with one encoder and against vLLM; a repeated clip (``--repeats``
clips, each sent twice in a row, one at a time): the first and the second request's TTFT p50;
whether greedy answers equal vLLM's on one clip; CPU ms per request by process.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from e2e_report import ratio, times
from video_clips import ClipShape, VideoClips

QUESTION = "What happens in this video?"

VLLM_SYSTEMS = ("vllm",)
# NOTE: vLLM keeps 32 frames of a frame list by default (-1: every frame sent), and its processor
# would sample the frames again (they are sampled already).
VLLM_FLAGS = (
    "--media-io-kwargs",
    '{"video": {"num_frames": -1}}',
    "--mm-processor-kwargs",
    '{"do_sample_frames": false}',
)
CHUNK_PATCHES_ENV = "EPD_VIDEO_CHUNK_PATCHES"


@dataclass
class VideoRow:
    """One (system, clip size, concurrency) measurement of the video run."""

    system: str
    clip: str
    encoders: int
    chunk_patches: int | None
    concurrency: int
    requests: int
    failed: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_ms: float
    output_tok_s: float
    req_s: float
    ttft_p50_vs_one_encoder: float | None = None
    ttft_p50_vs_vllm: float | None = None
    req_s_vs_vllm: float | None = None
    first_ttft_p50_ms: float | None = None
    repeat_ttft_p50_ms: float | None = None
    repeat_vs_first: float | None = None
    same_answer_as_vllm: bool | None = None
    cpu_ms_per_request: dict[str, float] = field(default_factory=dict)


def num_encoders(system: str) -> int:
    """Encoders of an epd system name: one per device after ``@`` (``e-pd@auto/auto``: 2), else
    1; 0 for vLLM."""
    if system in VLLM_SYSTEMS:
        return 0
    devices = system.partition("+metrics")[0].partition("@")[2]
    return max(1, len([d for d in devices.split("/") if d]))


def chunk_patches(system: str, temporal_patches: int) -> int | None:
    """``--video-chunk-patches`` for ``system``: the clip cut into one chunk per encoder."""
    encoders = num_encoders(system)
    return math.ceil(temporal_patches / encoders) if encoders else None


def compare(rows: list[VideoRow]) -> None:
    """Fill each row's ratios to one encoder of the same topology and to vLLM, at the same clip
    size and concurrency."""
    by_key = {(r.system, r.clip, r.concurrency): r for r in rows}
    for row in rows:
        if row.encoders:
            topology = row.system.partition("@")[0].partition(":")[0]
            single = next(
                (
                    r
                    for r in rows
                    if r.encoders == 1
                    and r.system.partition("@")[0].partition(":")[0] == topology
                    and (r.clip, r.concurrency) == (row.clip, row.concurrency)
                ),
                None,
            )
            row.ttft_p50_vs_one_encoder = ratio(row.ttft_p50_ms, single and single.ttft_p50_ms)
        if (vllm := by_key.get(("vllm", row.clip, row.concurrency))) is not None:
            row.ttft_p50_vs_vllm = ratio(row.ttft_p50_ms, vllm.ttft_p50_ms)
            row.req_s_vs_vllm = ratio(row.req_s, vllm.req_s)


async def repeated_clip(
    client: Any, parts: list[list[dict[str, Any]]], tokens: int
) -> tuple[float, float]:
    """TTFT p50 (ms) of each clip's first request and of the same clip sent again at once."""
    from bench_e2e import one_request

    first, again = [], []
    for content in parts:
        first.append((await one_request(client, "tiny", content, tokens))[0] * 1000)
        again.append((await one_request(client, "tiny", content, tokens))[0] * 1000)
    return statistics.median(first), statistics.median(again)


async def greedy_answer(client: Any, content: list[dict[str, Any]], tokens: int) -> str:
    """The greedy answer (``tokens`` tokens, EOS ignored) to ``content``."""
    reply = await client.chat.completions.create(
        model="tiny",
        max_tokens=tokens,
        temperature=0.0,
        extra_body={"ignore_eos": True},
        messages=[{"role": "user", "content": content}],
    )
    return str(reply.choices[0].message.content)


def content_of(clips: VideoClips, shape: ClipShape, vllm: bool) -> Callable[[int], list[Any]]:
    """Request seed -> its chat content: the clip of that seed (as epd or vLLM takes it) and the
    question."""

    def content(seed: int) -> list[dict[str, Any]]:
        clip = clips.clip(seed, shape)
        return [clip.vllm_part() if vllm else clip.part(), {"type": "text", "text": QUESTION}]

    return content


async def run_system(
    system: str, clips: VideoClips, args: argparse.Namespace, run_root: Path
) -> tuple[list[VideoRow], dict[str, str]]:
    """Every clip size and concurrency level of ``system``; its rows and its greedy answer per
    clip size."""
    import openai
    from bench_e2e import measure, parse_list
    from e2e_serving import log, serving

    shapes, levels = clips.shapes, parse_list(args.concurrency, int)
    patches = clips.temporal_patches(shapes[0])
    chunks = chunk_patches(system, patches)
    env = {CHUNK_PATCHES_ENV: str(chunks)} if chunks else {}
    flags = VLLM_FLAGS if system in VLLM_SYSTEMS else ()
    rows, answers = [], {}
    log(args, f"== {system}: starting ({patches} temporal patches, chunks of {chunks})")
    run_dir = run_root / system.replace(":", "-").replace("/", "+")
    async with serving(system, clips.model_dir, run_dir, args, env, flags) as (url, processes):
        client = openai.AsyncOpenAI(base_url=url, api_key="-", timeout=600)
        for s, shape in enumerate(shapes):
            content = content_of(clips, shape, system in VLLM_SYSTEMS)
            answers[shape.name] = await greedy_answer(client, content(-1), args.tokens)
            for level, concurrency in enumerate(levels):
                # NOTE: every system gets the same clips (each a fresh deployment, so no hits)
                first_seed = (s * len(levels) + level) * args.requests
                row = await measure(
                    url,
                    "tiny",
                    system,
                    concurrency,
                    0.0,
                    args.requests,
                    args.tokens,
                    content,
                    first_seed,
                    processes,
                )
                rows.append(video_row(row, shape, chunks))
                if not args.json:
                    print_table(rows[-1:])
            repeated = [content(seed) for seed in range(-2 - args.repeats, -2)]
            first, again = await repeated_clip(client, repeated, args.tokens)
            for row in rows[-len(levels) :]:
                row.first_ttft_p50_ms, row.repeat_ttft_p50_ms = first, again
                row.repeat_vs_first = ratio(again, first)
        await client.close()
    return rows, answers


def video_row(row: Any, shape: ClipShape, chunks: int | None) -> VideoRow:
    fields = {k: v for k, v in asdict(row).items() if k in VideoRow.__dataclass_fields__}
    return VideoRow(
        **{**fields, "clip": shape.name, "encoders": num_encoders(row.system)},
        chunk_patches=chunks,
    )


def mark_answers(rows: list[VideoRow], answers: dict[str, dict[str, str]]) -> None:
    """Whether each system's greedy answer equals vLLM's on the same clip."""
    reference = answers.get("vllm")
    for row in rows:
        if reference is not None and row.system not in VLLM_SYSTEMS:
            row.same_answer_as_vllm = answers[row.system][row.clip] == reference[row.clip]


async def run_video(args: argparse.Namespace, model_dir: Path, run_root: Path) -> int:
    """The whole video run: every system one after the other; a table or one JSON object."""
    import json

    shapes = [ClipShape.parse(s, args.clip_seconds, args.clip_fps) for s in args.clip_sizes]
    clips = VideoClips(model_dir.resolve())
    started = time.perf_counter()
    for shape in shapes:
        clips.temporal_patches(shape)
    rows: list[VideoRow] = []
    answers: dict[str, dict[str, str]] = {}
    for system in args.systems.split(","):
        system_rows, answers[system] = await run_system(system, clips, args, run_root)
        rows += system_rows
    compare(rows)
    mark_answers(rows, answers)
    summary = {
        "model": str(model_dir),
        "clips": [asdict(s) | {"temporal_patches": clips.temporal_patches(s)} for s in shapes],
        "tokens": args.tokens,
        "repeats": args.repeats,
        "seconds": round(time.perf_counter() - started, 1),
        "rows": [asdict(r) for r in rows],
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"\nclips: {summary['clips']}\n")
        print_table(rows)
        print()
        print_cpu_table(rows)
    return 0 if all(r.failed == 0 for r in rows) else 1


def print_table(rows: list[VideoRow]) -> None:
    def ms(value: float | None) -> str:
        return f"{value:>7.0f}ms" if value is not None else f"{'-':>9}"

    print(
        f"{'system':<22}{'clip':>9}{'chunk':>6}{'conc':>5}{'ok':>4}{'fail':>5}{'TTFT p50':>10}"
        f"{'TTFT p99':>10}{'tok/s':>8}{'req/s':>7}{'vs 1 enc':>9}{'vs vllm':>9}"
        f"{'req/s/vllm':>11}{'1st':>9}{'again':>9}{'again/1st':>10}{'=vllm':>6}",
        file=sys.stdout,
    )
    for r in rows:
        same = "-" if r.same_answer_as_vllm is None else ("yes" if r.same_answer_as_vllm else "NO")
        print(
            f"{r.system:<22}{r.clip:>9}{r.chunk_patches or '-':>6}{r.concurrency:>5}"
            f"{r.requests:>4}{r.failed:>5}{r.ttft_p50_ms:>8.0f}ms{r.ttft_p99_ms:>8.0f}ms"
            f"{r.output_tok_s:>8.1f}{r.req_s:>7.2f} {times(r.ttft_p50_vs_one_encoder)}"
            f" {times(r.ttft_p50_vs_vllm)}   {times(r.req_s_vs_vllm)}{ms(r.first_ttft_p50_ms)}"
            f"{ms(r.repeat_ttft_p50_ms)}  {times(r.repeat_vs_first)}{same:>6}"
        )


def print_cpu_table(rows: list[VideoRow]) -> None:
    """CPU ms per request by process (those of at least 0.5 ms), one block per row."""
    print("CPU time per request, ms (user+system, from /proc)")
    for r in rows:
        total = sum(r.cpu_ms_per_request.values())
        print(f"  {r.system} {r.clip} @ concurrency {r.concurrency}: {total:.1f} ms")
        for name, value in r.cpu_ms_per_request.items():
            if value >= 0.5:
                print(f"    {value:>8.1f}  {name}")
