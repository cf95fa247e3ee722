"""Rank lists folded into ranges, as the text, the TUI and the cluster report print them."""

from __future__ import annotations

import pytest

from ddpdoctor.rank_ranges import fold_ranks


@pytest.mark.parametrize(
    ("ranks", "kwargs", "text"),
    [
        ([5, 0, 1, 2, 3], {}, "0-3, 5"),
        ([0, 1, 4], {}, "0-1, 4"),
        ([0, 1, 4], {"min_run": 3}, "0, 1, 4"),
        ([7, 7, 8, 9], {"min_run": 3}, "7-9"),
        ([0, 2, 3, 4, 9], {"sep": ","}, "0,2-4,9"),
        ([], {}, "-"),
        ([], {"empty": "none"}, "none"),
        (range(1024), {"min_run": 3}, "0-1023"),
    ],
)
def test_fold_ranks(ranks, kwargs, text):
    assert fold_ranks(ranks, **kwargs) == text
