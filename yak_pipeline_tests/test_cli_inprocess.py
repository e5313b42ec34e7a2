"""The ``yak`` API commands, run in-process (the app behind ``httpx.ASGITransport``) on the test database."""

from __future__ import annotations

import json
import uuid

import pytest
from typer.testing import CliRunner

from yak_pipeline.cli.main import app as yak
from yak_pipeline.cli.parts import CliParts
from yak_pipeline.embeddings.hashing import HashingEmbedder
from yak_pipeline.ingestion.drop_folder import claim_file, ensure_drop_dirs
from yak_pipeline.llm import RulesProvider
from yak_pipeline.services.distill import DistillJob, distill_memories
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import Seeded, seeded  # noqa: F401


@pytest.fixture
def run(settings: Settings):  # noqa: ANN201
    """Run ``yak ARGS`` in this process with the test's settings (its database); returns the click Result."""
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None):  # noqa: A002, ANN202
        return runner.invoke(yak, list(args), input=input, obj=CliParts.of(settings))

    return invoke


def ok_json(result) -> object:  # noqa: ANN001
    """The JSON a successful command printed."""
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def test_memory_add_list_show_search(run, database: Database) -> None:  # noqa: ANN001
    added = ok_json(run("memory", "add", "User: I play the cello.\nAssistant: Lovely!", "--user", "alice", "--json"))
    assert added["status"] == "pending"
    run("memory", "add", "User: I play chess.\nAssistant: Nice.", "--user", "bob", "--json")
    listed = ok_json(run("memory", "list", "--user", "alice", "--json"))
    assert [m["id"] for m in listed["items"]] == [added["id"]]
    distill_memories(DistillJob(database, llm=RulesProvider(), embedder=HashingEmbedder(384), prompt_version="v1"),
                     [added["id"]])
    shown = ok_json(run("memory", "show", added["id"], "--json"))
    assert shown["status"] == "distilled" and len(shown["distillations"]) == 1
    hits = ok_json(run("memory", "search", "Which instrument? cello", "--user", "alice", "--threshold", "0.1",
                       "--json"))
    assert hits and "cello" in hits[0]["content"] and hits[0]["score"] > 0
    people = run("memory", "list")
    assert people.exit_code == 0 and added["id"] in people.stdout and "alice" in people.stdout


def test_a_user_without_memories_is_named_not_an_empty_table(run) -> None:  # noqa: ANN001
    run("memory", "add", "User: I play the cello.\nAssistant: Lovely!", "--user", "alice", "--json")
    listed = run("memory", "list", "--user", "alcie")
    assert listed.exit_code == 0 and listed.stdout.strip() == "user 'alcie' has no memories"
    searched = run("memory", "search", "cello", "--user", "alcie")
    assert searched.exit_code == 1 and searched.stderr == "error: user 'alcie' has no memories\n"
    # A user who has memories, none relevant, is a different answer.
    nothing = run("memory", "search", "zebra migration", "--user", "alice")
    assert nothing.exit_code == 0 and "no memory is relevant enough" in nothing.stdout


def test_memory_list_help_says_what_user_does() -> None:
    text = " ".join(CliRunner().invoke(yak, ["memory", "list", "--help"], env={"COLUMNS": "200"}).stdout.split())
    assert "required" not in text
    assert "an admin key lists every user's without it" in text


def test_exit_codes_and_one_line_errors(run) -> None:  # noqa: ANN001
    missing = run("memory", "show", str(uuid.uuid4()))
    assert missing.exit_code == 1
    assert missing.stderr.startswith("error: memory ") and missing.stderr.count("\n") == 1
    bad_id = run("memory", "show", "not-an-id")
    assert bad_id.exit_code == 2 and "is not a UUID" in bad_id.stderr
    assert run("memory", "search", "cello").exit_code == 2  # --user is required
    invalid = run("memory", "add", "text", "--user", "bad user")
    assert invalid.exit_code == 1 and invalid.stderr.startswith("error: user_id: ")
    assert run("keys", "create").exit_code == 2
    assert run("forget", "--user", "alice").exit_code == 2


def test_keys_create_prints_the_key_once_and_it_is_scoped(run, seeded: Seeded) -> None:  # noqa: ANN001
    created = run("keys", "create", "--user", "alice")
    assert created.exit_code == 0
    key = created.stdout.strip()
    assert key.startswith("yak_") and "\n" not in key
    mine = ok_json(run("memory", "list", "--api-key", key, "--json"))
    assert {m["user_id"] for m in mine["items"]} == {"alice"}
    theirs = run("memory", "show", seeded.bob.memory_id, "--api-key", key)
    assert theirs.exit_code == 1 and seeded.bob.secret not in theirs.stdout + theirs.stderr
    listed = ok_json(run("keys", "list", "--json"))
    assert all(key not in json.dumps(k) for k in listed)
    assert run("keys", "create", "--admin", "--api-key", key).exit_code == 1


