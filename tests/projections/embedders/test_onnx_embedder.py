"""The ONNX embedder: all-MiniLM-L6-v2 from a registry package, run by onnxruntime
offline; models from a local directory; the pins; one model per table. The batching
mechanics are checked exactly on the source graph (float compute: a text's vector does
not depend on its batch); the default's int8 graph is tests/projections/embedders/test_onnx_models.py."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.projections.projection_helpers import memory, positioned

from memstream.domain.events import Scope
from memstream.projections.embedders import onnx_embedder
from memstream.projections.embedders.factory import (
    EmbedderConfigError,
    LocalEmbedder,
    build_embedder,
    embed_array,
    embed_query,
    warm_up,
)
from memstream.projections.embedders.onnx_embedder import OnnxEmbedder, token_batches
from memstream.projections.embedders.onnx_models import (
    SOURCE_MODEL,
    OnnxModel,
    OnnxModelError,
    file_sha256,
    resolve_model,
    source_model,
)
from memstream.projections.projector.projector import Projector
from memstream.projections.search.hybrid import search, vector_search
from memstream.projections.store.lance_store import EmbedderMismatchError, LanceStore
from memstream.settings.model import Settings

ALICE = Scope(team_id="acme", user_id="alice")


@pytest.fixture(scope="module")
def minilm() -> OnnxEmbedder:
    """The source graph as shipped (float compute), selected by its name."""
    emb = build_embedder(Settings(onnx_model=SOURCE_MODEL).embeddings)
    assert isinstance(emb, OnnxEmbedder)
    return emb


@pytest.fixture(scope="module")
def default() -> OnnxEmbedder:
    """The default (int8 compute), as a fresh install gets it."""
    emb = build_embedder(Settings().embeddings)
    assert isinstance(emb, OnnxEmbedder)
    return emb


def test_the_source_model_is_the_pinned_minilm_and_its_id_names_the_file(minilm: OnnxEmbedder) -> None:
    model = source_model()
    assert file_sha256(model.model_file) == model.model_sha256
    assert file_sha256(model.tokenizer_file) == model.tokenizer_sha256
    assert minilm.model_id == f"{SOURCE_MODEL}:{model.model_sha256[:12]}"  # type: ignore[index]
    assert minilm.dim == 384


def test_vectors_are_normalised_deterministic_and_in_input_order(minilm: OnnxEmbedder) -> None:
    texts = ["Alice has two cats", "x", "A much longer sentence about a trip to Lisbon in the spring of 2023"]
    batch = embed_array(minilm, texts)
    assert batch.shape == (3, 384) and batch.dtype == np.float32
    assert np.allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    one_by_one = np.stack([embed_array(minilm, [t])[0] for t in texts])
    assert np.allclose(batch, one_by_one, atol=1e-6)  # a text's batch does not move it
    assert np.array_equal(batch, embed_array(minilm, texts))
    assert embed_array(minilm, []).shape == (0, 384)


def _mixed_texts() -> list[str]:
    """Texts of many lengths, enough for several batches of eight."""
    people = ["Alice", "Bob", "Caroline", "Dmitri", "Eun-ji"]
    facts = ["likes tea", "moved to Lisbon in the spring after her second year at the conservatory",
             "has a dog named Pepper who is afraid of thunderstorms and hides under the stairs",
             "works nights", "plays chess every Thursday at the library with his grandfather"]
    return [f"{p}: {f}" + " really" * (i % 7) for i, (p, f) in enumerate((p, f) for p in people for f in facts)]


def test_parallel_one_thread_runs_give_the_vectors_of_one_sequential_multithreaded_run(
    minilm: OnnxEmbedder,
) -> None:
    texts = [f"{text} (take {take})" for take in range(3) for text in _mixed_texts()]
    lengths = np.array([len(t.split()) for t in texts])  # a lower bound of the tokens
    assert minilm.parallel_runs >= 1 and len(token_batches(lengths, np.argsort(lengths), minilm.batch_tokens)) > 3
    sequential = OnnxEmbedder(source_model(), threads=2, parallel_runs=1)  # as before this change
    side_by_side = OnnxEmbedder(source_model(), threads=2, parallel_runs=2)
    reference = embed_array(sequential, texts)
    assert np.allclose(embed_array(side_by_side, texts), reference, atol=1e-6)
    assert np.allclose(embed_array(minilm, texts), reference, atol=1e-6)
    alone = np.stack([embed_array(sequential, [t])[0] for t in texts])
    assert np.allclose(alone, reference, atol=1e-6)  # a text's batch does not move it


def test_token_batches_keep_each_runs_padded_size_within_the_budget() -> None:
    lengths = np.array([30, 5, 5, 300, 12, 5, 40, 12, 64])
    order = np.argsort(lengths, kind="stable")
    batches = token_batches(lengths, order, 64)
    assert np.array_equal(np.concatenate(batches), order)  # every row once, in length order
    assert [lengths[b].tolist() for b in batches] == [[5, 5, 5, 12, 12], [30], [40], [64], [300]]
    assert all(len(b) * lengths[b].max() <= 64 for b in batches if len(b) > 1)
    assert [len(b) for b in token_batches(lengths, order, 1)] == [1] * len(lengths)
    assert token_batches(lengths[:0], order[:0], 64) == []


def test_the_token_budget_does_not_move_a_vector(minilm: OnnxEmbedder) -> None:
    """Batches of many short texts or a few long ones give each text the vector it gets
    alone, in one sequential run, or in one big batch (real model output)."""
    texts = [*_mixed_texts(), "ok", "Caroline: " + "the long walk home along the river " * 12]
    alone = OnnxEmbedder(source_model(), batch_tokens=1, parallel_runs=1)
    one_batch = OnnxEmbedder(source_model(), batch_tokens=100_000, parallel_runs=1)
    reference = embed_array(alone, texts)
    assert np.allclose(embed_array(one_batch, texts), reference, atol=1e-6)
    assert np.allclose(embed_array(minilm, texts), reference, atol=1e-6)
    assert np.allclose(embed_array(OnnxEmbedder(source_model(), batch_tokens=64), texts), reference, atol=1e-6)


def test_a_warmed_embedder_loads_nothing_on_its_first_call_of_several_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker or a model server warms its embedder at start, so that its first batch
    call does not load the side-by-side session on that call's clock."""
    emb = OnnxEmbedder(source_model(), parallel_runs=2)
    warm_up(emb)
    loads: list[tuple[Any, ...]] = []
    real_load = onnx_embedder._load
    monkeypatch.setattr(onnx_embedder, "_load", lambda *args: loads.append(args) or real_load(*args))
    texts = [f"{text} (take {take})" for take in range(3) for text in _mixed_texts()]
    vectors = embed_array(emb, texts)
    assert loads == []  # nothing loaded by the call itself
    reference = embed_array(OnnxEmbedder(source_model(), batch_tokens=1, parallel_runs=1), texts)
    assert np.allclose(vectors, reference, atol=1e-6)  # and the vectors are those of one run per text
    warm_up(LocalEmbedder(16))  # embedders without a warm-up are left as they are


