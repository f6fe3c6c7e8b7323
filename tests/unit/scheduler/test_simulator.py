"""The simulator reproduces the seed's claim and shows adaptive at least as good everywhere."""

from __future__ import annotations

import pytest

from epd.scheduler.sim.engine import PolicyResult, simulate
from epd.scheduler.sim.model import SCENARIOS

STATIC = ("per_image", "per_request")


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, PolicyResult]]:
    return {s.name: {r.policy: r for r in simulate(s)} for s in SCENARIOS}


def test_per_request_beats_per_image_with_an_8x_accelerator(results) -> None:
    seed = results["seed-8x"]
    assert seed["per_request"].throughput_rps > seed["per_image"].throughput_rps
    assert seed["per_request"].p99_ms < seed["per_image"].p99_ms


@pytest.mark.parametrize("scenario", [s.name for s in SCENARIOS])
def test_adaptive_is_at_least_the_best_static_policy(results, scenario: str) -> None:
    rows = results[scenario]
    best_throughput = max(rows[p].throughput_rps for p in STATIC)
    best_p99 = min(rows[p].p99_ms for p in STATIC)
    assert rows["adaptive"].throughput_rps >= best_throughput
    assert rows["adaptive"].p99_ms <= best_p99


def test_adaptive_recovers_from_a_wrong_split_ratio(results) -> None:
    rows = results["wrong-ratio"]
    best_static = max(rows[p].throughput_rps for p in STATIC)
    assert rows["adaptive"].throughput_rps >= 1.3 * best_static


def test_simulation_is_deterministic() -> None:
    scenario = next(s for s in SCENARIOS if s.name == "balanced")
    assert simulate(scenario) == simulate(scenario)


def test_adaptive_sends_big_images_where_they_finish_first(results) -> None:
    rows = results["mixed-sizes"]
    assert rows["adaptive"].throughput_rps >= rows["per_request"].throughput_rps
    assert rows["adaptive"].p99_ms <= 0.5 * rows["per_request"].p99_ms


@pytest.mark.parametrize("scenario", ["twins", "rejoin"])
def test_adaptive_splits_identical_encoders_within_60_40(results, scenario: str) -> None:
    split = results[scenario]["adaptive"].split
    assert len(split) == 2 and max(split.values()) <= 0.6, split
