"""History in (issue 14, part 1): ChatGPT / Claude.ai exports and Claude Code sessions, through
``yak import`` (real subprocesses) and the drop folder, on the real database.

The fixtures in ``fixtures/history/`` follow each format's public description: a ChatGPT
``conversations.json`` (mapping trees with an edited branch, tool calls, hidden messages, a
multimodal prompt, reasoning) and the export's zip; a Claude.ai ``conversations.json`` (thinking,
tool use and results, an attachment, an unanswered prompt); a Claude Code session (meta and
slash-command entries, tool use and results, a subagent's sidechain, an interrupted turn) and
the lines it appends when resumed.
"""

from __future__ import annotations

import io
import json
import shutil
import time
import zipfile
from pathlib import Path

import pytest

from yak_pipeline.ingestion.claim import claim_drop_files
from yak_pipeline.ingestion.formats.claude_code_sessions import read_session
from yak_pipeline.ingestion.formats.history_files import FORMATS, detect_format, parse_history_file
from yak_pipeline.store.database import Database, connect
from yak_pipeline.store.forget import forget_memories
from yak_pipeline.store.queue import queue_counts
from yak_pipeline_tests.test_cli_process import _env as yak_env
from yak_pipeline_tests.test_cli_process import _yak as yak

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "history"
CHATGPT = FIXTURES / "chatgpt_conversations.json"
CHATGPT_ZIP = FIXTURES / "chatgpt_export.zip"
CLAUDE = FIXTURES / "claude_conversations.json"
CLAUDE_CODE = FIXTURES / "claude_code_session.jsonl"
CLAUDE_CODE_RESUMED = FIXTURES / "claude_code_session_resumed.jsonl"
# Exchanges and skipped turns each fixture holds (see the module docstring).
EXPECTED = {CHATGPT: ("chatgpt", 6, 1), CHATGPT_ZIP: ("chatgpt", 6, 1), CLAUDE: ("claude", 3, 1),
            CLAUDE_CODE: ("claude_code", 2, 1)}


def import_json(files: list[Path], env: dict[str, str], *extra: str) -> tuple[int, dict]:
    """``yak import FILES --json``: exit code and report."""
    result = yak(["import", *map(str, files), "--json", *extra], env)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout)


def wait_for_vectors(db_url: str, user: str, seconds: float = 120) -> int:
    """Wait (up to ``seconds``) for the background worker of ``yak import`` to give every exchange of
    ``user`` its vectors; how many still lack them then (``yak queue status``'s count)."""
    deadline = time.monotonic() + seconds
    while True:
        with connect(db_url) as conn:
            left = queue_counts(conn, user_id=user).unembedded_memories
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def contents(db_url: str, user: str = "maria") -> list[str]:
    with connect(db_url) as conn:
        return [r[0] for r in conn.execute("SELECT content FROM memories WHERE user_id = %s ORDER BY occurred_at",
                                           (user,)).fetchall()]


# --- the formats, told from their content -------------------------------------------------------


def test_each_fixture_is_told_from_its_content_whatever_its_name() -> None:
    for path, (kind, exchanges, skipped) in EXPECTED.items():
        data = path.read_bytes()
        assert detect_format(path.name, data) == kind
        assert detect_format("download", data) == kind  # no suffix at all
        parsed = parse_history_file("download", data, user_id="maria")
        assert (parsed.format, len(parsed.records), parsed.skipped, parsed.rejected) == (kind, exchanges, skipped, [])
    examples = Path(__file__).resolve().parents[1] / "examples" / "drop"
    for example in examples.iterdir():
        assert detect_format(example.name, example.read_bytes()) == "yak"