def test_a_text_repeated_in_a_call_is_embedded_once(minilm: OnnxEmbedder, monkeypatch: pytest.MonkeyPatch) -> None:
    texts = _mixed_texts()[:10]
    repeated = [*texts, texts[3], texts[0], texts[3]]
    ran: list[int] = []
    real = minilm._run_batch
    monkeypatch.setattr(minilm, "_run_batch", lambda s, enc, width: ran.append(len(enc)) or real(s, enc, width))
    vectors = embed_array(minilm, repeated)
    assert sum(ran) == len(texts)
    assert np.array_equal(vectors[:10], embed_array(minilm, texts))
    assert np.array_equal(vectors[10:], vectors[[3, 0, 3]])


@pytest.mark.parametrize("model", ["source", "default"])
def test_a_paraphrase_is_nearer_than_other_facts_about_the_same_person(
    model: str, minilm: OnnxEmbedder, default: OnnxEmbedder
) -> None:
    minilm = minilm if model == "source" else default
    query = embed_query(minilm, "Where does Alice like to sit on a plane?")
    facts = ["Alice prefers window seats", "Alice works as a nurse in Boston", "Alice has two cats",
             "Alice was born in 1990", "Alice's brother plays the cello"]
    sims = embed_array(minilm, facts) @ query
    assert int(np.argmax(sims)) == 0, sims
    # the lexical embedder cannot see it: no content word is shared but the name
    local = LocalEmbedder(384)
    lexical = embed_array(local, facts) @ embed_array(local, ["Where does Alice like to sit on a plane?"])[0]
    assert int(np.argmax(lexical)) != 0 or lexical[0] - sorted(lexical)[-2] < sims[0] - sorted(sims)[-2]


