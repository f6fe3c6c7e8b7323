"""``bench_encode.py --encoders``: the numbers of encoder processes it measures, 1 among them."""

from __future__ import annotations

import argparse

import pytest

from tests.unit.scripts.loader import load

bench_encode = load("bench_encode")


def test_counts_are_taken_in_the_order_given() -> None:
    assert bench_encode.encoder_counts("1") == [1]
    assert bench_encode.encoder_counts("2,1,4") == [2, 1, 4]


@pytest.mark.parametrize("text", ["2", "1,1", "0,1", "1,-2", "1,two", ""])
def test_counts_without_1_repeated_below_1_or_not_numbers_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        bench_encode.encoder_counts(text)
