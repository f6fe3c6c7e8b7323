"""Log probabilities and their texts as vLLM's engine reports them, for the transformers engine:
the order and ranks of a position's candidates, logprob_token_ids, prompt positions, the refusals,
and each candidate's text beside vLLM's own functions on the tiny model's byte-level tokenizer and
on a SentencePiece-like one."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from epd.common.errors import InvalidArgument
from epd.server.engine import logprobs as logprobs_module
from epd.server.engine.base import Sampling
from epd.server.engine.logprobs import (
    RequestLogprobs,
    check_logprobs,
    prompt_ranked,
    ranked,
    ranked_chosen,
    raw_logprobs,
)
from epd.server.engine.token_text import TokenTexts

LOGITS = torch.tensor([[1.0, 3.0, 2.0, 0.5, 2.9]])
LOGPROBS = raw_logprobs(LOGITS)
VALUES = LOGPROBS[0].tolist()


def test_the_token_comes_first_with_its_rank_then_the_most_likely() -> None:
    assert ranked(LOGPROBS, [2], 2) == [((2, VALUES[2], 3), (1, VALUES[1], 1), (4, VALUES[4], 2))]
    assert math.isclose(sum(math.exp(v) for v in VALUES), 1.0, rel_tol=1e-6)


def test_a_token_among_the_most_likely_keeps_its_first_place() -> None:
    assert ranked(LOGPROBS, [4], 3) == [((4, VALUES[4], 2), (1, VALUES[1], 1), (2, VALUES[2], 3))]
    assert ranked(LOGPROBS, [3], 0) == [((3, VALUES[3], 5),)]


def test_chosen_ids_follow_the_token_ranked_by_their_order() -> None:
    assert ranked_chosen(LOGPROBS, [1], [3, 0]) == [
        ((1, VALUES[1], 1), (3, VALUES[3], 1), (0, VALUES[0], 2))
    ]
    # NOTE: vLLM's dict of a position: the token named again takes its place in the list's rank
    assert ranked_chosen(LOGPROBS, [1], [0, 1]) == [((1, VALUES[1], 2), (0, VALUES[0], 1))]


def test_prompt_positions_rank_each_next_token_in_slices(monkeypatch) -> None:
    torch.manual_seed(0)
    hidden = torch.randn(7, 5)
    prompt = [4, 0, 3, 3, 1, 2, 0]
    whole = ranked(raw_logprobs(hidden[:-1]), prompt[1:], 2)
    monkeypatch.setattr(logprobs_module, "PROMPT_ROWS", 4)
    assert prompt_ranked(hidden[:-1], lambda rows: rows, prompt, 2) == whole
    assert [position[0][0] for position in whole] == prompt[1:]
    assert prompt_ranked(hidden[:0], lambda rows: rows, prompt[:1], 2) == []


def test_refused_as_vllm_refuses_them() -> None:
    cases = {
        "logprobs": Sampling(logprobs=21),
        "prompt_logprobs": Sampling(prompt_logprobs=-1),
        "logprob_token_ids": Sampling(logprob_token_ids=(1, 500)),
    }
    for name, sampling in cases.items():
        with pytest.raises(InvalidArgument) as caught:
            check_logprobs(sampling, 399)
        assert (caught.value.reason, caught.value.metadata) == ("BAD_SAMPLING", {"param": name})
    mismatched = Sampling(logprobs=3, logprob_token_ids=(1, 2))
    with pytest.raises(InvalidArgument, match="logprobs must equal"):
        check_logprobs(mismatched, 399)
    too_many = Sampling(logprob_token_ids=tuple(range(129)))
    with pytest.raises(InvalidArgument, match="greater than max allowed: 128"):
        check_logprobs(too_many, 399)
    for fine in (Sampling(logprobs=20, prompt_logprobs=0), Sampling(logprobs=-1)):
        check_logprobs(fine, 20)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def byte_pieces(tokenizer) -> list[int]:
    """A text's tokens of which several decode alone to a cut character."""
    return list(tokenizer.encode("héllo 日本 wörld", add_special_tokens=False))


def vllm_texts(tokenizer, token_ids: list[int], context: list[int]) -> list[str]:
    from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens
    from vllm.v1.engine.logprobs import LogprobsProcessor

    processor = LogprobsProcessor(tokenizer, [], None, 0.0, len(token_ids), None)
    texts = convert_ids_list_to_tokens(tokenizer, token_ids)
    return processor._verify_tokens(texts, token_ids, context)


def test_a_cut_character_is_completed_from_the_tokens_before_it_as_vllm_does(tokenizer) -> None:
    pytest.importorskip("vllm")
    texts = TokenTexts(tokenizer)
    pieces = byte_pieces(tokenizer)
    assert texts.marker is None
    assert any(tokenizer.decode([t]).endswith("\ufffd") for t in pieces), "the case tested"
    for end in range(len(pieces)):
        for start in range(max(end - 6, 0), end + 1):
            context = pieces[start:end]
            alternatives = [pieces[end], 5, pieces[0]]
            expected = vllm_texts(tokenizer, alternatives, context)
            assert texts.texts(alternatives, context) == expected, (start, end)


def test_sentencepiece_leading_spaces_are_restored_as_vllm_does() -> None:
    pytest.importorskip("vllm")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "\u2581hello": 1, "hello": 2, "\u2581\u2581x": 3, "\u2581": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    texts = TokenTexts(tokenizer)
    assert texts.marker == "\u2581"
    ids = [1, 2, 3, 4, 0]
    assert texts.texts(ids) == vllm_texts(tokenizer, ids, [])
    assert texts.texts([1])[0].startswith(" ")


class Spelled:
    """Texts as a token's id, to see which context each position is named with."""

    def __init__(self) -> None:
        self.contexts: list[list[int]] = []

    def texts(self, token_ids, context=()) -> list[str]:
        self.contexts.append(list(context))
        return [str(t) for t in token_ids]


def test_a_request_names_each_position_after_the_tokens_reported_before_it() -> None:
    spelled = Spelled()
    report = RequestLogprobs(Sampling(logprobs=1, prompt_logprobs=0), 5, spelled)  # type: ignore[arg-type]
    positions = ranked(raw_logprobs(torch.randn(6, 5)), [0, 1, 2, 3, 4, 0], 0)
    prompt = report.prompt(positions)
    assert prompt[0] == () and [p[0][0] for p in prompt[1:]] == [0, 1, 2, 3, 4, 0]
    assert spelled.contexts == [[], [0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [1, 2, 3, 4]]
    spelled.contexts.clear()
    for token_id in (1, 2, 3, 4, 0):
        candidates = report.sample(LOGITS[0], token_id)
        assert candidates[0][:3] == (
            token_id,
            VALUES[token_id],
            1 + sorted(VALUES)[::-1].index(VALUES[token_id]),
        )
        assert candidates[0][3] == str(token_id)
    assert spelled.contexts == [[], [1], [1, 2], [1, 2, 3], [1, 2, 3, 4]]


def test_whole_vocabulary_and_no_report() -> None:
    report = RequestLogprobs(Sampling(logprobs=-1), 5, Spelled())  # type: ignore[arg-type]
    assert report.wants_samples and len(report.sample(LOGITS[0], 3)) == 5
    assert not RequestLogprobs(Sampling(), 5, Spelled()).wants_samples  # type: ignore[arg-type]
    chosen = RequestLogprobs(replace(Sampling(), logprob_token_ids=(4,)), 5, Spelled())  # type: ignore[arg-type]
    assert [c[0] for c in chosen.sample(LOGITS[0], 1)] == [1, 4]