def test_chatgpt_reads_only_the_current_branch_and_leaves_tools_and_hidden_messages_out() -> None:
    records = parse_history_file("conversations.json", CHATGPT.read_bytes(), user_id="maria").records
    text = "\n".join(r.content for r in records)
    assert "vegetarian, and allergic to peanuts" in text and "I'm vegan" not in text  # the edited prompt wins
    assert "Shigetsu at Tenryu-ji serves shojin ryori." not in text  # the browser tool's output
    assert 'search("' not in text and "I am a nurse in Lisbon" not in text  # tool call, custom instructions
    assert "The user wants a follow-up" not in text  # reasoning
    food = next(r for r in records if "vegetarian" in r.content)
    assert food.content == ("User: What about food? I'm vegetarian, and allergic to peanuts.\nAssistant: Shojin ryori "
                            "(Buddhist temple cuisine) is vegetarian: Shigetsu at Tenryu-ji is a classic.\n"
                            "Always say \"no peanuts\" (pīnattsu nashi).")
    assert food.occurred_at.isoformat() == "2024-11-18T10:01:30+00:00"
    assert food.ref == "chatgpt:6742f1a0-0001-8000-9000-000000000001:u-2b"
    image = next(r for r in records if "itinerary" in r.content)
    assert image.content.startswith("User: Here is my itinerary draft.\nAssistant: Day two")


def test_claude_branches_follow_the_current_leaf() -> None:
    conversation = {"uuid": "c1", "name": "t", "current_leaf_message_uuid": "m4", "chat_messages": [
        {"uuid": "m1", "sender": "human", "text": "Hi, I'm Maria.", "created_at": "2024-05-01T10:00:00Z",
         "parent_message_uuid": "00000000-0000-4000-8000-000000000000"},
        {"uuid": "m2", "sender": "assistant", "text": "Hello Maria.", "created_at": "2024-05-01T10:00:01Z",
         "parent_message_uuid": "m1"},
        {"uuid": "m3", "sender": "human", "text": "I live in Faro.", "created_at": "2024-05-01T10:01:00Z",
         "parent_message_uuid": "m1"},
        {"uuid": "m4", "sender": "assistant", "text": "Faro is lovely.", "created_at": "2024-05-01T10:01:02Z",
         "parent_message_uuid": "m3"}]}
    records = parse_history_file("c.json", json.dumps([conversation]).encode(), user_id="maria").records
    assert [r.content for r in records] == ["User: I live in Faro.\nAssistant: Faro is lovely."]


def test_claude_code_leaves_tool_noise_out_and_a_line_being_written_for_later() -> None:
    data = CLAUDE_CODE.read_bytes()
    read = read_session(data, user_id="maria", max_record_chars=200_000)
    assert [r.content for r in read.records] == [
        "User: The order form accepts negative quantities. Fix the validation in orders.py; we use pydantic v2 "
        "in this project.\nAssistant: I'll look at the order model first.\n\nDone: `quantity` is now `Field(gt=0)`, "
        "so pydantic rejects zero and negative quantities.",
        "User: Thanks. Also, I prefer tabs over spaces, but this repo uses spaces, so keep spaces here.\n"
        "Assistant: Noted: spaces in this repository."]
    # "Run the tests." got only a tool call, then an interruption: skipped, and read again next time.
    assert read.skipped == 1 and data[read.resume_at:].startswith(b'{"parentUuid"') and b"Run the tests." in (
        data[read.resume_at:].split(b"\n")[0])
    half = CLAUDE_CODE_RESUMED.read_bytes()[:200]  # a line still being written
    cut = read_session(data + half, user_id="maria", max_record_chars=200_000)
    assert cut.rejected == [] and cut.resume_at == read.resume_at


# --- yak import ----------------------------------------------------------------------------------


