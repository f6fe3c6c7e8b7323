"""The tiny model: deterministic build, loads in transformers and vLLM, same greedy tokens."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from epd.server.engine.reference import ReferenceEngine
from epd.server.models.registry import FAMILIES, family_of
from epd.server.models.tiny.build import build_tiny_model, preset
from tests.families import skip_unless_run

NUM_TOKENS = 24
# Greedy tokens must not hinge on float noise: transformers and vLLM kernels differ by ~1e-5.
MIN_TOP2_MARGIN = 0.02


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _image(seed: int, width: int, height: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 255, size=(height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.fixture(scope="module")
def chat() -> tuple[list[dict[str, object]], list[Image.Image]]:
    messages: list[dict[str, object]] = [
        {
            "role": "user",
            "content": [
                {"type": "image"},
                {"type": "text", "text": "describe this picture"},
                {"type": "image"},
            ],
        }
    ]
    return messages, [_image(1, 96, 64), _image(2, 60, 90)]


@pytest.fixture(scope="module", params=[family.name for family in FAMILIES])
def family_dir(request: pytest.FixtureRequest, tiny_family_dir) -> Path:
    """The tiny checkpoint of each family in turn."""
    return Path(tiny_family_dir(request.param))


@pytest.fixture(scope="module")
def hf_greedy(family_dir: Path, chat) -> tuple[str, list[int], list[float]]:
    messages, images = chat
    engine = ReferenceEngine(family_dir)
    result = engine.generate(messages, images, max_tokens=NUM_TOKENS, ignore_eos=True)
    return engine.render(messages), result.token_ids, result.top2_margins


def test_build_is_deterministic(tmp_path: Path, family_dir: Path) -> None:
    family = family_of(family_dir)
    again = build_tiny_model(tmp_path / "again", preset("tiny", family=family.name))
    assert _digest(again) == _digest(family_dir)
    assert family.architectures[0] in (again / "config.json").read_text()


def test_build_replaces_existing_output_and_reports_progress(tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "stale.txt").write_text("left from an earlier build")
    steps: list[str] = []
    build_tiny_model(out, progress=steps.append)
    assert not (out / "stale.txt").exists()
    assert (out / "model.safetensors").is_file()
    assert steps[-1] == f"saved {out}"


def test_preset_rejects_unknown_name_and_bad_head_size() -> None:
    with pytest.raises(ValueError, match="unknown model preset"):
        preset("huge")
    with pytest.raises(ValueError, match="must be 64"):
        preset("tiny", hidden_size=96)
    with pytest.raises(ValueError, match="unknown model family 'llama'; supported: Qwen2-VL"):
        preset("tiny", family="llama")


def test_greedy_margins_are_wide(hf_greedy) -> None:
    _, tokens, margins = hf_greedy
    assert len(tokens) == NUM_TOKENS
    assert min(margins) > MIN_TOP2_MARGIN, margins


@pytest.mark.vllm
def test_vllm_matches_transformers_token_for_token(
    request: pytest.FixtureRequest, family_dir: Path, chat, hf_greedy
) -> None:
    skip_unless_run(request, family_of(family_dir).name)
    from vllm import LLM, SamplingParams

    _, images = chat
    prompt, hf_tokens, _ = hf_greedy
    llm = LLM(
        str(family_dir),
        dtype="float32",
        enforce_eager=True,
        max_model_len=2048,
        kv_cache_memory_bytes=128 << 20,
        limit_mm_per_prompt={"image": 2},
        seed=0,
    )
    try:
        outputs = llm.generate(
            {"prompt": prompt, "multi_modal_data": {"image": images}},
            SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True),
        )
        assert list(outputs[0].outputs[0].token_ids) == hf_tokens
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
