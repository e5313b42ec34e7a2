"""Embedders: the protocol, the offline local model, the OpenAI-compatible endpoint, hashing."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from yak_pipeline.embeddings import Embedder, EmbeddingError, get_embedder
from yak_pipeline.embeddings.hashing import HashingEmbedder
from yak_pipeline.embeddings.openai_embedder import OpenAIEmbedder
from yak_pipeline.settings import Settings, SettingsError


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def test_hashing_embedder_is_deterministic_unit_length_and_named_for_what_it_is() -> None:
    embedder = HashingEmbedder(384)
    assert isinstance(embedder, Embedder)
    a, b = embedder.embed_documents(["User lives in Berlin.", "User lives in Berlin."])
    assert a == b and len(a) == 384 and math.isclose(_cosine(a, a), 1.0, rel_tol=1e-9)
    assert "hashing" in embedder.model_name
    near = _cosine(embedder.embed_query("User lives in Berlin"), embedder.embed_query("User lives in Berlin now"))
    far = _cosine(embedder.embed_query("User lives in Berlin"), embedder.embed_query("favourite pasta recipe"))
    assert near > far


def test_local_model_runs_offline_and_ranks_by_meaning() -> None:
    embedder = get_embedder(Settings(embedder="local"))
    assert (embedder.model_name, embedder.dimensions) == ("all-MiniLM-L6-v2", 384)
    query = embedder.embed_query("Where does the user live?")
    city, food = embedder.embed_documents(["User lives in Berlin.", "User likes spicy noodles."])
    assert len(city) == 384 and math.isclose(_cosine(city, city), 1.0, rel_tol=1e-5)
    assert _cosine(query, city) > _cosine(query, food)
    assert get_embedder(Settings(embedder="local")) is embedder  # loaded once per process


def test_local_queries_run_without_torch_in_the_same_space_as_documents() -> None:
    """Queries go through the int8 ONNX export of the model; documents through the float32 one. A text's two
    vectors must be all but equal, long texts are cut as sentence-transformers cuts them, and the
    query path never imports torch (checked in a fresh process)."""
    embedder = get_embedder(Settings(embedder="local"))
    texts = ["what do I like to drink?", "I prefer strong black coffee over tea.",
             "When did Caroline go to the LGBTQ support group?", "word " * 600]
    for text, document in zip(texts, embedder.embed_documents(texts), strict=True):
        query = embedder.embed_query(text)
        assert len(query) == 384 and math.isclose(_cosine(query, query), 1.0, rel_tol=1e-5)
        assert _cosine(query, document) >= 0.98, text[:40]
    script = ("import sys; from yak_pipeline.embeddings.local import LocalMiniLMEmbedder;"
              "v = LocalMiniLMEmbedder().embed_query('hello'); print(len(v), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["384", "False"], done.stderr[-2000:]


def test_openai_embedder_through_a_real_loopback_server(openai_server) -> None:
    embedder = OpenAIEmbedder(base_url=openai_server.base_url, model="nomic-embed-text")
    assert embedder.dimensions == 768
    vectors = embedder.embed_documents(["one", "two", "three"])
    assert len(vectors) == 3 and all(len(v) == 768 for v in vectors)
    assert all(math.isclose(_cosine(v, v), 1.0, rel_tol=1e-6) for v in vectors)
    assert any(r.path.endswith("/embeddings") for r in openai_server.requests)


def test_openai_embedder_failure_is_one_line() -> None:
    # Nothing listens on the discard port: the connection is refused at once.
    embedder = OpenAIEmbedder(base_url="http://127.0.0.1:9/v1", model="m", dimensions=8, timeout_seconds=1, max_retries=0)
    with pytest.raises(EmbeddingError) as err:
        embedder.embed_query("hello")
    assert "\n" not in str(err.value)


def test_openai_embedder_needs_a_model() -> None:
    with pytest.raises(SettingsError, match="YAK_EMBED_MODEL"):
        get_embedder(Settings(embedder="openai", llm_base_url="http://127.0.0.1:9/v1"))


def test_the_query_model_is_built_once_to_compute_in_int8(tmp_path, monkeypatch) -> None:
    """The packaged model multiplies float32 matrices; the built one int8 (embeddings.query_model).
    It is built into the cache folder on first use, reused after, and gives the same vectors as the
    packaged model to a cosine of 0.98."""
    import numpy as np
    import onnx
    import onnxruntime

    from yak_pipeline.embeddings import query_model

    monkeypatch.setenv("YAK_MODEL_CACHE", str(tmp_path / "cache"))
    target = query_model.built_model_path()
    assert target.parent == tmp_path / "cache" and not target.exists()
    session = query_model.query_session(onnxruntime.SessionOptions())
    assert target.is_file() and session._model_path == str(target)
    built_ops = {node.op_type for node in onnx.load(str(target)).graph.node}
    packaged_ops = {node.op_type for node in onnx.load(str(query_model.packaged_model())).graph.node}
    assert "DynamicQuantizeLinear" in built_ops and "MatMulInteger" in built_ops
    assert "MatMulInteger" not in packaged_ops
    built_at = target.stat().st_mtime_ns
    assert query_model.query_session(onnxruntime.SessionOptions())._model_path == str(target)
    assert target.stat().st_mtime_ns == built_at  # reused, not built again
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no work files left behind

    packaged = onnxruntime.InferenceSession(str(query_model.packaged_model()), providers=["CPUExecutionProvider"])
    ids = np.asarray([[101, 2073, 2515, 1996, 5310, 2444, 1029, 102]], dtype=np.int64)  # "where does the user live?"
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    a, b = (s.run(None, feed)[0][0].mean(axis=0) for s in (session, packaged))
    assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) >= 0.98


def test_a_query_model_that_will_not_load_is_removed_and_queries_go_on(tmp_path, monkeypatch, caplog) -> None:
    import onnxruntime

    from yak_pipeline.embeddings import query_model

    monkeypatch.setenv("YAK_MODEL_CACHE", str(tmp_path))
    target = query_model.built_model_path()
    target.write_bytes(b"half a model")
    with caplog.at_level("WARNING", logger="yak.embeddings"):
        session = query_model.query_session(onnxruntime.SessionOptions())
    assert session._model_path == str(query_model.packaged_model())
    assert not target.exists()  # the next query builds it again
    [warning] = [r.getMessage() for r in caplog.records if r.name == "yak.embeddings"]
    assert "queries run the packaged model" in warning and "\n" not in warning


def test_documents_run_on_the_exported_model_with_the_vectors_of_sentence_transformers(tmp_path, monkeypatch) -> None:
    """Documents go through the float32 ONNX export (embeddings.document_model): built once into the
    cache folder and reused; every coordinate of its vectors within 1e-5 of sentence-transformers'
    for short, long (cut at 256 tokens) and non-English texts in one batch, whatever the batch; and
    a process that embeds documents with it never imports torch."""
    import numpy as np
    import onnxruntime

    from yak_pipeline.embeddings import document_model, local

    monkeypatch.setenv("YAK_MODEL_CACHE", str(tmp_path / "cache"))
    target = document_model.built_model_path()
    assert target.parent == tmp_path / "cache" and not target.exists()
    session = document_model.document_session(onnxruntime.SessionOptions())
    assert session is not None and target.is_file()
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no work files left behind
    built_at = target.stat().st_mtime_ns
    assert document_model.document_session(onnxruntime.SessionOptions()) is not None
    assert target.stat().st_mtime_ns == built_at  # reused, not built again

    texts = ["User lives in Berlin.", "what do I like to drink?", "Ich trinke gern Kaffee mit Hafermilch. ☕",
             "User: I started eating fish again.\nAssistant: Noted, no longer vegetarian then.", "word " * 600, "a"]
    got = np.asarray(local.onnx_vectors(session, texts, batch_size=4))
    want = local._load_model().encode(texts, normalize_embeddings=True, show_progress_bar=False)
    assert float(np.abs(got - want).max()) <= document_model.TOLERANCE
    alone = np.asarray([local.onnx_vectors(session, [text])[0] for text in texts])
    assert float(np.abs(alone - got).max()) <= 1e-6  # a text's vector does not depend on its batch

    script = ("import sys; from yak_pipeline.embeddings.local import LocalMiniLMEmbedder;"
              "v = LocalMiniLMEmbedder().embed_documents(['hello', 'world']); print(len(v[1]), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["384", "False"], done.stderr[-2000:]


def test_a_document_model_that_will_not_load_is_removed_and_documents_run_on_torch(tmp_path, monkeypatch,
                                                                                   caplog) -> None:
    import numpy as np
    import onnxruntime

    from yak_pipeline.embeddings import document_model, local

    monkeypatch.setenv("YAK_MODEL_CACHE", str(tmp_path))
    target = document_model.built_model_path()
    target.write_bytes(b"half a model")
    with caplog.at_level("WARNING", logger="yak.embeddings"):
        assert document_model.document_session(onnxruntime.SessionOptions()) is None
    assert not target.exists()  # the next process builds it again
    [warning] = [r.getMessage() for r in caplog.records if r.name == "yak.embeddings"]
    assert "documents run on sentence-transformers" in warning and "\n" not in warning

    target.write_bytes(b"half a model")
    monkeypatch.setattr(local, "_DOCUMENT_MODEL", None)  # as in a new process
    texts = ["User lives in Berlin.", "User likes spicy noodles."]
    vectors = local.LocalMiniLMEmbedder().embed_documents(texts)
    assert local._DOCUMENT_MODEL is False  # known unavailable: not tried again in this process
    want = local._load_model().encode(texts, normalize_embeddings=True, show_progress_bar=False)
    assert float(np.abs(np.asarray(vectors) - want).max()) <= 1e-6