def test_yak_import_reads_every_format_and_importing_again_adds_nothing(db_url: str, tmp_path: Path) -> None:
    env = yak_env(db_url, tmp_path)
    files = [CHATGPT_ZIP, CLAUDE, CLAUDE_CODE]
    code, report = import_json(files, env, "--user", "maria")
    assert code == 0, report
    assert [(f["format"], f["stored"], f["skipped"], f["quarantined"]) for f in report["files"]] == [
        ("chatgpt", 6, 1, 0), ("claude", 3, 1, 0), ("claude_code", 2, 1, 0)]
    vectors = report["totals"].pop("vectors")
    assert report["totals"] == {"exchanges": 11, "already_stored": 0, "updated": 0, "already_quarantined": 0,
                                "skipped": 3, "quarantined": 0,
                                "failed_files": 0, "users": ["maria"], "first": "2024-10-05T09:00:00+00:00",
                                "last": "2025-03-10T14:05:00+00:00"}
    # The vectors follow in the background, from a worker the import started (yak queue status counts
    # what waits): recallable by meaning before any distillation has run.
    assert vectors["background_pid"] > 0 and vectors["log"].endswith("import-vectors.log")
    assert wait_for_vectors(db_url, "maria") == 0, Path(vectors["log"]).read_text()
    with connect(db_url) as conn:
        rows = conn.execute("SELECT source, status, source_ref, occurred_at FROM memories ORDER BY occurred_at").fetchall()
    assert {(r[0], r[1]) for r in rows} == {("import", "pending")}
    assert rows[0][2] == "claude_conversations.json#claude:a3f1c2d4-0000-4000-8000-00000000c001:m-c1-1"
    text = "\n".join(contents(db_url))
    for noise in ("Caveat:", "/clear", "toolu_", "Found one in invoices.py", "Run the tests.", "Sunny, 22°C",
                  "500 g flour", "The user asks about bulk fermentation"):
        assert noise not in text, noise

    # The same exports again, the unzipped JSON of the zip included: nothing new.
    code, again = import_json([*files, CHATGPT], env, "--user", "maria")
    assert code == 0
    assert [(f["stored"], f["duplicates"]) for f in again["files"]] == [(0, 6), (0, 3), (0, 0), (0, 6)]
    assert len(contents(db_url)) == 11
    # Human output: a table and the summary line, no traceback.
    human = yak(["import", str(CLAUDE), "--user", "maria"], env)
    assert human.returncode == 0 and "claude" in human.stdout and "0 exchanges imported (3 already there)" in human.stdout


def test_a_grown_claude_code_session_is_read_from_where_the_last_import_stopped(
        db_url: str, database: Database, tmp_path: Path) -> None:
    env = yak_env(db_url, tmp_path)
    session = tmp_path / "0f8e3c1a-5b7d-4e2f-9a6c-1d2e3f4a5b6c.jsonl"
    shutil.copyfile(CLAUDE_CODE, session)
    code, first = import_json([session], env, "--user", "maria")
    assert code == 0 and first["files"][0]["stored"] == 2
    # The person forgets one exchange; the session is resumed and its file grows.
    with database.connection() as conn:
        tabs = conn.execute("SELECT id FROM memories WHERE content LIKE '%%tabs over spaces%%'").fetchone()[0]
        forget_memories(conn, user_id="maria", memory_ids=[tabs], actor="test")
    with session.open("ab") as handle:
        handle.write(CLAUDE_CODE_RESUMED.read_bytes())
    code, grown = import_json([session], env, "--user", "maria")
    assert code == 0
    # Read from the start of the turn left open last time ("Run the tests."): only the new part.
    left_open = read_session(CLAUDE_CODE.read_bytes(), user_id="maria", max_record_chars=200_000).resume_at
    assert first["files"][0]["resumed_at_byte"] == 0 and left_open > 0
    assert (grown["files"][0]["stored"], grown["files"][0]["resumed_at_byte"]) == (1, left_open)
    text = "\n".join(contents(db_url))
    assert "Changed OPENING_HOUR from 8 to 7" in text and "tabs over spaces" not in text  # forgotten stays forgotten
    code, same = import_json([session], env, "--user", "maria")
    assert code == 0 and same["files"][0]["stored"] == 0 and len(contents(db_url)) == 2


def test_exports_need_a_user_and_unknown_files_get_one_line_naming_the_known_formats(
        db_url: str, tmp_path: Path) -> None:
    env = yak_env(db_url, tmp_path)
    notes = tmp_path / "notes.txt"
    notes.write_text("Dear diary, today I moved to Porto.\n")
    unknown = tmp_path / "data.json"
    unknown.write_text(json.dumps([{"id": 1, "title": "not a chat"}]))
    result = yak(["import", str(CHATGPT), str(notes), str(unknown)], env)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("error: ") for line in lines)
    assert "--user USER" in lines[0] and "USER/ subfolder" in lines[0]
    for line in lines[1:]:
        assert all(description in line for description in FORMATS.values())
    assert contents(db_url) == []
    bad_user = yak(["import", str(CHATGPT), "--user", "no|pipes"], env)
    assert bad_user.returncode == 2 and bad_user.stderr.startswith("error: invalid user id")


