"""A dropped record's reason names the field that is missing or wrong (pydantic validation), the
quarantine keeps its line, and a transcript's front matter is read as YAML."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from yak_pipeline.ingestion.drop_folder import quarantine_records
from yak_pipeline.ingestion.formats.exchange_files import parse_exchange_file

_GOOD = {"user_id": "ana", "user": "Where do I live?", "assistant": "In Porto."}


def _reasons(name: str, *objects: object) -> list[tuple[int, str]]:
    data = "\n".join(json.dumps(obj) for obj in objects).encode()
    parsed = parse_exchange_file(name, data)
    assert parsed.fatal is None
    return [(rejected.line, rejected.reason) for rejected in parsed.rejected]


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"user_id": "ana", "user": "Where?"}, "assistant: field required"),
        ({"user_id": "ana", "assistant": "In Porto."}, "user: field required"),
        ({"user": "q", "assistant": "a"}, "user_id: field required"),
        ({**_GOOD, "user_id": 7}, "user_id: must be a string, got a number"),
        ({**_GOOD, "user_id": None}, "user_id: must be a string, got null"),
        ({**_GOOD, "assistant": ["In", "Porto"]}, "assistant: must be a string, got a list"),
        ({**_GOOD, "user": {"text": "q"}}, "user: must be a string, got an object"),
        ({**_GOOD, "user": "\t "}, "user: is empty"),
        ({**_GOOD, "occurred_at": True}, "occurred_at: must be an ISO-8601 date or datetime string, got a boolean"),
        ({**_GOOD, "occurred_at": "13/05/2024"}, "occurred_at: '13/05/2024' is not an ISO-8601 date or datetime"),
        ({"user_id": "ana", "content": 3}, "content: must be a string, got a number"),
        ({"user_id": "ana", "content": "User: \nAssistant: a"}, "content: the User part is empty"),
    ],
)
def test_a_missing_or_ill_typed_field_is_named_in_the_reason(record: dict[str, object], reason: str) -> None:
    assert _reasons("r.jsonl", _GOOD, record) == [(2, reason)]
    assert _reasons("r.json", [_GOOD, _GOOD, record]) == [(3, reason)]


def test_the_first_bad_field_is_named_and_other_keys_are_ignored() -> None:
    record = {"user_id": "a|b", "user": 1, "assistant": None, "model": "gpt-4o", "tags": ["x"]}
    [(line, reason)] = _reasons("r.jsonl", record)
    assert line == 1 and reason.startswith("user_id: invalid user id 'a|b'")
    assert _reasons("r.jsonl", {**_GOOD, "model": "gpt-4o", "tags": ["x"], "user_id": "ana"}) == []


def test_a_reason_quoting_braces_is_kept_as_written() -> None:
    # Pydantic formats its messages as templates; user input must not be read as a placeholder.
    assert _reasons("r.jsonl", {**_GOOD, "occurred_at": "{when}"}) == [
        (1, "occurred_at: '{when}' is not an ISO-8601 date or datetime")]


def test_the_quarantine_names_the_line_and_the_field(tmp_path: Path) -> None:
    data = "\n".join([json.dumps(_GOOD), "", json.dumps({"user_id": "ana", "assistant": "a"})]).encode()
    parsed = parse_exchange_file("mine.jsonl", data)
    quarantine_records("mine.jsonl", tmp_path, parsed.rejected)
    errors = (tmp_path / "failed" / "mine.rejected.jsonl.error.txt").read_text()
    assert errors == "line 3: user: field required\n"


# --- front matter as YAML ---------------------------------------------------------------------------


def _markdown(front: str, default_user: str | None = None) -> tuple[str | None, list[tuple[str, datetime | None]]]:
    text = f"---\n{front}\n---\nUser: Where do I live?\nAssistant: In Porto.\n"
    parsed = parse_exchange_file("chat.md", text.encode(), default_user=default_user)
    return parsed.fatal, [(record.user_id, record.occurred_at) for record in parsed.records]


def test_front_matter_is_read_as_yaml() -> None:
    front = (
        "title: 'Moving: a chat'   # quoted, so its colon is text\n"
        "User_ID: \"0042\"\n"
        "date: 2024-05-01T10:00:00+02:00  # the day we moved\n"
        "tags:\n  - move\n  - porto\n"
        "notes: |\n  several\n  lines\n"
    )
    assert _markdown(front) == (None, [("0042", datetime(2024, 5, 1, 8, tzinfo=UTC))])
    # A scalar is its text as written: YAML would read 0042 as a number and a bare date as a date.
    assert _markdown("user_id: 0042\ndate: 2024-05-01") == (None, [("0042", datetime(2024, 5, 1, tzinfo=UTC))])
    assert _markdown("date: 2024-05-01", default_user="ana") == (None, [("ana", datetime(2024, 5, 1, tzinfo=UTC))])


@pytest.mark.parametrize(
    ("front", "fatal"),
    [
        ("user_id: ana\ndate: [2024, 5]", "line 3: date: must be an ISO-8601 date or datetime string, got a list"),
        ("user_id:\n  name: ana\ndate: 2024-05-01", "line 2: user_id: must be a string, got an object"),
        ("user_id: ana\ndate: someday", "line 3: date: 'someday' is not an ISO-8601 date or datetime"),
        ("user_id: ana", "line 3: front matter has no date"),
        ("- ana\n- 2024-05-01", "line 2: front matter must be 'key: value' lines, got a list"),
        ("user_id: ana\ndate: 2024-05-01\ndate: 2024-05-02", "line 4: front matter gives date twice (first on line 3)"),
    ],
)
def test_front_matter_fields_are_named_with_their_line(front: str, fatal: str) -> None:
    assert _markdown(front) == (fatal, [])


@pytest.mark.parametrize(
    ("front", "fatal"),
    [
        ("title: Moving: a chat\nuser_id: ana\ndate: 2024-05-01",
         "line 2: front matter is not valid YAML: mapping values are not allowed here"),
        ("user_id: ana\ndate: 2024-05-01\ntags: [move, porto",
         "line 4: front matter is not valid YAML: expected ',' or ']', but got '<stream end>'"),
        ("user_id: ana\n\tdate: 2024-05-01",
         "line 3: front matter is not valid YAML: found character '\\t' that cannot start any token"),
        ("user_id: ana\ndate: 2024-05-01\nx: \x07", "line 4: front matter is not valid YAML: special characters "
                                                    "are not allowed (#x0007)"),
        ("user_id: !!python/object:os.system ana\ndate: 2024-05-01",
         "line 2: front matter is not valid YAML: could not determine a constructor for the tag "
         "'tag:yaml.org,2002:python/object:os.system'"),
    ],
)
def test_malformed_yaml_front_matter_is_one_line_with_its_line(front: str, fatal: str) -> None:
    assert _markdown(front) == (fatal, [])
