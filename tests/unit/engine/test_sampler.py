"""TokenSampler and StopChecker: vLLM's sampling and stop semantics for our own decode loops."""

from __future__ import annotations

import torch

from epd.server.engine.base import Sampling
from epd.server.engine.sampler import StopChecker, TokenSampler, filter_probabilities

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
