"""Streaming detokenization: the deltas add up to the whole output's text, whatever the chunking,
without broken characters or special tokens, for the byte-level BPE of the Qwen families and a
SentencePiece-style (metaspace, byte fallback) tokenizer like Llama's."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from epd.server.route.detokenize import Detokenizer

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
    detokenizer = Detokenizer(tokenizer)
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
    detokenizer = Detokenizer(tokenizer)
    deltas = [detokenizer.add([i]) for i in ids]
    assert deltas[-3:] == ["", "", "✓"]
    assert "".join(deltas) == "a✓"


def test_a_tokenizer_without_a_tokenizers_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="no tokenizers backend"):
        Detokenizer(object())