def test_yak_records_take_the_given_user_and_refuse_another(db_url: str, tmp_path: Path) -> None:
    env = yak_env(db_url, tmp_path)
    records = tmp_path / "mine.jsonl"
    records.write_text(json.dumps({"user": "I own a bakery.", "assistant": "Nice!", "occurred_at": "2024-01-02"}) + "\n"
                       + json.dumps({"user_id": "bob", "user": "I am Bob.", "assistant": "Hi Bob."}) + "\n")
    code, report = import_json([records], env, "--user", "maria")
    assert code == 0 and (report["files"][0]["stored"], report["files"][0]["quarantined"]) == (1, 1)
    assert contents(db_url) == ["User: I own a bakery.\nAssistant: Nice!"]
    reasons = (tmp_path / "drop" / "failed" / "mine.rejected.jsonl.error.txt").read_text()
    assert reasons == "line 2: record is for user 'bob', not 'maria'\n"


# --- damaged exports ----------------------------------------------------------------------------


def test_a_truncated_export_is_partly_imported_and_the_rest_quarantined(db_url: str, tmp_path: Path) -> None:
    env = yak_env(db_url, tmp_path)
    data = CHATGPT.read_bytes()
    cut_at = data.index(b'"title": "Running routine"') + 200  # inside the second conversation
    truncated = tmp_path / "conversations.json"
    truncated.write_bytes(data[:cut_at])
    code, report = import_json([truncated], env, "--user", "maria")
    # Damaged: what was whole is stored, and the import says so by its exit code (issue 34).
    assert code == 1 and report["files"][0]["damaged"].startswith("the export breaks off after 1 conversation")
    assert (report["files"][0]["stored"], report["files"][0]["quarantined"]) == (3, 1)
    failed = tmp_path / "drop" / "failed"
    reason = (failed / "conversations.rejected.json.error.txt").read_text()
    assert reason.startswith("item 2: the export breaks off after 1 conversation (line ")
    # Nothing is lost: the quarantine file holds the rest of the file as it was.
    assert data[data.index(b'{\n  "title": "Running routine"'):cut_at].decode() in (
        failed / "conversations.rejected.json").read_text()
    assert len(contents(db_url)) == 3


def test_a_corrupted_export_keeps_its_good_conversations_and_quarantines_the_bad_with_reasons(
        db_url: str, tmp_path: Path) -> None:
    env = yak_env(db_url, tmp_path)
    conversations = json.loads(CHATGPT.read_text())
    conversations[1]["current_node"] = "no-such-node"
    conversations[2]["mapping"]["u-31"]["message"]["content"]["parts"] = ["Translate 'good\u0000 morning'."]
    conversations.append("not a conversation")
    corrupted = tmp_path / "export.json"
    corrupted.write_text(json.dumps(conversations))
    code, report = import_json([corrupted], env, "--user", "maria")
    assert code == 0 and (report["files"][0]["stored"], report["files"][0]["quarantined"]) == (3, 3)
    failed = tmp_path / "drop" / "failed"
    reasons = (failed / "export.rejected.json.error.txt").read_text().splitlines()
    assert reasons[0] == ("item 2: conversation 'Running routine': the current branch reaches node no-such-node, "
                          "which the mapping lacks")
    assert reasons[1] == "item 3: the user message contains a NUL character (\\u0000), which cannot be stored"
    assert reasons[2] == "item 4: conversation: expected a conversation object, got a string"
    quarantined = json.loads((failed / "export.rejected.json").read_text())
    assert quarantined[0]["title"] == "Running routine" and quarantined[1]["user_id"] == "maria"


