"""``yak db scan-secrets`` (issue 35): secrets stored before writes screened them are found and redacted.

The rows are written as an older Yak would have (straight into the tables, secrets and all),
then the real command runs as a subprocess: ``--dry-run`` counts and changes nothing; the real
run leaves no secret in any table, gives the changed exchanges new vectors of the redacted text
and the changed distillations the vector of theirs, and records each redaction by kind.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np

from yak_pipeline.embeddings.hashing import HashingEmbedder
from yak_pipeline.store.database import Database
from yak_pipeline.store.secret_scan import OTHER_TEXT_COLUMNS, USER_TEXT_COLUMNS, schema_text_columns
from yak_pipeline_tests.api_fixtures import rows_mentioning
from yak_pipeline_tests.reliability_helpers import YAK, yak_env
from yak_pipeline_tests.store_helpers import seed_memory_with_distillation

KEY = "sk-ant-api03-" + "Qw3rTy9" * 12 + "AA"
CARD = "4539 1488 0343 6467"
PASSWORD = "Lighthouse77!"


def _array(vector: object) -> np.ndarray:
    """A stored vector (pgvector's ``Vector`` or an array) as a numpy array."""
    return np.asarray(vector.to_numpy() if hasattr(vector, "to_numpy") else vector, dtype=np.float32)


def _scan(env: dict[str, str], *args: str) -> tuple[dict, str]:
    done = subprocess.run([str(YAK), "db", "scan-secrets", "--json", *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), done.stderr


def test_every_text_column_of_the_schema_is_placed(database: Database) -> None:
    # A column added later must be listed as user text (scanned) or as not (with its reason).
    with database.connection() as conn:
        columns = schema_text_columns(conn)
    listed = set(USER_TEXT_COLUMNS) | OTHER_TEXT_COLUMNS
    assert columns - listed == set()
    assert listed - columns == set()  # and nothing listed that is not there
    assert set(USER_TEXT_COLUMNS) <= columns


def test_scan_secrets_finds_and_redacts_what_an_older_database_holds(db_url: str, database: Database,
                                                                    tmp_path: Path) -> None:
    embedder = HashingEmbedder()
    leaky_exchange = f"User: my Claude key is {KEY} and my card {CARD}\nAssistant: Noted."
    leaky_fact = f"The user's bank password is {PASSWORD}."
    with database.connection() as conn:
        memory_id, distillation_id = seed_memory_with_distillation(
            conn, user_id="sam", exchange="User: placeholder\nAssistant: ok", distillation=leaky_fact)
        clean_id, _ = seed_memory_with_distillation(conn, user_id="sam", exchange="User: I like tea.\nAssistant: ok",
                                                    distillation="The user likes tea.")
        # As an older Yak stored it: verbatim, with vectors of the verbatim text.
        conn.execute("UPDATE memories SET content = %s, embedding = %s, embedding_model = %s WHERE id = %s",
                     (leaky_exchange, np.asarray(embedder.embed_query(leaky_exchange), dtype=np.float32),
                      embedder.model_name, memory_id))
        conn.execute("UPDATE distillation_versions SET content = %s WHERE distillation_id = %s",
                     (leaky_fact, distillation_id))
        conn.execute("""INSERT INTO turns (user_id, memory_id, user_message, assistant_message)
                        VALUES ('sam', %s, %s, 'Noted.')""", (memory_id, f"my Claude key is {KEY}"))
        before_vector = conn.execute("SELECT embedding FROM distillations WHERE id = %s",
                                     (distillation_id,)).fetchone()[0]
    env = yak_env(db_url, tmp_path / "home")

    dry, _ = _scan(env, "--dry-run")
    assert dry["dry_run"] is True and dry["secrets"] == {"api key": 2, "password": 2, "payment card": 1}
    with database.connection() as conn:
        assert rows_mentioning(conn, KEY) == {"memories": 1, "turns": 1}  # nothing changed

    report, progress = _scan(env)
    assert report["secrets_total"] == 5 and report["rows_with_secrets"]["memories.content"] == 1
    assert report["rows_with_secrets"]["distillations.content"] == 1
    assert report["rows_with_secrets"]["distillation_versions.content"] == 1
    assert "memories.content:" in progress and "rows read" in progress
    with database.connection() as conn:
        for secret in (KEY, CARD, PASSWORD, CARD.replace(" ", "")):
            assert rows_mentioning(conn, secret) == {}, secret
        content, vector, model = conn.execute("SELECT content, embedding, embedding_model FROM memories WHERE id = %s",
                                              (memory_id,)).fetchone()
        assert content == ("User: my Claude key is [secret: api key] and my card [secret: payment card]\n"
                           "Assistant: Noted.")
        # Its vectors were made again, from the redacted text.
        assert model == embedder.model_name and np.allclose(_array(vector), embedder.embed_documents([content])[0], atol=1e-6)
        fact, fact_vector = conn.execute("SELECT content, embedding FROM distillations WHERE id = %s",
                                         (distillation_id,)).fetchone()
        assert fact == "The user's bank password is [secret: password]."
        assert np.allclose(_array(fact_vector), embedder.embed_documents([fact])[0], atol=1e-6)
        assert not np.allclose(_array(fact_vector), _array(before_vector))
        audit = conn.execute("SELECT detail FROM audit_log WHERE action = 'redact_secrets' ORDER BY id").fetchall()
        assert len(audit) == 4 and all(set(row[0]) == {"secrets"} for row in audit)
        clean = conn.execute("SELECT content FROM memories WHERE id = %s", (clean_id,)).fetchone()[0]
        assert clean == "User: I like tea.\nAssistant: ok"

    again, _ = _scan(env)
    assert again["secrets_total"] == 0  # nothing left to find