def test_forget_commands(run, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    asked = ok_json(run("forget", "/forget tea", "--user", "alice", "--json"))
    assert asked["action"] == "confirm" and len(asked["candidates"]) == 1
    done = ok_json(run("forget", "--confirm", asked["confirmation_token"], "--user", "alice", "--json"))
    assert done["deleted_distillation_ids"] == [seeded.alice.review_id]
    interactive = run("forget", "/forget locker", "--user", "bob", input="n\n")
    assert interactive.exit_code == 0 and "nothing deleted" in interactive.stdout
    by_id = ok_json(run("forget", f"/forget {seeded.bob.memory_id}", "--user", "bob", "--json"))
    assert by_id["deleted_memory_ids"] == [seeded.bob.memory_id]
    with database.connection() as conn:
        assert conn.execute("SELECT count(*) FROM memories WHERE id = %s", (seeded.bob.memory_id,)).fetchone()[0] == 0
    # A bare id or phrase implies `/forget`: a phrase matching nothing deletes nothing.
    bare = ok_json(run("forget", "no such phrase anywhere", "--user", "bob", "--json"))
    assert bare["action"] == "nothing" and bare.get("deleted_memory_ids", []) == []
    # An explicit form with a mistake is still refused with one line.
    assert run("forget", "delete memory: not-an-id", "--user", "bob").exit_code == 1


def test_curation_commands(run, seeded: Seeded) -> None:  # noqa: ANN001
    a = seeded.alice
    assert {d["id"] for d in ok_json(run("review", "list", "--user", "alice", "--json"))} == {
        a.distillation_id, a.other_distillation_id, a.review_id}
    assert ok_json(run("review", "approve", a.review_id, "--json"))["decision"] == "approved"
    assert ok_json(run("review", "reject", a.other_distillation_id, "--json"))["decision"] == "rejected"
    assert run("review", "approve", a.review_id).exit_code == 1
    conflicts = ok_json(run("conflicts", "list", "--user", "alice", "--json"))
    assert [c["id"] for c in conflicts] == [a.conflict_id]
    assert ok_json(run("conflicts", "resolve", a.conflict_id, "--note", "fixed", "--json"))["status"] == "resolved"
    assert ok_json(run("conflicts", "dismiss", seeded.bob.conflict_id, "--json"))["status"] == "dismissed"
    assert ok_json(run("warmth", "show", a.distillation_id, "--json"))["warmth"] == pytest.approx(0.6)
    assert ok_json(run("warmth", "reset", a.distillation_id, "--json"))["warmth"] == 0.5
    assert ok_json(run("warmth", "bulk-reset", "--user", "bob", "--json")) == {"reset": 1}
    versioned = ok_json(run("distill", "version", a.distillation_id, "--content", "New text.", "--json"))
    assert versioned["content"] == "New text." and len(versioned["versions"]) == 2
    merged = ok_json(run("distill", "merge", seeded.bob.distillation_id, seeded.bob.other_distillation_id, "--json"))
    assert merged["versions"][-1]["merged_from"] == [seeded.bob.other_distillation_id]
    assert ok_json(run("distill", "re-embed", a.distillation_id, "--json"))["embedding_model"] == "feature-hashing-384"
    listed = ok_json(run("distill", "list", "--user", "alice", "--status", "active", "--json"))
    assert {d["id"] for d in listed["items"]} == {a.distillation_id, a.review_id}
    assert run("distill", "show", a.distillation_id).exit_code == 0


def test_operations_commands(run, seeded: Seeded) -> None:  # noqa: ANN001
    health = ok_json(run("health", "--json"))
    assert health["status"] == "ok"
    queue = ok_json(run("queue", "status", "--json"))
    assert queue["pending_turns"] == 2
    metrics = ok_json(run("metrics", "--json"))
    assert {"yak_distillations_created", "yak_queue_size", "yak_recall_latency_ms"} <= set(metrics)
    assert len(metrics) == 15  # DESIGN §6's ten, the memory proxy's three, the MCP server's one, issue 35's redactions
    raw = run("metrics")
    assert raw.exit_code == 0 and "# TYPE yak_queue_size gauge" in raw.stdout


def test_queue_status_shows_the_drop_folders_quarantine_with_reasons(run, seeded: Seeded,  # noqa: ANN001
                                                                     settings: Settings) -> None:
    drop = settings.resolved_drop_dir
    ensure_drop_dirs(drop)
    good = json.dumps({"user_id": "alice", "user": "Hi", "assistant": "Hello"})
    (drop / "chat.jsonl").write_text("\n".join([good, "not json", json.dumps({"user_id": "a|b", "content": "x"})]))
    (drop / "broken.json").write_text("[{")
    for name in ("chat.jsonl", "broken.json"):
        claim_file(drop / name, drop)
    shown = run("queue", "status")
    assert shown.exit_code == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "1 unreadable files, 2 rejected records" in text
    assert "chat.rejected.jsonl" in text and "line 2: invalid JSON" in text and "(+1 more)" in text
    assert "broken.json" in text
    data = ok_json(run("queue", "status", "--json"))
    assert (data["quarantine"]["files"], data["quarantine"]["records"]) == (1, 2)
    # A user-scoped key does not see the operator's folder (a file can hold other users' records).
    scoped = ok_json(run("queue", "status", "--api-key", seeded.alice_key, "--json"))
    assert scoped["quarantine"] is None
