"""The transformers engine's sampling beyond the basics means what vLLM's means: on the tiny
model, each option that changes the answer gives the vLLM engine's tokens (greedy, or sampling
that leaves one token by construction), and its log probabilities (a generated token's with the
most likely or named tokens, the prompt's) are the vLLM engine's, for text and for a picture
given as embeddings (E/PD) or raw (EPD); what it does not implement is refused by name. Both
engines take the model's own context as their length limit by default."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from epd.common.errors import InvalidArgument
from epd.server.engine.base import Engine, EngineImage, Sampling, StructuredOutput, TokenChunk
from epd.server.engine.transformers_engine import TransformersEngine, TransformersOptions
from epd.server.engine.vllm_engine import VllmEngine
from epd.server.engine.vllm_options import VllmOptions
from tests.pictures import picture

from .helpers import prompt_tokens

pytestmark = pytest.mark.vllm
NUM_TOKENS = 12
GREEDY = Sampling(max_tokens=NUM_TOKENS, ignore_eos=True)
SEEDED = replace(GREEDY, temperature=1.0, seed=7)
OWN_LENGTH = 3000  # NOTE: above the session engines' 2048, below the tiny model's 4096
KV = 64 << 20


@pytest.fixture(scope="module")
async def transformers_engine(tiny_model_dir):
    engine = await TransformersEngine.start(tiny_model_dir, model_id="tiny")
    yield engine
    await engine.close()


@pytest.fixture(scope="module")
def prompt(oracle) -> list[int]:
    return prompt_tokens(oracle, 0, "say something about the weather")


async def tokens(engine: Engine, request_id: str, prompt: list[int], sampling: Sampling):
    return [t async for c in engine.generate(request_id, prompt, [], sampling) for t in c.token_ids]


def word_of(tokenizer, token_ids: list[int]) -> str:
    """A word the greedy answer spells with one of its tokens."""
    words = (tokenizer.decode([t], skip_special_tokens=True).strip() for t in token_ids)
    return next(word for word in words if word.isalpha())


def cases(greedy: list[int], tokenizer) -> dict[str, tuple[Sampling, Sampling]]:
    """Each option against the same request without it."""
    return {
        "repetition_penalty": (replace(GREEDY, repetition_penalty=1.8), GREEDY),
        "presence_penalty": (replace(GREEDY, presence_penalty=2.0), GREEDY),
        "frequency_penalty": (replace(GREEDY, frequency_penalty=2.0), GREEDY),
        # NOTE: min_p 1 keeps only the likeliest token: seeded sampling becomes greedy.
        "min_p": (replace(SEEDED, min_p=1.0), SEEDED),
        "logit_bias": (replace(GREEDY, logit_bias=((5, 100.0),)), GREEDY),
        "allowed_token_ids": (replace(GREEDY, allowed_token_ids=(5, 6, 7)), GREEDY),
        "bad_words": (replace(GREEDY, bad_words=(word_of(tokenizer, greedy),)), GREEDY),
        "min_tokens": (
            replace(GREEDY, stop_token_ids=(greedy[0],), min_tokens=4),
            replace(GREEDY, stop_token_ids=(greedy[0],)),
        ),
    }


async def test_each_option_gives_the_vllm_engines_tokens(
    engines, transformers_engine, prompt, oracle
) -> None:
    vllm_engine, _ = engines
    tokenizer = oracle[0].processor.tokenizer
    greedy = await tokens(vllm_engine, "greedy", prompt, GREEDY)
    assert await tokens(transformers_engine, "greedy", prompt, GREEDY) == greedy
    for name, (sampling, baseline) in cases(greedy, tokenizer).items():
        expected = await tokens(vllm_engine, f"v-{name}", prompt, sampling)
        without = await tokens(vllm_engine, f"v-base-{name}", prompt, baseline)
        assert expected != without, f"{name} must change vLLM's answer to mean anything"
        got = await tokens(transformers_engine, f"t-{name}", prompt, sampling)
        assert got == expected, name


async def test_a_stop_string_kept_in_the_output_stops_where_vllm_stops(
    engines, transformers_engine, prompt, oracle
) -> None:
    vllm_engine, _ = engines
    greedy = await tokens(vllm_engine, "s-greedy", prompt, GREEDY)
    text = oracle[0].processor.tokenizer.decode(greedy, skip_special_tokens=True)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    for include in (False, True):
        sampling = replace(GREEDY, stop=(stop,), include_stop_str_in_output=include)
        expected = await tokens(vllm_engine, f"s-v-{include}", prompt, sampling)
        assert len(expected) < NUM_TOKENS
        assert await tokens(transformers_engine, f"s-t-{include}", prompt, sampling) == expected


async def test_what_it_does_not_implement_is_refused_by_name(transformers_engine, prompt) -> None:
    sampling = replace(GREEDY, structured_output=StructuredOutput("regex", "(ab|cd)+"))
    with pytest.raises(InvalidArgument) as caught:
        await tokens(transformers_engine, "refused", prompt, sampling)
    assert caught.value.reason == "UNSUPPORTED_PARAMETER"
    assert caught.value.metadata == {"param": "structured_output"}
    assert "transformers engine" in caught.value.message


LOGPROBS = {
    "top": replace(GREEDY, logprobs=5, prompt_logprobs=3),
    "generated only": replace(GREEDY, logprobs=0),
    "prompt only": replace(GREEDY, prompt_logprobs=0),
    "named ids": replace(GREEDY, logprob_token_ids=(60, 61, 5), prompt_logprobs=1),
    "named ids and logprobs": replace(GREEDY, logprobs=2, logprob_token_ids=(7, 60)),
    # NOTE: reported before the penalty and the temperature; min_p 1 makes it one token
    "penalised and seeded": replace(SEEDED, logprobs=4, repetition_penalty=1.5, min_p=1.0),
}


async def answer(engine: Engine, request_id: str, prompt, images, sampling) -> list[TokenChunk]:
    return [c async for c in engine.generate(request_id, prompt, images, sampling)]


def reported(chunks: list[TokenChunk]) -> dict[str, list]:
    """What a request's chunks report: tokens, each token's candidates, the prompt's (the first
    chunk's only)."""
    assert all(not c.prompt_logprobs for c in chunks[1:])
    return {
        "tokens": [t for c in chunks for t in c.token_ids],
        "logprobs": [p for c in chunks for p in c.logprobs],
        "prompt_logprobs": chunks[0].prompt_logprobs,
    }


