"""The drop folder on a real disk: what is ready, where files go, and that nothing is ever lost."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from yak_pipeline.ingestion.drop_folder import (
    DropFolderError,
    claim_file,
    ensure_drop_dirs,
    finish_file,
    list_quarantine,
    list_ready_files,
    list_unsupported_files,
    read_and_parse,
)
from yak_pipeline.ingestion.formats.exchange_files import parse_exchange_file

GOOD = {"user_id": "alice", "user": "Hi", "assistant": "Hello"}


@pytest.fixture
def drop(tmp_path: Path) -> Path:
    """An empty drop folder with its subfolders."""
    drop_dir = tmp_path / "drop"
    ensure_drop_dirs(drop_dir)
    return drop_dir


def _write(path: Path, content: str | bytes, *, age_seconds: float = 60.0) -> Path:
    """Write a file that looks finished (modified ``age_seconds`` ago)."""
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    stamp = time.time() - age_seconds
    os.utime(path, (stamp, stamp))
    return path


def _files(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir() if path.is_file())


def test_ensure_drop_dirs_creates_all_three_and_is_repeatable(tmp_path: Path) -> None:
    drop_dir = tmp_path / "a" / "drop"
    ensure_drop_dirs(drop_dir)
    ensure_drop_dirs(drop_dir)
    assert sorted(path.name for path in drop_dir.iterdir()) == ["failed", "processed"]


def test_list_ready_files_skips_hidden_new_unsupported_and_subfolders(drop: Path) -> None:
    _write(drop / "b.json", "{}")
    _write(drop / "a.jsonl", "{}")
    _write(drop / "C.MD", "---")
    _write(drop / ".hidden.jsonl", "{}")
    _write(drop / "notes.txt", "hello")
    _write(drop / "fresh.jsonl", "{}", age_seconds=0.5)
    _write(drop / "processed" / "old.jsonl", "{}")
    _write(drop / "failed" / "bad.jsonl", "{}")
    (drop / "folder.jsonl").mkdir()

    ready = list_ready_files(drop)
    assert [path.name for path in ready] == ["C.MD", "a.jsonl", "b.json"]
    assert all(path.parent == drop for path in ready)
    # The same file is ready once it is old enough, and "now" can be given explicitly.
    assert "fresh.jsonl" in [path.name for path in list_ready_files(drop, now=time.time() + 5)]
    assert "fresh.jsonl" in [path.name for path in list_ready_files(drop, min_age_seconds=0)]
    assert [path.name for path in list_unsupported_files(drop)] == ["notes.txt"]


def test_missing_drop_folder_has_no_files(tmp_path: Path) -> None:
    assert list_ready_files(tmp_path / "nowhere") == []
    assert list_unsupported_files(tmp_path / "nowhere") == []


def test_good_jsonl_goes_to_processed_with_its_records(drop: Path) -> None:
    source = _write(drop / "chat.jsonl", json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "user": "Bye"}) + "\n")
    original = source.read_bytes()

    result = claim_file(source, drop)

    assert result.error is None and result.rejected_count == 0 and result.path_failed is None
    assert result.path_processed == drop / "processed" / "chat.jsonl"
    assert result.path_processed.read_bytes() == original
    contents = [record.content for record in result.records]
    assert contents == ["User: Hi\nAssistant: Hello", "User: Bye\nAssistant: Hello"]
    assert not source.exists()
    assert _files(drop / "failed") == []


def test_good_markdown_and_json_are_processed(drop: Path) -> None:
    md = _write(drop / "talk.md", "---\nuser_id: bob\ndate: 2024-02-03\n---\nUser: q\nAssistant: a\n")
    js = _write(drop / "list.json", json.dumps([GOOD, GOOD]))
    assert [record.user_id for record in claim_file(md, drop).records] == ["bob"]
    assert len(claim_file(js, drop).records) == 2
    assert _files(drop / "processed") == ["list.json", "talk.md"]


def test_mixed_jsonl_ingests_good_records_and_quarantines_bad_ones(drop: Path) -> None:
    bad_id = json.dumps({**GOOD, "user_id": "a|b"})
    lines = [json.dumps(GOOD), "not json", "", bad_id, json.dumps({**GOOD, "user": "again"})]
    source = _write(drop / "mixed.jsonl", "\r\n".join(lines) + "\r\n")

    result = claim_file(source, drop)

    assert [record.line for record in result.records] == [1, 5]
    assert result.rejected_count == 2
    assert result.path_processed == drop / "processed" / "mixed.jsonl"
    assert result.path_failed == drop / "failed" / "mixed.rejected.jsonl"
    # Each rejected line is kept byte for byte (here with its CRLF ending) ...
    assert result.path_failed.read_bytes() == b"not json\r\n" + bad_id.encode() + b"\r\n"
    # ... and the error file says which line and why.
    errors = (drop / "failed" / "mixed.rejected.jsonl.error.txt").read_text().splitlines()
    assert errors[0].startswith("line 2: invalid JSON at column 1")
    assert errors[1].startswith("line 4: user_id: invalid user id 'a|b'")
    assert len(errors) == 2
    assert _files(drop / "failed") == ["mixed.rejected.jsonl", "mixed.rejected.jsonl.error.txt"]


def test_the_quarantine_lists_rejected_records_and_failed_files_with_reasons(drop: Path) -> None:
    assert list_quarantine(drop) == [] and list_quarantine(drop / "missing") == []
    claim_file(_write(drop / "mixed.jsonl", "\n".join([json.dumps(GOOD), "not json", "{}"]) + "\n"), drop)
    claim_file(_write(drop / "broken.json", "[{"), drop)
    entries = {entry.name: entry for entry in list_quarantine(drop)}
    assert set(entries) == {"mixed.rejected.jsonl", "broken.json"}
    records = entries["mixed.rejected.jsonl"]
    assert records.kind == "records" and records.records == 2
    assert records.reasons[0].startswith("line 2: invalid JSON") and records.reasons[1].startswith("line 3: ")
    whole = entries["broken.json"]
    assert whole.kind == "file" and whole.records == 0 and whole.reasons[0].startswith("broken.json: ")
    # A file a person took out of failed/ to fix is no longer listed, though its error file stays.
    (drop / "failed" / "broken.json").rename(drop / "broken-fixed.json")
    assert [entry.name for entry in list_quarantine(drop)] == ["mixed.rejected.jsonl"]


def test_rejected_json_items_are_a_json_list_that_can_be_dropped_again(drop: Path) -> None:
    items = [GOOD, {"user_id": "carol", "user": "no reply"}, {"user_id": "carol", "user": "q", "assistant": "a"}]
    items[2]["occurred_at"] = "not a date"
    source = _write(drop / "export.json", json.dumps(items, indent=2))

    result = claim_file(source, drop)

    assert len(result.records) == 1
    assert json.loads(result.path_failed.read_text()) == items[1:]  # type: ignore[union-attr]
    assert (drop / "failed" / "export.rejected.json.error.txt").read_text() == (
        "item 2: assistant: field required\nitem 3: occurred_at: 'not a date' is not an ISO-8601 date or datetime\n"
    )


def test_rejected_markdown_blocks_are_kept(drop: Path) -> None:
    text = "---\nuser_id: bob\ndate: 2024-02-03\n---\nUser: q\nAssistant: a\nUser: unanswered\nstill unanswered\n"
    result = claim_file(_write(drop / "t.md", text), drop)
    assert result.rejected_count == 1
    assert result.path_failed.read_text() == "User: unanswered\nstill unanswered\n"  # type: ignore[union-attr]
    errors = (drop / "failed" / "t.rejected.md.error.txt").read_text()
    assert errors == "line 7: User block has no Assistant block after it\n"


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("latin.jsonl", "caf\u00e9".encode("latin-1"), "line 1: not UTF-8 text (byte 0xe9 at offset 3)"),
        ("broken.json", b'[\n{"user_id": "a",\n', "line 3: invalid JSON at column 1: Expecting property name"),
        ("empty.jsonl", b"", "line 1: file is empty"),
        ("nofront.md", b"User: q\nAssistant: a\n", "line 1: no front matter"),
        ("noid.md", b"---\ndate: 2024-01-01\n---\nUser: q\nAssistant: a\n", "line 3: front matter has no user_id"),
    ],
)
def test_unreadable_file_moves_to_failed_with_an_error_file(drop: Path, name: str, content: bytes, reason: str) -> None:
    source = _write(drop / name, content)

    result = claim_file(source, drop)

    assert result.error is not None and result.error.startswith(reason)
    assert result.records == [] and result.path_processed is None
    assert result.path_failed == drop / "failed" / name
    assert result.path_failed.read_bytes() == content
    assert (drop / "failed" / f"{name}.error.txt").read_text() == f"{name}: {result.error}\n"
    assert _files(drop / "processed") == [] and not source.exists()


def test_name_collisions_never_overwrite(drop: Path) -> None:
    bodies = [json.dumps({**GOOD, "user": f"copy {n}"}) + "\nbad line\n" for n in range(3)]
    for body in bodies:
        claim_file(_write(drop / "chat.jsonl", body), drop)
    for attempt in range(2):
        claim_file(_write(drop / "bad.md", f"no front matter {attempt}"), drop)

    processed = drop / "processed"
    assert _files(processed) == ["chat.1.jsonl", "chat.2.jsonl", "chat.jsonl"]
    assert [(processed / name).read_text() for name in ("chat.jsonl", "chat.1.jsonl", "chat.2.jsonl")] == bodies
    assert _files(drop / "failed") == [
        "bad.1.md",
        "bad.1.md.error.txt",
        "bad.md",
        "bad.md.error.txt",
        "chat.rejected.1.jsonl",
        "chat.rejected.1.jsonl.error.txt",
        "chat.rejected.2.jsonl",
        "chat.rejected.2.jsonl.error.txt",
        "chat.rejected.jsonl",
        "chat.rejected.jsonl.error.txt",
    ]
    assert (drop / "failed" / "bad.1.md").read_text() == "no front matter 1"
    assert (drop / "failed" / "bad.1.md.error.txt").read_text().startswith("bad.md: line 1: no front matter")


def test_a_stray_error_file_is_never_paired_with_another_file(drop: Path) -> None:
    (drop / "failed" / "x.jsonl.error.txt").write_text("left over from something else\n")
    result = claim_file(_write(drop / "x.jsonl", b""), drop)
    assert result.path_failed == drop / "failed" / "x.1.jsonl"
    assert (drop / "failed" / "x.jsonl.error.txt").read_text() == "left over from something else\n"


def test_two_step_moves_nothing_until_finish(drop: Path) -> None:
    source = _write(drop / "chat.jsonl", json.dumps(GOOD) + "\n")
    parsed = read_and_parse(source)
    assert len(parsed.records) == 1
    assert source.exists() and _files(drop / "processed") == []  # a crash here loses nothing

    result = finish_file(source, drop, parsed)
    assert result.path_processed is not None and result.path_processed.exists()
    assert not source.exists()


def test_finishing_a_file_that_is_gone_is_a_clear_error(drop: Path) -> None:
    source = _write(drop / "chat.jsonl", json.dumps(GOOD) + "\n")
    parsed = read_and_parse(source)
    claim_file(source, drop)  # another process got there first
    with pytest.raises(DropFolderError, match=r"^chat\.jsonl is no longer in the drop folder"):
        finish_file(source, drop, parsed)
    assert _files(drop / "processed") == ["chat.jsonl"]


def test_unreadable_path_is_fatal_not_raised(drop: Path) -> None:
    (drop / "dir.jsonl").mkdir()
    parsed = read_and_parse(drop / "dir.jsonl")
    assert parsed.fatal is not None and parsed.fatal.startswith("cannot read the file")


def test_nothing_is_ever_lost(drop: Path) -> None:
    """Every input byte is in processed/ or failed/, and every non-blank line is a record or quarantined."""
    inputs = {
        "a.jsonl": "\n".join([json.dumps(GOOD), "{oops", "", json.dumps({"user_id": "x"}), json.dumps(GOOD)]),
        "b.jsonl": "nothing\nworks\nhere\n",
        "c.json": json.dumps([GOOD, 1, GOOD]),
        "d.md": "---\nuser_id: bob\ndate: 2024-01-01\n---\nAssistant: orphan\nUser: q\nAssistant: a\n",
        "e.jsonl": "\xff\xfe not utf-8",
        "f.json": "{ broken",
    }
    for name, text in inputs.items():
        _write(drop / name, text.encode("latin-1") if name == "e.jsonl" else text.encode())
    input_bytes = sum(len(path.read_bytes()) for path in drop.iterdir() if path.is_file())

    results = [claim_file(path, drop) for path in list_ready_files(drop)]

    assert _files(drop) == []
    moved = [r.path_processed or r.path_failed for r in results]
    assert sum(len(path.read_bytes()) for path in moved if path is not None) == input_bytes
    jsonl_lines = sum(1 for line in inputs["a.jsonl"].split("\n") + inputs["b.jsonl"].split("\n") if line.strip())
    jsonl_results = [r for r in results if r.path_processed is not None and r.path_processed.suffix == ".jsonl"]
    assert sum(len(r.records) + r.rejected_count for r in jsonl_results) == jsonl_lines
    quarantined = [
        line
        for name in ("a.rejected.jsonl", "b.rejected.jsonl")
        for line in (drop / "failed" / name).read_text().splitlines()
    ]
    assert quarantined == ["{oops", json.dumps({"user_id": "x"}), "nothing", "works", "here"]
    assert sum(len(r.records) for r in results) == 2 + 0 + 2 + 1
    assert {r.error.split(":")[0] for r in results if r.error} == {"line 1"}
    assert len(parse_exchange_file("c.json", inputs["c.json"].encode()).rejected) == 1
    # No temporary files are left behind by the quarantine writes.
    assert not [path for path in (drop / "failed").iterdir() if path.name.startswith(".")]
