"""Streaming detokenization: the deltas add up to the whole output's text, whatever the chunking,
without broken characters or special tokens, for the byte-level BPE of the Qwen families and a
SentencePiece-style (metaspace, byte fallback) tokenizer like Llama's."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from epd.server.route.detokenize import StoppedText
from epd.v1 import generation_pb2

TEXT = "héllo wörld, ünïcode ✓ 🙂 done. 中文也可以，还有emoji 🚀🚀 and spaces  at   ends "


@pytest.fixture(scope="module")
def qwen_tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerFast:
    from transformers import AutoTokenizer

    tokenizer: PreTrainedTokenizerFast = AutoTokenizer.from_pretrained(tiny_model_dir)
    return tokenizer


def metaspace_tokenizer() -> PreTrainedTokenizerFast:
    """Characters as tokens with byte fallback (``<0xNN>``), metaspace pre-tokenizer and
    decoder, as Llama's tokenizer.json has them."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for char in sorted(set("▁abcdefghijklmnopqrstuvwxyz.,")):
        vocab[char] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    backend.add_special_tokens(["<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")


def streamed(tokenizer: PreTrainedTokenizerFast, ids: list[int], seed: int) -> list[str]:
    rng = random.Random(seed)
    detokenizer = StoppedText(tokenizer, generation_pb2.SamplingParams())
    deltas, start = [], 0
    while start < len(ids):
        size = rng.choice([1, 1, 1, 2, 3, 7])
        deltas.append(detokenizer.add(ids[start : start + size]))
        start += size
    return deltas


@pytest.mark.parametrize("seed", range(5))
def test_qwen_deltas_add_up_to_the_text_without_broken_characters(
    qwen_tokenizer: PreTrainedTokenizerFast, seed: int
) -> None:
    ids = qwen_tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    deltas = streamed(qwen_tokenizer, ids, seed)
    assert "".join(deltas) == qwen_tokenizer.decode(ids) == TEXT
    assert all("\ufffd" not in delta for delta in deltas)


def test_special_tokens_are_skipped(qwen_tokenizer: PreTrainedTokenizerFast) -> None:
    end = qwen_tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = qwen_tokenizer("one", add_special_tokens=False)["input_ids"]
    ids += [end] + qwen_tokenizer(" two", add_special_tokens=False)["input_ids"] + [end]
    assert "".join(streamed(qwen_tokenizer, ids, 0)) == "one two"


@pytest.mark.parametrize("seed", range(5))
def test_metaspace_deltas_keep_the_spaces_between_words(seed: int) -> None:
    tokenizer = metaspace_tokenizer()
    text = "the quick fox, über ✓ jumps."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert any(tokenizer.convert_ids_to_tokens(i).startswith("<0x") for i in ids)
    deltas = streamed(tokenizer, ids, seed)
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert all("\ufffd" not in delta for delta in deltas)


def test_an_incomplete_character_is_held_back_until_its_last_byte() -> None:
    tokenizer = metaspace_tokenizer()
    ids = tokenizer("a✓", add_special_tokens=False)["input_ids"]
    detokenizer = StoppedText(tokenizer, generation_pb2.SamplingParams())
    deltas = [detokenizer.add([i]) for i in ids]
    assert deltas[-3:] == ["", "", "✓"]
    assert "".join(deltas) == "a✓"


def test_a_tokenizer_without_a_tokenizers_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="no tokenizers backend"):
        StoppedText(object(), generation_pb2.SamplingParams())


def stopped_text(tokenizer, token_ids, stop, include=False, min_tokens=0, chunk=1):
    """(deltas, whole) of ``token_ids`` fed ``chunk`` at a time, the last chunk ending in a stop."""
    sampling = generation_pb2.SamplingParams(
        stop=stop, include_stop_str_in_output=include, min_tokens=min_tokens
    )
    text = StoppedText(tokenizer, sampling)
    chunks = [token_ids[i : i + chunk] for i in range(0, len(token_ids), chunk)]
    deltas = [text.add(part, is_stopped=i == len(chunks) - 1) for i, part in enumerate(chunks)]
    return deltas, "".join(deltas)