def test_a_zip_cut_short_inside_conversations_json_is_salvaged(db_url: str, tmp_path: Path) -> None:
    env = yak_env(db_url, tmp_path)
    conversations = json.loads(CHATGPT.read_text())
    # Enough conversations that the archive ends well inside conversations.json.
    many = [dict(c, conversation_id=f"{c['conversation_id']}-{i}", mapping={
        key: dict(node, message=node["message"] and dict(node["message"], content=dict(
            node["message"]["content"], parts=[f"{p} (copy {i})" if isinstance(p, str) and p else p
                                               for p in node["message"]["content"].get("parts", [])])))
        for key, node in c["mapping"].items()}) for i in range(40) for c in conversations]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("conversations.json", json.dumps(many))
        archive.writestr("chat.html", "<html></html>")
    data = buffer.getvalue()
    partial = tmp_path / "chatgpt-export.zip"
    partial.write_bytes(data[: len(data) // 2])
    code, report = import_json([partial], env, "--user", "maria")
    assert code == 1 and "breaks off after" in report["files"][0]["damaged"], report
    stored, quarantined = report["files"][0]["stored"], report["files"][0]["quarantined"]
    assert 0 < stored < 240 and quarantined == 1
    assert "breaks off after" in (tmp_path / "drop" / "failed" / "chatgpt-export.rejected.json.error.txt").read_text()


def test_a_damaged_line_of_a_session_is_quarantined_and_the_rest_imported(db_url: str, tmp_path: Path) -> None:
    env = yak_env(db_url, tmp_path)
    lines = CLAUDE_CODE.read_text().splitlines()
    lines[8] = lines[8][:40]  # a line cut in the middle of the file
    damaged = tmp_path / "session.jsonl"
    damaged.write_text("\n".join(lines) + "\n")
    code, report = import_json([damaged], env, "--user", "maria")
    assert code == 0 and (report["files"][0]["stored"], report["files"][0]["quarantined"]) == (2, 1)
    failed = tmp_path / "drop" / "failed"
    assert (failed / "session.rejected.jsonl").read_text() == lines[8] + "\n"
    assert (failed / "session.rejected.jsonl.error.txt").read_text().startswith("line 9: invalid JSON")


# --- the drop folder -----------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", [CHATGPT, CHATGPT_ZIP, CLAUDE, CLAUDE_CODE], ids=lambda p: p.name)
def test_the_drop_folder_imports_each_format_for_its_user_folder(
        fixture: Path, database: Database, db_url: str, tmp_path: Path) -> None:
    drop = tmp_path / "drop"
    (drop / "maria").mkdir(parents=True)
    shutil.copyfile(fixture, drop / "maria" / fixture.name)
    report = claim_drop_files(database, drop, min_age_seconds=0)
    kind, exchanges, skipped = EXPECTED[fixture]
    [outcome] = report.files
    assert (outcome.name, outcome.format, outcome.stored, outcome.skipped, outcome.error) == (
        f"maria/{fixture.name}", kind, exchanges, skipped, None)
    assert (drop / "processed" / fixture.name).exists() and not (drop / "maria" / fixture.name).exists()
    with connect(db_url) as conn:
        assert conn.execute("SELECT DISTINCT user_id, source FROM memories").fetchall() == [("maria", "drop_folder")]
    assert {user for user, _ in report.partitions} == {"maria"}
    # Dropped again: nothing new.
    shutil.copyfile(fixture, drop / "maria" / fixture.name)
    [again] = claim_drop_files(database, drop, min_age_seconds=0).files
    assert again.stored == 0 and again.duplicates == (exchanges if kind != "claude_code" else 0)


def test_an_export_dropped_without_a_user_folder_fails_with_the_way_to_give_one(
        database: Database, tmp_path: Path) -> None:
    drop = tmp_path / "drop"
    drop.mkdir()
    shutil.copyfile(CHATGPT, drop / "conversations.json")
    [outcome] = claim_drop_files(database, drop, min_age_seconds=0).files
    assert outcome.stored == 0 and "USER/ subfolder" in outcome.error
    error = (drop / "failed" / "conversations.json.error.txt").read_text()
    assert error.startswith("conversations.json: a ChatGPT data export") and "--user USER" in error
    assert (drop / "failed" / "conversations.json").read_bytes() == CHATGPT.read_bytes()
