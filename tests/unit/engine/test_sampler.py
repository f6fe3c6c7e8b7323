"""TokenSampler and StopChecker: vLLM's sampling and stop semantics for our own decode loops."""

from __future__ import annotations

import pytest
import torch

from epd.common.errors import InvalidArgument
from epd.server.engine.base import Sampling
from epd.server.engine.sampler import (
    StopChecker,
    TokenSampler,
    bad_words_token_ids,
    check_token_ids,
    filter_probabilities,
)

LOGITS = torch.tensor([1.0, 3.0, 2.0, 0.5, 2.9])
WORDS = {1: "he", 2: "llo", 3: " wor", 4: "ld", 5: "!"}


def decode(token_ids: list[int]) -> str:
    return "".join(WORDS.get(t, "?") for t in token_ids)


def run(checker: StopChecker, token_ids: list[int]) -> list[str | None]:
    return [checker.check(token_ids[: i + 1]) for i in range(len(token_ids))]


def test_greedy_takes_the_argmax_whatever_the_seed() -> None:
    assert TokenSampler(Sampling()).select(LOGITS) == 1
    assert TokenSampler(Sampling(seed=3, top_k=2)).select(LOGITS) == 1


def test_top_k_one_and_a_tiny_top_p_are_greedy_when_sampling() -> None:
    for sampling in (Sampling(temperature=1.5, top_k=1), Sampling(temperature=1.5, top_p=1e-6)):
        sampler = TokenSampler(sampling)
        assert {sampler.select(LOGITS) for _ in range(50)} == {1}


def test_filter_keeps_the_top_k_then_the_top_p_mass() -> None:
    probs = filter_probabilities(LOGITS, top_k=3, top_p=1.0)
    assert set(probs.nonzero().flatten().tolist()) == {1, 2, 4}
    assert torch.isclose(probs.sum(), torch.tensor(1.0))
    nucleus = filter_probabilities(LOGITS, top_k=0, top_p=0.6)
    # NOTE: p(1) ~= 0.39, p(4) ~= 0.35: the two together are the smallest set reaching 0.6.
    assert set(nucleus.nonzero().flatten().tolist()) == {1, 4}


def test_a_seed_makes_sampling_repeatable_and_seeds_differ() -> None:
    flat = torch.zeros(1000)

    def draw(seed: int) -> list[int]:
        sampler = TokenSampler(Sampling(temperature=1.0, seed=seed))
        return [sampler.select(flat) for _ in range(20)]

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_stop_token_ids_and_eos_end_with_stop_the_token_included() -> None:
    checker = StopChecker(
        Sampling(stop_token_ids=(4,)), eos_token_ids=[9], decode=decode, max_new_tokens=10
    )
    assert run(checker, [1, 2, 4]) == [None, None, "stop"]
    assert run(StopChecker(Sampling(), [9], decode, 10), [1, 9]) == [None, "stop"]
    assert run(StopChecker(Sampling(ignore_eos=True), [9], decode, 10), [1, 9]) == [None, None]


def test_max_new_tokens_ends_with_length() -> None:
    assert run(StopChecker(Sampling(), [9], decode, 3), [1, 2, 3]) == [None, None, "length"]


def test_a_stop_string_split_across_tokens_stops_at_the_token_completing_it() -> None:
    checker = StopChecker(Sampling(stop=("lo wo",)), [9], decode, 10)
    assert run(checker, [1, 2, 3]) == [None, None, "stop"]


def test_text_without_a_stop_string_goes_on() -> None:
    checker = StopChecker(Sampling(stop=("xyz", "")), [9], decode, 10)
    assert run(checker, [1, 2, 3, 4, 5]) == [None] * 5


def test_min_tokens_puts_stop_strings_off_until_they_end_past_its_tokens() -> None:
    held = StopChecker(Sampling(stop=("lo wo",), min_tokens=3), [9], decode, 10)
    assert run(held, [1, 2, 3, 4]) == [None, None, None, None]
    ends_later = StopChecker(Sampling(stop=("wor",), min_tokens=2), [9], decode, 10)
    assert run(ends_later, [1, 2, 3, 4]) == [None, None, "stop", None]


def penalised(sampling: Sampling, output: list[int], prompt: tuple[int, ...] = ()) -> list[float]:
    return TokenSampler(sampling, prompt).shape(LOGITS, output).tolist()