@pytest.mark.parametrize("chunk", [1, 3])
def test_the_text_ends_before_a_stop_string_inside_a_token(qwen_tokenizer, chunk: int) -> None:
    whole = "the quick brown fox"
    ids = qwen_tokenizer.encode(whole + " jumps")
    end = next(n for n in range(1, len(ids) + 1) if "own f" in qwen_tokenizer.decode(ids[:n]))
    deltas, text = stopped_text(qwen_tokenizer, ids[:end], ["own f"], chunk=chunk)
    assert text == "the quick br"
    _, kept = stopped_text(qwen_tokenizer, ids[:end], ["own f"], include=True, chunk=chunk)
    assert kept.startswith("the quick brown f")


def test_characters_a_stop_string_may_begin_with_are_held_back_while_streaming(
    qwen_tokenizer,
) -> None:
    ids = qwen_tokenizer.encode("abcdef")
    text = StoppedText(qwen_tokenizer, generation_pb2.SamplingParams(stop=["xyz", "zz"]))
    streamed = "".join(text.add([token]) for token in ids)
    assert streamed == "abcdef"[:-2] and text.add([], is_stopped=False) == ""


def test_a_stop_token_leaves_its_text_out_unless_asked_to_keep_it(qwen_tokenizer) -> None:
    ids = qwen_tokenizer.encode("one two three")
    *head, last = ids
    _, text = stopped_text(qwen_tokenizer, ids, [])
    assert text == qwen_tokenizer.decode(head)
    _, kept = stopped_text(qwen_tokenizer, ids, [], include=True)
    assert kept == "one two three" and qwen_tokenizer.decode([last])


def test_a_stop_string_within_min_tokens_does_not_count(qwen_tokenizer) -> None:
    """The engine stops at the first "ab" past min_tokens: the second (tokens a b ' a' b)."""
    ids = qwen_tokenizer.encode("ab ab ab")[:4]
    assert qwen_tokenizer.decode(ids) == "ab ab"
    _, text = stopped_text(qwen_tokenizer, ids, ["ab"], min_tokens=2)
    assert text == "ab "
    _, text = stopped_text(qwen_tokenizer, ids[:2], ["ab"])
    assert text == ""


def test_the_route_s_stop_string_check_is_vllm_s() -> None:
    """``stop_end`` (the route runs without vLLM where engines are transformers') against vLLM's
    ``check_stop_strings`` on random texts, stop lists and checked regions."""
    from vllm.v1.engine.detokenizer import check_stop_strings

    from epd.server.route.detokenize import stop_end

    rng = random.Random(7)
    for _ in range(3000):
        text = "".join(rng.choice("abc ") for _ in range(rng.randint(0, 12)))
        stop = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 3))) for _ in range(3)]
        start = rng.randint(0, len(text))
        include = rng.random() < 0.5
        found = check_stop_strings(text, len(text) - start, stop, include)
        expected = None
        if found is not None:
            expected = len(text) if found[1] == -1 else found[1]
        assert stop_end(text, start, stop, include) == expected, (text, start, stop, include)


def vllm_text(tokenizer: PreTrainedTokenizerFast, ids: list[int], **options: bool) -> str:
    """What vLLM's own incremental detokenizer writes for ``ids`` (no prompt before them)."""
    from vllm import SamplingParams
    from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer

    request = SimpleNamespace(
        request_id="r", prompt_token_ids=None, sampling_params=SamplingParams(**options)
    )
    detokenizer = FastIncrementalDetokenizer(tokenizer, request)  # type: ignore[arg-type]
    detokenizer.update(ids, stop_terminated=False)
    return detokenizer.get_next_output_text(finished=True, delta=False)


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("spaces", [True, False])
def test_special_tokens_are_written_as_vllm_writes_them(
    qwen_tokenizer: PreTrainedTokenizerFast, skip: bool, spaces: bool
) -> None:
    pytest.importorskip("vllm")
    for tokenizer in (qwen_tokenizer, metaspace_tokenizer()):
        specials = [tokenizer.eos_token_id] * 2
        ids = [*tokenizer.encode("ab", add_special_tokens=False), *specials]
        ids += tokenizer.encode("c d", add_special_tokens=False) + specials[:1]
        options = {"skip_special_tokens": skip, "spaces_between_special_tokens": spaces}
        sampling = generation_pb2.SamplingParams(**options)
        detokenizer = StoppedText(tokenizer, sampling)
        streamed = "".join(detokenizer.add([token_id]) for token_id in ids)
        assert streamed == vllm_text(tokenizer, ids, **options)
        assert (tokenizer.eos_token in streamed) is not skip
