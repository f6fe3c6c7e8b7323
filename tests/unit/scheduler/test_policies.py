"""Assignment policies: exact sequences, split ratios, adaptive choices, routing overlap."""

from __future__ import annotations

from dataclasses import replace

import pytest

from epd.common.errors import InvalidArgument
from epd.scheduler.model import EncodeItem
from epd.scheduler.policies.encoders import (
    AdaptivePolicy,
    EncoderView,
    PerImagePolicy,
    PerRequestPolicy,
    parse_split_ratio,
)
from epd.scheduler.policies.routing import PrefixIndex
from epd.scheduler.policies.swrr import SmoothWeightedRoundRobin


def test_smooth_weighted_round_robin_interleaves_by_weight() -> None:
    picker = SmoothWeightedRoundRobin()
    picks = "".join(picker.pick([("a", 5), ("b", 1), ("c", 1)]) for _ in range(7))
    assert picks == "aabacaa"


def test_swrr_equal_weights_is_round_robin_and_survives_candidate_changes() -> None:
    picker = SmoothWeightedRoundRobin()
    assert [picker.pick([("a", 1), ("b", 1)]) for _ in range(4)] == ["a", "b", "a", "b"]
    assert [picker.pick([("b", 1), ("c", 1)]) for _ in range(2)] == ["b", "c"]
    with pytest.raises(ValueError):
        picker.pick([])


GPU = EncoderView("gpu", device="cuda:0")
CPU = EncoderView("cpu", device="cpu")


def items(count: int, prefix: str = "h") -> list[EncodeItem]:
    return [EncodeItem(f"{prefix}{i}") for i in range(count)]


def test_per_image_splits_one_request_and_per_request_keeps_it_together() -> None:
    assert PerImagePolicy().assign(items(4), [CPU, GPU]) == ["cpu", "gpu", "cpu", "gpu"]
    per_request = PerRequestPolicy(parse_split_ratio("2:1"))
    picks = [per_request.assign(items(3), [CPU, GPU]) for _ in range(3)]
    assert picks == [["gpu"] * 3, ["cpu"] * 3, ["gpu"] * 3]


def test_split_ratio_maps_onto_device_classes() -> None:
    policy = PerImagePolicy(parse_split_ratio("8:1"))
    sequence = policy.assign(items(9), [CPU, GPU])
    assert sequence.count("gpu") == 8 and sequence.count("cpu") == 1


@pytest.mark.parametrize("text", ["8", "8:1:1", "a:b", "0:1", "-1:2", "inf:1", ""])
def test_bad_split_ratios_say_what_is_expected(text: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_split_ratio(text)
    assert caught.value.reason == "BAD_SPLIT_RATIO" and "8:1" in caught.value.message


def test_adaptive_keeps_small_requests_on_the_fast_encoder_at_low_load() -> None:
    fast = EncoderView("gpu", "cuda", service_ms=10)
    slow = EncoderView("cpu", "cpu", service_ms=80)
    assert AdaptivePolicy().assign(items(4), [slow, fast]) == ["gpu"] * 4


def test_adaptive_gives_the_slow_encoder_its_useful_share_under_load() -> None:
    fast = EncoderView("gpu", "cuda", backlog_items=10, service_ms=10)
    slow = EncoderView("cpu", "cpu", backlog_items=0, service_ms=80)
    assert AdaptivePolicy().assign(items(3), [slow, fast]) == ["cpu", "gpu", "gpu"]


def test_adaptive_prefers_the_encoder_that_caches_the_image() -> None:
    fast = EncoderView("gpu", "cuda", service_ms=10)
    slow = EncoderView("cpu", "cpu", service_ms=80, cached=frozenset({"h0"}))
    assert AdaptivePolicy().assign(items(1), [slow, fast]) == ["cpu"]


def test_adaptive_without_statistics_follows_the_weights() -> None:
    policy = AdaptivePolicy(parse_split_ratio("3:1"))
    assert policy.assign(items(4), [CPU, GPU]) == ["gpu", "gpu", "gpu", "cpu"]
    # the third item ties (both finish at 1 unit); ties rotate between calls
    assert policy.assign(items(4), [CPU, GPU]) == ["gpu", "gpu", "cpu", "gpu"]
    mixed = policy.service_times([EncoderView("gpu", "cuda", service_ms=10), CPU])
    assert mixed == {"gpu": 10, "cpu": 30}


def test_adaptive_probes_a_stale_idle_encoder_with_one_item() -> None:
    fast = EncoderView("gpu", "cuda", service_ms=10)
    stale = EncoderView("cpu", "cpu", service_ms=80, is_stale=True)
    assert AdaptivePolicy().assign(items(3), [stale, fast]) == ["cpu", "gpu", "gpu"]
    busy = replace(stale, backlog_items=1)  # a completion is on its way: no probe needed
    assert AdaptivePolicy().assign(items(3), [busy, fast]) == ["gpu"] * 3
    cached = replace(fast, cached=frozenset({"h0"}))  # a cache hit is not spent on a probe
    assert AdaptivePolicy().assign(items(1), [stale, cached]) == ["gpu"]


def test_adaptive_treats_near_equal_completion_times_as_ties() -> None:
    a, b = EncoderView("a", service_ms=10.0), EncoderView("b", service_ms=10.2)
    policy = AdaptivePolicy()
    assert sorted(policy.assign(items(1), [a, b])[0] for _ in range(4)) == ["a", "a", "b", "b"]
    far = EncoderView("b", service_ms=13.0)  # more than a quarter of an item slower
    assert {policy.assign(items(1), [a, far])[0] for _ in range(4)} == {"a"}


def test_prefix_index_counts_leading_blocks_only() -> None:
    index = PrefixIndex(max_blocks_per_worker=4)
    index.store("p1", [1, 2, 3])
    assert index.overlap("p1", [1, 2, 3, 4]) == 3
    assert index.overlap("p1", [9, 2, 3]) == 0
    index.remove("p1", [2])
    assert index.overlap("p1", [1, 2, 3]) == 1
    index.store("p1", [5, 6, 7, 8])
    assert index.num_blocks("p1") == 4 and index.overlap("p1", [1]) == 0


def test_adaptive_costs_items_by_size_relative_to_the_mean() -> None:
    # the gpu is 30 ms behind; per mean-sized item it takes 10 ms, the cpu 40 ms: a plain count
    # ties (40 vs 40), a big item finishes first on the gpu, a small one on the idle cpu.
    fast = EncoderView("gpu", "cuda", service_ms=10, backlog_ms=30)
    slow = EncoderView("cpu", "cpu", service_ms=40, backlog_ms=0)
    policy = AdaptivePolicy()
    assert policy.assign([EncodeItem("a", 200), EncodeItem("b", 200)], [slow, fast]) == [
        "gpu",
        "cpu",
    ]  # sizes unknown to the policy: one unit each (the 40 ms tie rotates)
    policy.observe([EncodeItem("prime", 100)])
    assert policy.assign([EncodeItem("big", 200)], [slow, fast]) == ["gpu"]
    assert policy.assign([EncodeItem("small", 50)], [slow, fast]) == ["cpu"]
    assert AdaptivePolicy().units(EncodeItem("unseen", 500)) == 1.0  # no sizes seen yet