def assert_same_candidates(got: list, expected: list, name: str) -> None:
    """Same ids, ranks and texts in the same order at each position; log probabilities within
    the compat suite's tolerance."""
    assert [[c[0] for c in p] for p in got] == [[c[0] for c in p] for p in expected], name
    assert [[(c[2], c[3]) for c in p] for p in got] == [
        [(c[2], c[3]) for c in p] for p in expected
    ], name
    values = [c[1] for p in got for c in p]
    assert values == pytest.approx([c[1] for p in expected for c in p], abs=1e-3), name


def image_prompt(oracle, embedded: bool) -> tuple[list[int], list[EngineImage]]:
    """One picture, as the encoder's embeddings (E/PD) or raw (EPD), and a question about it."""
    _, encoder = oracle
    image = picture(5, 96, 64)
    ((embeddings, grid),) = encoder.encode([image])
    item = (
        EngineImage("lp-embedded", grid, embeddings)
        if embedded
        else EngineImage("lp-raw", image=image)
    )
    return prompt_tokens(oracle, 1, "what is in the picture?"), [item]


@pytest.mark.parametrize("image_kind", ["none", "embedded", "raw"])
async def test_log_probabilities_are_the_vllm_engines(
    engines, transformers_engine, prompt, oracle, image_kind
) -> None:
    vllm_engine, _ = engines
    with_image = image_kind != "none"
    token_ids, images = (prompt, [])
    if with_image:
        token_ids, images = image_prompt(oracle, embedded=image_kind == "embedded")
    for name, sampling in LOGPROBS.items():
        request_id = f"lp-{image_kind}-{name}"
        expected = reported(await answer(vllm_engine, request_id, token_ids, images, sampling))
        got = reported(await answer(transformers_engine, request_id, token_ids, images, sampling))
        assert got["tokens"] == expected["tokens"], name
        assert len(got["logprobs"]) == (NUM_TOKENS if sampling != LOGPROBS["prompt only"] else 0)
        assert_same_candidates(got["logprobs"], expected["logprobs"], name)
        if sampling.repetition_penalty != 1.0:
            assert any(p[0][2] > 1 for p in got["logprobs"]), "a token the penalty chose"
        if sampling.prompt_logprobs is None:
            assert got["prompt_logprobs"] == expected["prompt_logprobs"] == [], name
            continue
        assert got["prompt_logprobs"][0] == ()
        assert (len(got["prompt_logprobs"]) > len(token_ids)) == with_image, "images expanded"
        assert_same_candidates(got["prompt_logprobs"], expected["prompt_logprobs"], name)