def test_repetition_penalty_covers_prompt_and_output_as_vllm_does() -> None:
    # NOTE: vLLM divides positive logits by the penalty and multiplies negative ones.
    logits = torch.tensor([1.0, -2.0, 3.0, 4.0])
    sampler = TokenSampler(Sampling(repetition_penalty=2.0), prompt_token_ids=(0, 1))
    assert sampler.shape(logits, [2, 2]).tolist() == [0.5, -4.0, 1.5, 4.0]


def test_frequency_and_presence_penalties_count_output_tokens_only() -> None:
    frequency = penalised(Sampling(frequency_penalty=0.5), [1, 1, 2], prompt=(3,))
    assert frequency == pytest.approx([1.0, 2.0, 1.5, 0.5, 2.9])
    presence = penalised(Sampling(presence_penalty=0.5), [1, 1, 2], prompt=(3,))
    assert presence == pytest.approx([1.0, 2.5, 1.5, 0.5, 2.9])
    encouraged = TokenSampler(Sampling(presence_penalty=-2.0))
    assert encouraged.select(LOGITS, [2]) == 2, "a negative penalty makes repeats likelier"


def test_logit_bias_and_allowed_token_ids_steer_greedy_choice() -> None:
    assert TokenSampler(Sampling(logit_bias=((3, 5.0),))).select(LOGITS) == 3
    biased = penalised(Sampling(logit_bias=((0, -1.0), (4, 0.25))), [])
    assert biased[::4] == pytest.approx([0.0, 3.15])
    allowed = TokenSampler(Sampling(allowed_token_ids=(0, 3)))
    assert allowed.select(LOGITS) == 0
    assert penalised(Sampling(allowed_token_ids=(0, 3)), [])[1] == float("-inf")


def test_bad_words_ban_single_tokens_and_the_last_of_a_sequence_after_its_prefix() -> None:
    sampler = TokenSampler(Sampling(bad_words=("x",)), bad_words_ids=[[1], [2, 4]])
    assert sampler.select(LOGITS, []) == 4
    assert sampler.select(LOGITS, [2]) == 2, "after 2, the 4 that would end [2, 4] is banned"
    assert sampler.select(LOGITS, [3]) == 4, "the prompt's tokens are no prefix"


def test_bad_words_are_tokenized_as_vllm_does() -> None:
    vocabulary = {"bad": [5], " bad": [6], "two words": [7, 8], " two words": [9, 8], "x": [1]}

    def encode(text: str) -> list[int]:
        return vocabulary.get(text, [])

    assert bad_words_token_ids(["  bad", "two words"], encode) == [[5], [6], [7, 8], [9, 8]]
    assert bad_words_token_ids(["x"], encode) == [[1]], "no prefixed spelling: the bare one"
    with pytest.raises(InvalidArgument) as caught:
        bad_words_token_ids(["nothing"], encode)
    assert caught.value.metadata == {"param": "bad_words"}


def test_min_tokens_holds_off_stop_and_end_ids_even_under_ignore_eos() -> None:
    sampling = Sampling(min_tokens=2, stop_token_ids=(4,), ignore_eos=True)
    sampler = TokenSampler(sampling, eos_token_ids=[1])
    assert sampler.select(LOGITS, []) == 2 and sampler.select(LOGITS, [2]) == 2
    assert sampler.select(LOGITS, [2, 2]) == 1, "reached: the end-of-sequence id is back"


def test_min_p_keeps_tokens_within_a_share_of_the_likeliest_after_temperature() -> None:
    sampler = TokenSampler(Sampling(temperature=1.0, min_p=1.0, seed=5))
    assert {sampler.select(LOGITS) for _ in range(50)} == {1}
    loose = TokenSampler(Sampling(temperature=1.0, min_p=0.5, seed=5))
    # NOTE: p(4) / p(1) = e^-0.1 and p(2) / p(1) = e^-1: only 1 and 4 stay above half.
    assert {loose.select(LOGITS) for _ in range(200)} == {1, 4}


def test_token_ids_outside_the_vocabulary_are_refused_by_field() -> None:
    check_token_ids(Sampling(allowed_token_ids=(0, 4), logit_bias=((4, 1.0),)), 5, [[4]])
    for sampling, bad_words, field in (
        (Sampling(allowed_token_ids=(5,)), [], "allowed_token_ids"),
        (Sampling(logit_bias=((-1, 1.0),)), [], "logit_bias"),
        (Sampling(), [[2, 7]], "bad_words"),
    ):
        with pytest.raises(InvalidArgument) as caught:
            check_token_ids(sampling, 5, bad_words)
        assert caught.value.reason == "BAD_SAMPLING"
        assert caught.value.metadata == {"param": field}