def test_repeated_queries_are_embedded_once(minilm: OnnxEmbedder, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    real = minilm._run
    monkeypatch.setattr(minilm, "_run", lambda texts: calls.append(list(texts)) or real(texts))
    text = "what did Alice cook on Sunday? (cache probe)"
    first = embed_query(minilm, text)
    second = embed_query(minilm, text)
    assert calls == [[text]] and np.array_equal(first, second)
    assert np.allclose(first, embed_array(minilm, [text])[0], atol=1e-6)


def _copy_model(dest: Path, *, pooling: str | None = None) -> Path:
    model = source_model()
    dest.mkdir()
    (dest / "onnx").mkdir()
    (dest / "onnx" / "model.onnx").symlink_to(model.model_file)
    shutil.copy(model.tokenizer_file, dest / "tokenizer.json")
    if pooling is not None:
        (dest / "1_Pooling").mkdir()
        cls = pooling == "cls"
        (dest / "1_Pooling" / "config.json").write_text(
            f'{{"pooling_mode_cls_token": {str(cls).lower()}, "pooling_mode_mean_tokens": {str(not cls).lower()}}}'
        )
    return dest


def test_any_model_directory_loads_by_path(tmp_path: Path, minilm: OnnxEmbedder) -> None:
    mean_dir = _copy_model(tmp_path / "my-minilm", pooling="mean")
    emb = build_embedder(Settings(embedder="onnx", onnx_model=str(mean_dir)).embeddings)
    assert isinstance(emb, OnnxEmbedder)
    assert emb.model_id == f"my-minilm:{minilm.model_id.split(':')[1]}"
    texts = ["Alice prefers window seats", "Bob sold his car"]
    assert np.allclose(embed_array(emb, texts), embed_array(minilm, texts), atol=1e-6)
    cls = OnnxEmbedder(resolve_model(str(_copy_model(tmp_path / "cls-pooled", pooling="cls"))))
    assert cls.model.pooling == "cls"
    assert not np.allclose(embed_array(cls, texts), embed_array(minilm, texts), atol=1e-3)


def test_bad_models_are_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(OnnxModelError, match="neither model.onnx"):
        resolve_model(str(tmp_path))
    with pytest.raises(EmbedderConfigError, match="no ONNX model 'no-such-model'"):
        build_embedder(Settings(embedder="onnx", onnx_model="no-such-model").embeddings)
    with pytest.raises(EmbedderConfigError, match="MEMSTREAM_EMBEDDINGS_DIM is 128"):
        build_embedder(Settings(embedder="onnx", onnx_model=SOURCE_MODEL, embedding_dim=128).embeddings)
    tampered = tmp_path / "tokenizer.json"
    tampered.write_text(source_model().tokenizer_file.read_text(encoding="utf-8") + " ", encoding="utf-8")
    pinned = source_model()
    with pytest.raises(OnnxModelError, match="not the pinned"):
        OnnxEmbedder(OnnxModel(**{**pinned.__dict__, "tokenizer_file": tampered}))


def test_vectors_of_two_models_never_share_a_table(tmp_path: Path, minilm: OnnxEmbedder) -> None:
    store = LanceStore(tmp_path / "lance", embedding_dim=384)
    local = LocalEmbedder(384)  # same width, other model
    Projector(store, local).apply(positioned([memory(ALICE, "m1", "Alice prefers window seats")]))
    assert store.vector_model() == local.model_id
    with pytest.raises(EmbedderMismatchError) as refused:
        Projector(store, minilm)
    assert local.model_id in str(refused.value) and minilm.model_id in str(refused.value)
    assert "replay" in str(refused.value)
    with pytest.raises(EmbedderMismatchError, match=minilm.model_id):
        search(store, minilm, ALICE, "window seat")
    assert [r.memory_id for r in search(store, local, ALICE, "window seat")] == ["m1"]


def test_the_projector_embeds_with_the_default_and_search_finds_a_paraphrase(
    tmp_path: Path, default: OnnxEmbedder
) -> None:
    minilm = default
    store = LanceStore(tmp_path / "lance", embedding_dim=384)
    facts = {
        "seat": "Alice prefers window seats",
        "job": "Alice works night shifts as a nurse in Boston",
        "pets": "Alice has two cats named Miso and Tofu",
        "music": "Alice's brother plays the cello in an orchestra",
        "food": "Alice is allergic to peanuts",
        "home": "Alice grew up in a small fishing village in Norway",
        "car": "Alice drives an old red Volvo",
        "fear": "Alice is afraid of spiders",
    }
    Projector(store, minilm).apply(positioned([memory(ALICE, k, v) for k, v in facts.items()]))
    assert store.vector_model() == minilm.model_id
    asked = {
        "seat": "Where does Alice like to sit on a plane?",
        "job": "What does Alice do for a living?",
        "pets": "Which animals live with Alice?",
        "food": "What can Alice not eat?",
    }
    # BM25 matches the name alone here, so its order is the facts' lengths: the model
    # must lift each answer into the top three of eight
    for key, question in asked.items():
        assert key in [r.memory_id for r in search(store, minilm, ALICE, question, k=3)], question
        assert vector_search(store, minilm, ALICE, question, k=1)[0].memory_id == key, question
