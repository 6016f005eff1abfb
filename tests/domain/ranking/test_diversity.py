"""Diversity among near-repeats (``memstream.domain.ranking.diversity``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from memstream.domain.ranking.diversity import diversify, jaccard, repeat

W = {
    "a": frozenset({"greta", "find", "job", "stress", "monday"}),
    "b": frozenset({"farid", "find", "job", "stress", "monday"}),
    "c": frozenset({"greta", "work", "nurse", "hospit"}),
}
S = {"a": 1.0, "b": 0.95, "c": 0.8}


def test_a_near_repeat_gives_its_place_to_a_different_memory() -> None:
    assert diversify(["a", "b", "c"], S, W, 0.5, 2) == ["a", "c", "b"]
    assert diversify(["a", "b", "c"], S, W, 0.0, 2) == ["a", "b", "c"]  # off


def test_a_small_overlap_is_no_repeat() -> None:
    # "lives in a houseboat on the canal" / "sister lives in Lisbon": one word of five
    assert repeat(frozenset({"live", "houseboat", "canal"}), frozenset({"sister", "live", "lisbon"})) == 0.0
    assert repeat(W["a"], W["a"]) == 1.0
    assert jaccard(frozenset(), frozenset()) == 0.0


def test_a_memory_never_goes_above_its_successor() -> None:
    # "b" is superseded by "c": however redundant "c" is, "b" waits for it
    words = {**W, "c": W["a"]}
    got = diversify(["a", "b", "c"], S, words, 1.0, 3, after={"b": "c"})
    assert got.index("c") < got.index("b")


@given(st.lists(st.sampled_from(list(W)), unique=True), st.floats(0, 1), st.integers(0, 5))
def test_diversify_only_reorders(order: list[str], weight: float, places: int) -> None:
    got = diversify(order, S, W, weight, places)
    assert sorted(got) == sorted(order)
    if order:
        assert got[0] == order[0] or S[got[0]] >= S[order[0]]  # the first place is the best score


def test_once_its_successor_is_placed_a_memory_takes_its_own_place() -> None:
    words = {"n": frozenset({"lyon"}), "o": frozenset({"paris"}), "f": frozenset({"budget"})}
    scores = {"n": 1.0, "o": 0.5, "f": 0.1}
    assert diversify(["n", "o", "f"], scores, words, 0.5, 2, after={"o": "n"}) == ["n", "o", "f"]
