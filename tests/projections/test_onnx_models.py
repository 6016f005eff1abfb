"""The default model: the pinned all-MiniLM-L6-v2 file's int8-compute graph, derived by
onnxruntime once into the models cache and reused; its vectors agree with the source's;
its id is not the source's, and a store of the old default refuses it by name."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from tests.projections.projection_helpers import memory, positioned

from memstream.bench.paraphrase import load_facts
from memstream.domain.events import Scope
from memstream.projections.embedder import EmbedderConfigError, build_embedder, embed_array
from memstream.projections.onnx_embedder import (
    BUILTIN_MODEL,
    SOURCE_MODEL,
    OnnxEmbedder,
    OnnxModelError,
    builtin_model,
    file_sha256,
)
from memstream.projections.onnx_models import derived_model_file
from memstream.projections.projector import Projector
from memstream.projections.store import EmbedderMismatchError, LanceStore
from memstream.settings import Settings

ALICE = Scope(team_id="acme", user_id="alice")

# measured on the paraphrase set's 192 facts and questions: min 0.9856, mean 0.9929
# (600 LoCoMo turns: min 0.9787, mean 0.9912; docs/benchmarks.md, issue 21, session 16)
COSINE_FLOOR = 0.98
MEAN_COSINE_FLOOR = 0.99


@pytest.fixture(scope="module")
def default() -> OnnxEmbedder:
    emb = build_embedder(Settings())  # as a fresh install gets it
    assert isinstance(emb, OnnxEmbedder)
    return emb


@pytest.fixture(scope="module")
def source() -> OnnxEmbedder:
    emb = build_embedder(Settings(onnx_model=SOURCE_MODEL))
    assert isinstance(emb, OnnxEmbedder)
    return emb


def test_the_default_runs_int8_compute_derived_from_the_pinned_file(default: OnnxEmbedder) -> None:
    pinned = builtin_model()
    file = default.model.model_file
    assert file.parent == Settings().models_dir and pinned.model_sha256[:12] in file.name  # type: ignore[index]
    assert default.model_id == f"{BUILTIN_MODEL}:{file_sha256(file)[:12]}"
    assert default.dim == 384
    ops = {node.op_type for node in onnx.load(str(file)).graph.node}
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" in ops  # int8 products, not folded floats
    source_ops = {node.op_type for node in onnx.load(str(pinned.model_file)).graph.node}
    assert "MatMulInteger" not in source_ops


def test_its_vectors_agree_with_the_source_models(default: OnnxEmbedder, source: OnnxEmbedder) -> None:
    facts = load_facts()
    texts = [f.text for f in facts] + [f.question for f in facts]
    cosines = np.sum(embed_array(default, texts) * embed_array(source, texts), axis=1)
    assert cosines.min() >= COSINE_FLOOR and cosines.mean() >= MEAN_COSINE_FLOOR, (cosines.min(), cosines.mean())
    # activations are quantised per run, so a batch moves a vector a little, no more
    alone = np.stack([embed_array(default, [t])[0] for t in texts[:40]])
    assert np.sum(alone * embed_array(default, texts[:40]), axis=1).min() >= COSINE_FLOOR


def test_the_old_default_stays_selectable_and_its_id_differs(default: OnnxEmbedder, source: OnnxEmbedder) -> None:
    assert source.model_id == f"{SOURCE_MODEL}:{builtin_model().model_sha256[:12]}"  # type: ignore[index]
    assert source.model.model_file == builtin_model().model_file
    assert default.model_id != source.model_id and default.model_id.split(":")[0] != SOURCE_MODEL


def test_a_store_of_the_old_default_refuses_the_new_one_naming_both(
    tmp_path: Path, default: OnnxEmbedder, source: OnnxEmbedder
) -> None:
    store = LanceStore(tmp_path / "lance", embedding_dim=384)
    Projector(store, source).apply(positioned([memory(ALICE, "m1", "Alice prefers window seats")]))
    with pytest.raises(EmbedderMismatchError) as refused:
        Projector(store, default)
    assert source.model_id in str(refused.value) and default.model_id in str(refused.value)
    assert "replay" in str(refused.value)


def _seeded_cache(models_dir: Path, default: OnnxEmbedder) -> tuple[Path, Path]:
    """A models cache holding the run's built graph (so the test builds at most once)."""
    models_dir.mkdir()
    built = default.model.model_file
    shutil.copy(built, models_dir / built.name)
    shutil.copy(built.with_name(built.name + ".sha256"), models_dir / (built.name + ".sha256"))
    return models_dir / built.name, models_dir / (built.name + ".sha256")


def test_the_cache_is_reused_and_a_damaged_file_is_built_again_by_one_process(
    tmp_path: Path, default: OnnxEmbedder
) -> None:
    pinned = builtin_model()
    target, digest_file = _seeded_cache(tmp_path / "models", default)
    before = target.stat()
    path, digest, built = derived_model_file(pinned.model_file, pinned.model_sha256, tmp_path / "models")  # type: ignore[arg-type]
    assert (path, built) == (target, False)
    after = target.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # nothing written
    assert digest == file_sha256(default.model.model_file)

    with open(target, "r+b") as fh:  # a partial file, as a killed copy would leave
        fh.truncate(before.st_size // 2)
    results: list[tuple[Path, str, bool]] = []
    # a worker and an API starting together: one builds, the other waits and reuses it
    racers = [
        threading.Thread(
            target=lambda: results.append(
                derived_model_file(pinned.model_file, pinned.model_sha256, tmp_path / "models")  # type: ignore[arg-type]
            )
        )
        for _ in range(2)
    ]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    assert sorted(built for _, _, built in results) == [False, True]
    assert {digest for _, digest, _ in results} == {digest}  # the build is byte-for-byte the same
    assert file_sha256(target) == digest_file.read_text().strip() == digest
    assert [p.name for p in (tmp_path / "models").iterdir() if p.name.startswith(".build-")] == []


def test_a_cache_that_cannot_be_written_is_a_clear_error(tmp_path: Path) -> None:
    pinned = builtin_model()
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    with pytest.raises(OnnxModelError, match="cannot build"):
        derived_model_file(pinned.model_file, pinned.model_sha256, blocked)  # type: ignore[arg-type]
    with pytest.raises(EmbedderConfigError, match="cannot build"):
        build_embedder(Settings(models_dir=blocked / "models"))
