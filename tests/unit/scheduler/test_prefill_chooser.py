"""PrefillChooser: cache-aware choice balanced against load, and round robin."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from epd.scheduler.policies.routing import (
    CACHE_AWARE,
    LONGEST_PREFIX,
    ROUND_ROBIN,
    PrefillChooser,
)


@dataclass(frozen=True)
class W:
    id: str


A, B, C = W("a"), W("b"), W("c")
PROMPT = list(range(10))


def busy_of(**loads: float):  # type: ignore[no-untyped-def]
    return lambda worker: loads.get(worker.id, 0.0)


def test_a_held_prefix_wins_over_a_small_load_difference() -> None:
    chooser = PrefillChooser(CACHE_AWARE)
    chosen, overlap = chooser.choose([A, B], PROMPT, busy_of())
    assert overlap == 0
    again, overlap = chooser.choose([A, B], [*PROMPT, 10, 11], busy_of(**{chosen.id: 0.4}))
    assert again == chosen and overlap == len(PROMPT)


def test_a_short_shared_prefix_does_not_pull_a_prompt_to_a_busier_worker() -> None:
    chooser = PrefillChooser(CACHE_AWARE)
    chooser.index.store("a", PROMPT[:2])
    chosen, overlap = chooser.choose([A, B], PROMPT, busy_of(a=0.1))
    assert (chosen, overlap) == (B, 0), "2 of 10 blocks is under the cache threshold"


def test_an_overloaded_holder_loses_the_prompt_to_the_least_loaded() -> None:
    for loads, expected in (({"a": 0.75}, B), ({"a": 0.75, "b": 0.5}, A)):
        chooser = PrefillChooser(CACHE_AWARE, balance_threshold=0.5)
        chooser.index.store("a", PROMPT)
        assert chooser.choose([A, B], PROMPT, busy_of(**loads))[0] == expected


def test_misses_on_equally_loaded_workers_go_to_the_emptiest_cache() -> None:
    chooser = PrefillChooser(CACHE_AWARE)
    chosen = [chooser.choose([C, A, B], [100 + i], busy_of())[0].id for i in range(6)]
    assert chosen == ["a", "b", "c", "a", "b", "c"]
    chooser.index.store("a", [1, 2, 3])
    assert chooser.choose([A, B], [7], busy_of())[0] == B
    assert chooser.choose([A, B], [8], busy_of(b=0.1))[0] == A, "load first"


def test_round_robin_ignores_what_is_held_and_records_it_anyway() -> None:
    chooser = PrefillChooser(ROUND_ROBIN)
    chosen = [chooser.choose([B, A], PROMPT, busy_of(a=5.0))[0].id for _ in range(4)]
    assert chosen == ["a", "b", "a", "b"]
    assert chooser.index.overlap("b", PROMPT) == len(PROMPT)


def test_longest_prefix_follows_any_overlap_whatever_the_load() -> None:
    chooser = PrefillChooser(LONGEST_PREFIX)
    chooser.index.store("b", PROMPT[:1])
    assert chooser.choose([A, B], PROMPT, busy_of(b=9.0))[0] == B
    assert chooser.choose([A, B], [50], busy_of(a=0.2))[0] == B, "a miss goes by load"
    assert chooser.choose([A, B], [51], busy_of())[0] == A, "then by id"


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="prefill policy"):
        PrefillChooser("longest")
    with pytest.raises(ValueError):
        PrefillChooser(cache_threshold=0)
