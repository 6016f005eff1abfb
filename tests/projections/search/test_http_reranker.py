"""The reranker behind an HTTP ``/rerank`` endpoint: over real HTTP to the scripted
OpenAI-compatible server's rerank route, and inside a real search on LanceDB tables
on disk (the local embedder)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tests.fakes.openai_server import FakeOpenAI, Reply, fake_llm  # noqa: F401 - the fixture
from tests.projections.projection_helpers import DIM, memory, positioned

from memstream.domain.events import Scope
from memstream.projections.embedders.factory import LocalEmbedder
from memstream.projections.search.http_reranker import RERANK_CANDIDATES, HttpReranker, build_reranker, rerank_endpoint
from memstream.projections.projector.projector import Projector
from memstream.projections.search.hybrid import search
from memstream.projections.store.lance_store import LanceStore
from memstream.settings.model import Settings

EMB = LocalEmbedder(DIM)
ALICE = Scope(team_id="acme", user_id="alice")
QUERY = "which city did Ana move to for her new job"
MEMORIES = [
    ("tea", "Ana drinks green tea every morning"),
    ("move", "Ana moved to Porto for a new job as a nurse"),
    ("sister", "Ana's sister lives in Oslo"),
    ("job", "the new job starts in March"),
]


def _store(tmp_path: Path) -> LanceStore:
    store = LanceStore(tmp_path / "lance", embedding_dim=DIM)
    Projector(store, EMB).apply(positioned([memory(ALICE, mid, text) for mid, text in MEMORIES]))
    return store


def test_the_endpoint_is_the_base_url_plus_rerank_unless_it_names_the_route() -> None:
    assert rerank_endpoint("http://127.0.0.1:8080/v1") == "http://127.0.0.1:8080/v1/rerank"
    assert rerank_endpoint("http://127.0.0.1:8080/v1/rerank/") == "http://127.0.0.1:8080/v1/rerank"
    assert rerank_endpoint("https://api.example.com/v1/reranking") == "https://api.example.com/v1/reranking"


def test_the_reranker_orders_the_top_results_by_the_endpoints_scores(tmp_path: Path, fake_llm: FakeOpenAI) -> None:
    store = _store(tmp_path)
    plain = search(store, EMB, ALICE, QUERY, k=4)
    # scores that reverse memstream's order: the reranker alone decides
    fake_llm.rerank.push(Reply(scores=[float(i) for i in range(len(MEMORIES))]))
    reranker = HttpReranker(fake_llm.base_url, model="bge-reranker", api_key="secret", top_n=4)
    try:
        reranked = search(store, EMB, ALICE, QUERY, k=4, reranker=reranker)
    finally:
        reranker.close()
    (body,) = fake_llm.rerank.requests
    assert body["query"] == QUERY and body["model"] == "bge-reranker" and body["top_n"] == 4
    # the reranker sees every candidate in memstream's order (plain search drops the unscored)
    docs = body["documents"]
    assert len(docs) == len(MEMORIES) and docs[: len(plain)] == [r.content for r in plain]
    assert [r.content for r in reranked] == list(reversed(docs))
    assert [r.parts.rerank for r in reranked] == [3.0, 2.0, 1.0, 0.0]


def test_only_the_top_n_are_reranked_and_the_rest_keep_their_order(tmp_path: Path, fake_llm: FakeOpenAI) -> None:
    store = _store(tmp_path)
    plain = search(store, EMB, ALICE, QUERY, k=4)
    reranker = HttpReranker(fake_llm.base_url, top_n=2)
    try:
        fake_llm.rerank.push(Reply(scores=[0.1, 0.9]))
        reranked = search(store, EMB, ALICE, QUERY, k=4, reranker=reranker)
    finally:
        reranker.close()
    ids = [r.memory_id for r in plain]
    got = [r.memory_id for r in reranked]
    assert got[:2] == [ids[1], ids[0]] and got[2 : len(ids)] == ids[2:]  # the rest keep their order
    assert [r.parts.rerank for r in reranked[2:]] == [None] * (len(reranked) - 2)
    assert len(fake_llm.rerank.requests[0]["documents"]) == 2


def test_the_default_fake_scores_word_overlap(tmp_path: Path, fake_llm: FakeOpenAI) -> None:
    reranker = HttpReranker(fake_llm.base_url)
    try:
        scores = reranker.scores("new job city", ["a new job in a new city", "green tea", "the job"])
    finally:
        reranker.close()
    assert scores == [1.0, 0.0, pytest.approx(1 / 3)]


@pytest.mark.parametrize(
    "reply",
    [
        Reply(status=500, error_message="model not loaded"),
        Reply(raw=b"not json", status=200),
        Reply(raw=b'{"results": [{"index": 0, "relevance_score": 1.0}]}', status=200),  # one score for two
        Reply(raw=b'{"results": [{"index": 7, "relevance_score": 1.0}, {"index": 0, "score": 2}]}', status=200),
    ],
    ids=["http_500", "garbage", "missing_scores", "bad_index"],
)
def test_a_failed_rerank_keeps_memstreams_order(
    tmp_path: Path, fake_llm: FakeOpenAI, reply: Reply, caplog: pytest.LogCaptureFixture
) -> None:
    store = _store(tmp_path)
    plain = search(store, EMB, ALICE, QUERY, k=2)
    fake_llm.rerank.push(reply)
    reranker = HttpReranker(fake_llm.base_url, top_n=2)
    try:
        with caplog.at_level(logging.WARNING):
            kept = search(store, EMB, ALICE, QUERY, k=2, reranker=reranker)
    finally:
        reranker.close()
    assert [r.memory_id for r in kept] == [r.memory_id for r in plain]
    assert all(r.parts.rerank is None for r in kept)
    assert "memstream's order kept" in caplog.text


def test_a_bare_list_answer_with_score_is_read_too(fake_llm: FakeOpenAI) -> None:
    fake_llm.rerank.push(Reply(raw=b'[{"index": 1, "score": 0.5}, {"index": 0, "score": 0.25}]', status=200))
    reranker = HttpReranker(fake_llm.base_url)
    try:
        assert reranker.scores("q", ["a", "b"]) == [0.25, 0.5]
    finally:
        reranker.close()


def test_settings_build_a_reranker_only_when_a_url_is_set(fake_llm: FakeOpenAI) -> None:
    assert build_reranker(Settings(rerank_url=None).embeddings) is None
    built = build_reranker(Settings(rerank_url=fake_llm.base_url, rerank_model="m").embeddings)
    assert built is not None
    try:
        assert (built.endpoint, built.top_n, built.model) == (fake_llm.base_url + "/rerank", RERANK_CANDIDATES, "m")
    finally:
        built.close()
