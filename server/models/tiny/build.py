"""Build a tiny random-weight checkpoint of a supported family offline, deterministically.

No model weights can be downloaded on the machines this project is built on, so tests and the
embedded default run on models made here: the real architecture of the family (transformers'
own classes, from the family's builder: ``registry.builder_named``), a byte-level BPE tokenizer
trained on a generated corpus, the family's chat template and processor configs, saved as the
hub's checkpoints are. Same family and config -> the same bytes on every run.

Random weights give near-uniform logits, and near-ties make greedy tokens flip between
implementations (transformers vs vLLM kernels). The language model head is therefore scaled up
(``lm_head_scale``) so the gap between the two most likely tokens is wide; tests check it.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from epd.server.models.tiny.builder import TinySizes
from epd.server.models.tiny.registry import builder_named

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

CORPUS_WORDS = (
    "the",
    "a",
    "an",
    "image",
    "picture",
    "photo",
    "of",
    "is",
    "shows",
    "describe",
    "what",
    "this",
    "that",
    "color",
    "red",
    "green",
    "blue",
    "cat",
    "dog",
    "user",
    "assistant",
    "system",
    "you",
    "are",
    "helpful",
    "answer",
    "question",
    "small",
    "large",
    "hello",
    "world",
)

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class TinyModelConfig:
    """Sizes of the generated model. Head dims stay 64: vLLM's CPU attention supports it."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    vision_depth: int = 2
    vision_embed_dim: int = 64
    vision_num_heads: int = 2
    vocab_size: int = 1000
    min_pixels: int = 28 * 28 * 4
    max_pixels: int = 28 * 28 * 64
    init_range: float = 0.1
    lm_head_scale: float = 8.0
    seed: int = 0
    family: str = "qwen2_vl"
    # tokens added to the vocabulary whole but not as special tokens, so that their text stays
    # in the output: a reasoning model's <think> and </think>
    added_tokens: tuple[str, ...] = ()


PRESETS: dict[str, TinyModelConfig] = {
    "tiny": TinyModelConfig(),
    # Encoding costs real time here (deeper, wider vision tower, up to 1024 patches per image).
    "small": TinyModelConfig(
        hidden_size=256,
        intermediate_size=1024,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        vision_depth=8,
        vision_embed_dim=512,
        vision_num_heads=8,
        max_pixels=448 * 448,
    ),
}


def preset(name: str, **overrides: Any) -> TinyModelConfig:
    """Return the named preset ("tiny" or "small") with ``overrides`` applied."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    config = replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})
    builder_named(config.family)
    if config.hidden_size // config.num_heads != 64:
        raise ValueError("hidden_size / num_heads must be 64 (vLLM CPU attention head size)")
    return config


MANIFEST = "epd_tiny_model.json"


def builder_fingerprint() -> str:
    """SHA-256 of this builder's source (every module of the ``tiny`` package): a checkpoint
    built by other code (an older epd) may lack what this one writes, e.g. a chat template's
    video clause."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def is_current(out_dir: str | Path, config: TinyModelConfig | None = None) -> bool:
    """Whether ``out_dir`` holds this builder's checkpoint of ``config`` (default: the tiny
    preset): False for a missing, unreadable or other build."""
    try:
        stored = json.loads((Path(out_dir) / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return bool(stored == _manifest(config or PRESETS["tiny"]))


def _manifest(config: TinyModelConfig) -> dict[str, Any]:
    manifest = {**asdict(config), "builder_sha256": builder_fingerprint()}
    # NOTE: as stored: JSON has lists where the config has tuples
    return dict(json.loads(json.dumps(manifest)))


def build_tiny_model(
    out_dir: str | Path, config: TinyModelConfig | None = None, progress: Progress | None = None
) -> Path:
    """Write the model to ``out_dir`` (replacing it atomically) and return the path."""
    config = config or PRESETS["tiny"]
    report = progress or (lambda _msg: None)
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        report("training tokenizer")
        chat_template = builder_named(config.family).chat_template
        tokenizer = _train_tokenizer(config, chat_template, _special_tokens(config))
        report("saving processor")
        _save_processor(tokenizer, config, chat_template, staging)
        report("initialising weights")
        _save_model(tokenizer, config, staging)
        (staging / MANIFEST).write_text(json.dumps(_manifest(config), indent=2) + "\n")
        for path in staging.iterdir():
            path.chmod(0o644)
        staging.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report(f"saved {out}")
    return out


def _special_tokens(config: TinyModelConfig) -> tuple[str, ...]:
    return SPECIAL_TOKENS + builder_named(config.family).special_tokens


def _train_tokenizer(
    config: TinyModelConfig, chat_template: str, special_tokens: tuple[str, ...]
) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import Qwen2Tokenizer

    rng = random.Random(config.seed)
    corpus = [
        " ".join(rng.choice(CORPUS_WORDS) for _ in range(rng.randint(3, 15))) + rng.choice(".?!")
        for _ in range(3000)
    ]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size - len(special_tokens) - len(config.added_tokens),
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer=trainer)
    bpe.add_special_tokens(list(special_tokens))
    bpe.add_tokens(list(config.added_tokens))
    tokenizer = Qwen2Tokenizer(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        errors="replace",
        model_max_length=4096,
        chat_template=chat_template,
        **_named_tokens(config),
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(special_tokens[1:])})
    return tokenizer


def _named_tokens(config: TinyModelConfig) -> dict[str, Any]:
    named = dict(builder_named(config.family).named_tokens)
    return {"model_specific_special_tokens": named} if named else {}


def _save_processor(tokenizer: Any, config: TinyModelConfig, template: str, out: Path) -> None:
    builder_named(config.family).save_processor(tokenizer, _sizes(config), out)
    tokenizer_config = out / "tokenizer_config.json"
    data = json.loads(tokenizer_config.read_text())
    data["chat_template"] = template
    tokenizer_config.write_text(json.dumps(data, indent=2) + "\n")


def _save_model(tokenizer: Any, config: TinyModelConfig, out: Path) -> None:
    import torch
    from transformers.utils import logging as hf_logging

    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in _special_tokens(config)}
    hf_logging.disable_progress_bar()
    torch.manual_seed(config.seed)
    model = builder_named(config.family).model(ids, len(tokenizer), _sizes(config))
    with torch.no_grad():
        model.lm_head.weight.mul_(config.lm_head_scale)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.generation_config.do_sample = False
    model.save_pretrained(out, safe_serialization=True)
    builder_named(config.family).finish_checkpoint(out)


def _sizes(config: TinyModelConfig) -> TinySizes:
    """``config``'s values of the fields ``TinySizes`` has (the others keep its defaults)."""
    names = {field.name for field in fields(TinySizes)}
    return TinySizes(**{name: value for name, value in asdict(config).items() if name in names})
