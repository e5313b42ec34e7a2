"""Migrations against the real embedded PostgreSQL: idempotent, recorded, dimension-checked."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import psycopg
import pytest

from yak_pipeline.store.database import connect
from yak_pipeline.store.errors import DatabaseUnavailable, SchemaMismatch
from yak_pipeline.store.migrations import (
    DATA_TABLES,
    discover_migrations,
    migrate,
    migration_states,
    read_meta,
    table_counts,
)
from yak_pipeline_tests.conftest import create_database, drop_database


@pytest.fixture
def empty_db(pg_server_url: str):
    name = f"yak_empty_{uuid.uuid4().hex[:10]}"
    url = create_database(pg_server_url, name)
    yield url
    drop_database(pg_server_url, name)


def test_migrate_twice_applies_once_and_records_it(empty_db: str) -> None:
    first = migrate(empty_db, dimensions=384, model_name="m")
    second = migrate(empty_db, dimensions=384, model_name="m")
    assert [m.name for m in first] == [m.name for m in discover_migrations()]
    assert second == []
    with connect(empty_db) as conn:
        states = migration_states(conn)
        assert all(s.applied_at is not None for s in states)
        assert read_meta(conn) == {"embedding_dim": "384", "embedding_model": "m"}
        counts = table_counts(conn)
    assert set(counts) == set(DATA_TABLES)
    assert all(count == 0 for count in counts.values())


def test_embedding_column_takes_the_configured_dimension(empty_db: str) -> None:
    migrate(empty_db, dimensions=768, model_name="nomic-embed-text")
    with connect(empty_db) as conn:
        typmod = conn.execute(
            "SELECT atttypmod FROM pg_attribute WHERE attrelid = 'distillations'::regclass AND attname = 'embedding'"
        ).fetchone()[0]
    assert typmod == 768


def test_dimension_mismatch_is_a_one_line_error_and_changes_nothing(empty_db: str) -> None:
    migrate(empty_db, dimensions=384, model_name="all-MiniLM-L6-v2")
    with pytest.raises(SchemaMismatch) as err:
        migrate(empty_db, dimensions=768, model_name="nomic-embed-text")
    message = str(err.value)
    assert "\n" not in message and "768" in message and "384" in message and "YAK_EMBEDDER" in message
    with connect(empty_db) as conn:
        assert read_meta(conn)["embedding_dim"] == "384"


def test_unreachable_database_is_one_line_naming_the_variable() -> None:
    with pytest.raises(DatabaseUnavailable) as err:
        connect("postgresql://yak:hunter2@127.0.0.1:1/nothing")
    message = str(err.value)
    assert "\n" not in message and "YAK_DATABASE_URL" in message
    assert "hunter2" not in message  # the password never reaches a message


def test_schema_constraints_refuse_bad_states(conn: psycopg.Connection) -> None:
    from yak_pipeline_tests.store_helpers import seed_memory_with_distillation

    _, distillation_id = seed_memory_with_distillation(conn, user_id="alice", exchange="User: hi\nAssistant: hello",
                                                       distillation="User says hi.")
    conn.commit()
    bad_updates = [
        "UPDATE distillations SET confidence = 1.5",
        "UPDATE distillations SET warmth = -0.1",
        "UPDATE distillations SET tier = 'urgent'",
        "UPDATE distillations SET status = 'deleted'",
        "UPDATE distillations SET confidence = 0.3",  # active below the 0.6 gate
        "UPDATE distillations SET user_id = 'bob'",  # a distillation cannot change hands
        "UPDATE memories SET user_id = 'a|b'",
        "UPDATE memories SET status = 'lost'",
        "DELETE FROM audit_log",
    ]
    for statement in bad_updates:
        with pytest.raises(psycopg.errors.Error):
            conn.execute(statement)
        conn.rollback()
    assert conn.execute("SELECT confidence, status FROM distillations WHERE id = %s", (distillation_id,)).fetchone() == (0.9, "active")


def test_the_embedded_server_gets_a_quarter_of_the_ram_for_shared_buffers_within_bounds(
        pg_server_url: str) -> None:
    from yak_pipeline.store.embedded import shared_buffers_mb

    assert shared_buffers_mb(8 * 2**30) == 1024  # capped: a quarter of 8 GB would be 2 GB
    assert shared_buffers_mb(2 * 2**30) == 512
    assert shared_buffers_mb(256 * 2**20) == 128  # never below PostgreSQL's own default
    if os.environ.get("YAK_TEST_DATABASE_URL"):
        pytest.skip("an external test database: its configuration is not ours")
    with connect(pg_server_url, autocommit=True, vector=False) as conn:
        mb = conn.execute("SELECT setting::bigint * 8 / 1024 FROM pg_settings WHERE name = 'shared_buffers'").fetchone()[0]
    # The test session's server was created by start_embedded_server, so it runs with the setting.
    assert mb == shared_buffers_mb()


def test_a_new_embedded_server_is_configured_and_still_stopped_at_exit() -> None:
    """A server created with keep_running=False gets its memory setting and still stops at exit."""
    import subprocess
    import sys

    from yak_pipeline.store.embedded import embedded_server_running, shared_buffers_mb

    pgdata = Path(f"/tmp/yak-test-pg-new-{uuid.uuid4().hex[:8]}")  # short: it holds the socket
    try:
        script = ("import sys, psycopg; from pathlib import Path; "
                  "from yak_pipeline.store.embedded import start_embedded_server; "
                  "url = start_embedded_server(Path(sys.argv[1]), keep_running=False); "
                  "print(psycopg.connect(url).execute(\"SELECT setting::bigint * 8 / 1024 FROM pg_settings "
                  "WHERE name = 'shared_buffers'\").fetchone()[0])")
        done = subprocess.run([sys.executable, "-c", script, str(pgdata)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert int(done.stdout.strip().splitlines()[-1]) == shared_buffers_mb()
        # Stopped by the process's exit handler; on a loaded machine the postmaster takes a moment
        # (its shutdown checkpoint waited over 30 s once, beside a local-model evaluation).
        from yak_pipeline_tests.reliability_helpers import wait_until

        wait_until(lambda: not embedded_server_running(pgdata), timeout=90, what="the server to stop at exit")
    finally:
        if embedded_server_running(pgdata):
            from yak_pipeline.store.embedded import stop_embedded_server

            stop_embedded_server(pgdata)
        subprocess.run(["rm", "-rf", str(pgdata)], check=False)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="only root creates the server's system user")
def test_processes_starting_at_once_create_the_system_user_once() -> None:
    """The first start on a new machine creates the system user; four processes at once (the
    suite's workers in CI) all see one user id. Unlocked, concurrent ``useradd`` runs sometimes
    failed ("already in use") or replaced the id another process had just chowned a folder to."""
    import pwd
    import subprocess
    import sys

    name = f"yak_test_{uuid.uuid4().hex[:8]}"  # a throwaway user: the real one exists after the first test
    script = ("import pwd, sys, time; from yak_pipeline.store.embedded import _ensure_system_user; "
              "_ensure_system_user(sys.argv[1]); first = pwd.getpwnam(sys.argv[1]).pw_uid; time.sleep(0.5); "
              "print(first, pwd.getpwnam(sys.argv[1]).pw_uid)")
    try:
        starts = [subprocess.Popen([sys.executable, "-c", script, name], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True) for _ in range(4)]
        seen = [start.communicate(timeout=60) for start in starts]
        assert all(start.returncode == 0 for start in starts), [err[-500:] for _, err in seen]
        ids = {uid for out, _ in seen for uid in out.split()}
        assert ids == {str(pwd.getpwnam(name).pw_uid)}
    finally:
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)


def test_vectors_are_kept_in_their_row_and_older_rows_are_moved_there(conn: psycopg.Connection) -> None:
    """sql/012: an exchange's vectors are stored in its row even beside long text (an exact scan
    reads no TOAST per row); rows written before it are moved there, with the same numbers."""
    import numpy as np

    from yak_pipeline.store.migrations import SQL_DIR
    from yak_pipeline_tests.store_helpers import seed_memory_with_distillation

    rng = np.random.default_rng(12)
    vector = rng.normal(size=384).astype(np.float32)
    vector /= np.linalg.norm(vector)

    def add(text: str) -> str:
        memory_id, _ = seed_memory_with_distillation(conn, user_id="ana", exchange=text, distillation=text[:40],
                                                     embedding=vector)
        conn.execute("UPDATE memories SET embedding = %(v)s, embedding_model = 'm', context_embedding = %(v)s, "
                     "context_embedding_model = 'm' WHERE id = %(id)s", {"v": vector, "id": memory_id})
        return str(memory_id)

    def out_of_line(memory_id: str) -> tuple:
        return conn.execute("SELECT pg_column_toast_chunk_id(embedding) IS NOT NULL, pg_column_toast_chunk_id("
                            "context_embedding) IS NOT NULL, pg_column_toast_chunk_id(content) IS NOT NULL "
                            "FROM memories WHERE id = %s", (memory_id,)).fetchone()

    # Random words do not compress: the text is long enough to leave the row.
    long_text = "User: " + " ".join(f"{w:x}" for w in rng.integers(1 << 40, size=500)) + "\nAssistant: Noted."
    assert out_of_line(add(long_text)) == (False, False, True)

    # As before sql/012 (the default storage): vectors went out of line until the row fitted.
    conn.execute("ALTER TABLE memories ALTER COLUMN embedding SET STORAGE EXTENDED, "
                 "ALTER COLUMN context_embedding SET STORAGE EXTENDED")
    older = add(long_text + " (said earlier)")
    assert True in out_of_line(older)[:2]
    conn.execute((SQL_DIR / "012_inline_vectors.sql").read_text())
    assert out_of_line(older)[:2] == (False, False)
    stored = conn.execute("SELECT embedding, context_embedding FROM memories WHERE id = %s", (older,)).fetchone()
    assert np.array_equal(stored[0].to_numpy(), vector) and np.array_equal(stored[1].to_numpy(), vector)
