"""Carrying a database over to another embedder: ``yak distill re-embed --all`` (services.reembed)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
from typer.testing import CliRunner

from yak_pipeline.cli.main import app
from yak_pipeline.cli.parts import CliParts
from yak_pipeline.embeddings.hashing import HashingEmbedder
from yak_pipeline.services.exchange_embeddings import embed_pending_exchanges
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline.store.distillations import add_version
from yak_pipeline.store.migrations import read_meta
from yak_pipeline.store.vector_legs import vector_search
from yak_pipeline_tests.store_helpers import EMBEDDER, seed_memory_with_distillation

T0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
FACTS = [("I keep bees on the roof.", "User keeps bees on the roof."),
         ("My brother Tomas repairs old radios.", "User's brother Tomas repairs old radios."),
         ("We sail on the lake every August.", "User and others sail on the lake every August.")]


def _seed(database: Database) -> list[str]:
    ids = []
    with database.connection() as conn:
        for i, (said, fact) in enumerate(FACTS):
            _, distillation_id = seed_memory_with_distillation(
                conn, user_id="ivy", exchange=f"User: {said}\nAssistant: Noted.", distillation=fact,
                occurred_at=T0 + timedelta(minutes=i))
            ids.append(str(distillation_id))
        # A second version: its old vector stays history, the latest one is re-embedded.
        add_version(conn, ids[0], content="User keeps two hives of bees on the roof.",
                    embedding=EMBEDDER.embed_documents(["User keeps two hives of bees on the roof."])[0],
                    embedding_model=EMBEDDER.model_name, reason="manual")
    embed_pending_exchanges(database, EMBEDDER)
    return ids


def _dimensions(database: Database, table: str, column: str) -> set[int]:
    with database.connection() as conn:
        return {r[0] for r in conn.execute(
            f"SELECT vector_dims({column}) FROM {table} WHERE {column} IS NOT NULL")}  # noqa: S608 - fixed names


def test_re_embed_all_resizes_the_columns_and_makes_every_vector_again(
        database: Database, settings: Settings) -> None:
    ids = _seed(database)
    new = HashingEmbedder(256)
    settings = settings.model_copy(update={"embed_dimensions": 256})  # the new embedder's size
    cli = CliRunner()

    def invoke(args: list[str]):  # noqa: ANN202 - click's Result
        return cli.invoke(app, args, obj=CliParts.of(settings))  # a fresh command's parts, as a new process's

    # Before: the configured embedder does not fit the database, and every command says how to fix it.
    refused = invoke(["memory", "list", "--user", "ivy"])
    assert refused.exit_code != 0 and "yak distill re-embed --all" in refused.output

    done = invoke(["distill", "re-embed", "--all", "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert report["embedding_model"] == "feature-hashing-256"
    assert {"distillations.embedding", "distillation_versions.embedding", "memories.embedding",
            "memories.context_embedding"} <= set(report["resized"])
    assert (report["distillations"], report["exchanges"], report["contexts"]) == (3, 3, 3)
    assert report["relevance_model"] is False  # no fit shipped for this embedder: the text says what to run

    with database.connection() as conn:
        meta = read_meta(conn)
        assert (meta["embedding_dim"], meta["embedding_model"]) == ("256", "feature-hashing-256")
        stored = conn.execute("SELECT embedding, content FROM distillations WHERE id = %s", (ids[0],)).fetchone()
        assert np.allclose(np.asarray(stored[0].to_numpy() if hasattr(stored[0], "to_numpy") else stored[0]),
                           new.embed_documents([stored[1]])[0], atol=1e-6)
        versions = conn.execute("SELECT version, embedding_model FROM distillation_versions "
                                "WHERE distillation_id = %s ORDER BY version", (ids[0],)).fetchall()
        assert versions == [(1, None), (2, "feature-hashing-256")]  # history cleared by the resize, latest re-made
        # The indexes are back, and the new vectors are searchable.
        names = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE indexdef ILIKE '%USING hnsw%'")}
        assert {"distillations_embedding_hnsw", "memories_embedding_hnsw", "memories_context_embedding_hnsw"} <= names
        # The resize relaxed "an active distillation has a vector" while the vectors were remade; it holds again.
        assert conn.execute("SELECT convalidated FROM pg_constraint WHERE conname = 'distillations_active_embedded'"
                            ).fetchone()[0] is True
        # The vectors are still kept in their rows (sql/012): a new column type would have reset that.
        assert set(conn.execute("SELECT attstorage FROM pg_attribute WHERE attrelid IN ('memories'::regclass, "
                                "'distillations'::regclass) AND attname IN ('embedding', 'context_embedding')")
                   .fetchall()) == {("m",)}
        hits = vector_search(conn, table="distillations", user_id="ivy", query_embedding=new.embed_query("radios"),
                             embedding_model=new.model_name, limit=3)
        assert len(hits) == 3 and hits[0].id == ids[1]
    for table, column in (("distillations", "embedding"), ("memories", "embedding"),
                          ("memories", "context_embedding")):
        assert _dimensions(database, table, column) == {256}

    # Everything is done: a second run has nothing left, and other commands work again.
    again = invoke(["distill", "re-embed", "--all", "--json"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["resized"] == [] and json.loads(again.stdout)["distillations"] == 0
    listed = invoke(["memory", "list", "--user", "ivy", "--json"])
    assert listed.exit_code == 0, listed.output


def test_re_embed_all_with_the_same_size_keeps_the_columns(database: Database,
                                                           settings: Settings) -> None:
    _seed(database)
    with database.connection() as conn:  # as if the vectors came from another 384-d model
        conn.execute("UPDATE distillations SET embedding_model = 'older-model-384'")
        conn.execute("UPDATE memories SET embedding_model = 'older-model-384', context_embedding_model = NULL")
    done = CliRunner().invoke(app, ["distill", "re-embed", "--all", "--json"], obj=CliParts.of(settings))
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert report["resized"] == [] and (report["distillations"], report["exchanges"], report["contexts"]) == (3, 3, 3)
    assert report["relevance_model"] is True
    with database.connection() as conn:
        assert conn.execute("SELECT count(*) FROM distillations WHERE embedding_model = %s",
                            (EMBEDDER.model_name,)).fetchone()[0] == 3
        audit = conn.execute("SELECT detail FROM audit_log WHERE action = 'reembed_all'").fetchone()[0]
    assert audit["distillations"] == 3


def test_re_embed_needs_an_id_or_all() -> None:
    both = CliRunner().invoke(app, ["distill", "re-embed"])
    assert both.exit_code != 0 and "--all" in both.output