async def test_log_probabilities_vllm_refuses_are_refused(transformers_engine, prompt) -> None:
    for name, sampling in [
        ("logprobs", replace(GREEDY, logprobs=21)),
        ("logprob_token_ids", replace(GREEDY, logprob_token_ids=(1, 1 << 20))),
    ]:
        with pytest.raises(InvalidArgument) as caught:
            await tokens(transformers_engine, f"refused-{name}", prompt, sampling)
        assert (caught.value.reason, caught.value.metadata) == ("BAD_SAMPLING", {"param": name})
    assert transformers_engine.budget.num_used == 0


async def test_kept_special_tokens_are_refused_by_name(transformers_engine, prompt) -> None:
    for name, value in [
        ("skip_special_tokens", False),
        ("spaces_between_special_tokens", False),
    ]:
        with pytest.raises(InvalidArgument) as caught:
            await tokens(
                transformers_engine, f"refused-{name}", prompt, replace(GREEDY, **{name: value})
            )
        assert (caught.value.reason, caught.value.metadata) == (
            "UNSUPPORTED_PARAMETER",
            {"param": name},
        )
        assert "transformers engine" in caught.value.message
    salted = replace(GREEDY, priority=3, cache_salt="tenant")
    plain = await tokens(transformers_engine, "plain", prompt, GREEDY)
    assert await tokens(transformers_engine, "salted", prompt, salted) == plain, "no effect here"


async def test_token_ids_outside_the_vocabulary_are_bad_sampling(
    transformers_engine, prompt
) -> None:
    vocab_size = transformers_engine.vocab_size
    with pytest.raises(InvalidArgument) as caught:
        await tokens(
            transformers_engine, "oov", prompt, replace(GREEDY, logit_bias=((vocab_size, 1.0),))
        )
    assert caught.value.reason == "BAD_SAMPLING"
    assert caught.value.metadata == {"param": "logit_bias"}
    assert transformers_engine.budget.num_used == 0


@pytest.fixture(scope="module")
def short_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model with a context of its own unlike any default (``OWN_LENGTH``)."""
    copy = tmp_path_factory.mktemp("short") / "tiny"
    shutil.copytree(tiny_model_dir, copy)
    config = json.loads((copy / "config.json").read_text())
    config["text_config"]["max_position_embeddings"] = OWN_LENGTH
    (copy / "config.json").write_text(json.dumps(config))
    return copy


async def test_both_engines_default_to_the_models_own_length(short_model_dir, prompt) -> None:
    vllm_engine = await VllmEngine.start(short_model_dir, options=VllmOptions(kv_cache_bytes=KV))
    try:
        assert vllm_engine.max_model_len == OWN_LENGTH
        long_prompt = (prompt * OWN_LENGTH)[: OWN_LENGTH - 8]
        assert (
            len(await tokens(vllm_engine, "long", long_prompt, replace(GREEDY, max_tokens=4))) == 4
        )
    finally:
        await vllm_engine.close()
    engine = await TransformersEngine.start(
        short_model_dir, options=TransformersOptions(kv_cache_bytes=KV)
    )
    assert engine.max_model_len == OWN_LENGTH
    assert len(await tokens(engine, "long", long_prompt, replace(GREEDY, max_tokens=4))) == 4
    await engine.close()


async def test_the_transformers_engine_starts_only_with_room_for_one_longest_request(
    short_model_dir, transformers_engine
) -> None:
    per_token = transformers_engine.options.kv_cache_bytes // transformers_engine.budget.capacity
    small = TransformersOptions(kv_cache_bytes=(OWN_LENGTH - 1) * per_token)
    with pytest.raises(ValueError, match=f"at most {OWN_LENGTH - 1}"):
        await TransformersEngine.start(short_model_dir, options=small)
    explicit = replace(small, max_model_len=OWN_LENGTH - 1)
    engine = await TransformersEngine.start(short_model_dir, options=explicit)
    assert engine.max_model_len == OWN_LENGTH - 1
    await engine.close()
