"""Parsing dropped exchange files: each format, every kind of bad input, and never an exception."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from yak_pipeline.core.exchanges import parse_exchange
from yak_pipeline.ingestion.formats.exchange_files import SUPPORTED_SUFFIXES, exchange_file_suffix, parse_exchange_file
from yak_pipeline.ingestion.formats.exchange_records import ExchangeRecord, ParsedFile


def _jsonl(*objects: object) -> bytes:
    return "".join(json.dumps(obj) + "\n" for obj in objects).encode()


def _is_blank(line: str) -> bool:
    return not line.strip(" \t\r\n")


def _assert_well_formed(parsed: ParsedFile) -> None:
    """Invariants of every result: fatal excludes records, reasons are single lines."""
    assert isinstance(parsed, ParsedFile)
    if parsed.fatal is not None:
        assert parsed.records == () and parsed.rejected == ()
        assert parsed.fatal and "\n" not in parsed.fatal and "\r" not in parsed.fatal
    for rejected in parsed.rejected:
        assert rejected.reason and len(rejected.reason.splitlines()) == 1
        assert rejected.line >= 1
    for record in parsed.records:
        assert parse_exchange(record.content) is not None
        assert record.occurred_at is None or record.occurred_at.utcoffset() is not None


# --- happy paths ----------------------------------------------------------------------------------


def test_jsonl_records_in_both_forms_with_dates_in_utc() -> None:
    data = _jsonl(
        {"user_id": "alice", "user": "Hi", "assistant": "Hello!", "occurred_at": "2024-03-01T10:00:00+02:00"},
        {"user_id": "alice", "content": "User: Where?\nAssistant: Paris.", "occurred_at": "2024-03-02T09:30:00Z"},
        {"user_id": "bob@example.com", "user": "Naive", "assistant": "UTC", "occurred_at": "2024-03-03 12:00"},
        {"user_id": "bob", "user": "Date only", "assistant": "Midnight", "occurred_at": "2024-03-04", "extra": [1]},
        {"user_id": "bob", "user": "No date", "assistant": "None"},
    )
    parsed = parse_exchange_file("chat.jsonl", data)

    assert parsed.fatal is None and parsed.rejected == ()
    assert parsed.records[0] == ExchangeRecord(
        "alice", "User: Hi\nAssistant: Hello!", datetime(2024, 3, 1, 8, 0, tzinfo=UTC), 1
    )
    assert parsed.records[1].content == "User: Where?\nAssistant: Paris."
    assert parsed.records[1].occurred_at == datetime(2024, 3, 2, 9, 30, tzinfo=UTC)
    assert parsed.records[2].occurred_at == datetime(2024, 3, 3, 12, 0, tzinfo=UTC)
    assert parsed.records[3].occurred_at == datetime(2024, 3, 4, tzinfo=UTC)
    assert parsed.records[4].occurred_at is None
    assert [record.line for record in parsed.records] == [1, 2, 3, 4, 5]


def test_json_single_object_and_list() -> None:
    single = parse_exchange_file("one.json", b'{"user_id": "carol", "user": "a", "assistant": "b"}')
    assert single.fatal is None
    assert single.records == (ExchangeRecord("carol", "User: a\nAssistant: b", None, 1),)

    many = parse_exchange_file(
        "many.json",
        json.dumps(
            [
                {"user_id": "carol", "user": "one", "assistant": "1"},
                {"user_id": "carol", "content": "User: two\nAssistant: 2", "occurred_at": "2023-12-31T23:00:00-01:00"},
            ],
            indent=2,
        ).encode(),
    )
    assert many.fatal is None and many.rejected == ()
    assert [(record.line, record.content) for record in many.records] == [
        (1, "User: one\nAssistant: 1"),
        (2, "User: two\nAssistant: 2"),
    ]
    assert many.records[1].occurred_at == datetime(2024, 1, 1, tzinfo=UTC)


def test_markdown_transcript_with_multiline_blocks() -> None:
    text = (
        "---\n"
        'user_id: "dana"\n'
        "date: 2024-05-01T18:00:00+02:00  # the evening we planned the trip\n"
        "tags:\n"
        "  - travel\n"
        "---\n"
        "# Trip planning\n"
        "\n"
        "User: Where should we go?\n"
        "Somewhere warm, please.\n"
        "\n"
        "Assistant: Lisbon.\n"
        "\n"
        "  It is warm in May.\n"
        "User: And when?\n"
        "Assistant: Early June.\n"
    )
    parsed = parse_exchange_file("trip.md", text.replace("\n", "\r\n").encode())

    assert parsed.fatal is None and parsed.rejected == ()
    when = datetime(2024, 5, 1, 16, 0, tzinfo=UTC)
    assert parsed.records == (
        ExchangeRecord(
            "dana",
            "User: Where should we go?\nSomewhere warm, please.\nAssistant: Lisbon.\n\n  It is warm in May.",
            when,
            9,
        ),
        ExchangeRecord("dana", "User: And when?\nAssistant: Early June.", when, 15),
    )


def test_utf8_byte_order_mark_is_accepted() -> None:
    data = b"\xef\xbb\xbf" + _jsonl({"user_id": "eve", "user": "x", "assistant": "y"})
    parsed = parse_exchange_file("bom.jsonl", data)
    assert parsed.fatal is None
    assert [record.user_id for record in parsed.records] == ["eve"]


def test_suffix_is_case_insensitive_and_others_are_unsupported() -> None:
    assert SUPPORTED_SUFFIXES == (".jsonl", ".json", ".md")
    assert exchange_file_suffix("Export.JSONL") == ".jsonl"
    assert exchange_file_suffix("notes.txt") is None
    assert exchange_file_suffix(".jsonl") is None  # a hidden file named only by its suffix
    parsed = parse_exchange_file("notes.txt", b"User: a\nAssistant: b")
    assert parsed.fatal is not None and "unsupported file type" in parsed.fatal


# --- bad records ----------------------------------------------------------------------------------


def test_mixed_jsonl_keeps_good_records_and_rejects_bad_ones_with_line_numbers() -> None:
    good = {"user_id": "alice", "user": "Hi", "assistant": "Hello"}
    lines = [
        json.dumps(good),  # 1
        "",  # 2: blank, skipped
        '{"user_id": "alice", "user": "Hi"',  # 3: truncated JSON
        json.dumps({"user_id": "a|b", "user": "x", "assistant": "y"}),  # 4
        json.dumps({"user": "x", "assistant": "y"}),  # 5
        json.dumps({"user_id": "alice", "user": "x"}),  # 6
        json.dumps({"user_id": "alice", "user": 42, "assistant": "y"}),  # 7
        json.dumps(["alice", "x", "y"]),  # 8
        json.dumps({**good, "occurred_at": "yesterday"}),  # 9
        json.dumps({**good, "occurred_at": 1700000000}),  # 10
        json.dumps({"user_id": "alice", "content": "just some text"}),  # 11
        json.dumps({"user_id": "alice", "user": "   ", "assistant": "y"}),  # 12
        json.dumps({"user_id": "alice"}),  # 13
        json.dumps({**good, "user": "x" * 500}),  # 14: over the size limit below
        json.dumps({**good, "user": "nul \u0000 inside"}),  # 15
        json.dumps({**good, "assistant": "half \ud800 pair"}),  # 16
        json.dumps({**good, "occurred_at": "0001-01-01T00:00:00+05:00"}),  # 17
        json.dumps({"user_id": "alice", "content": "User: only a question\nAssistant:  "}),  # 18
        json.dumps({**good, "user": "last good"}),  # 19
    ]
    parsed = parse_exchange_file("mixed.jsonl", "\n".join(lines).encode(), max_record_chars=400)

    assert parsed.fatal is None
    assert [record.line for record in parsed.records] == [1, 19]
    reasons = {rejected.line: rejected.reason for rejected in parsed.rejected}
    assert sorted(reasons) == list(range(3, 19))
    assert reasons[3].startswith("invalid JSON at column")
    assert reasons[4].startswith("user_id: invalid user id 'a|b'")
    assert reasons[5] == "user_id: field required"
    assert reasons[6] == "assistant: field required"
    assert reasons[7] == "user: must be a string, got a number"
    assert reasons[8] == "expected a JSON object with user_id, user and assistant, got a list"
    assert reasons[9] == "occurred_at: 'yesterday' is not an ISO-8601 date or datetime"
    assert reasons[10] == "occurred_at: must be an ISO-8601 date or datetime string, got a number"
    assert reasons[11].startswith("content: not in") and "User: …" in reasons[11]
    assert reasons[12] == "user: is empty"
    assert reasons[13].startswith('needs "user" and "assistant"')
    assert reasons[14] == f"record is {len(lines[13])} characters, more than 400"
    assert reasons[15].startswith("user: contains a NUL")
    assert reasons[16].startswith("assistant: contains an unpaired surrogate (\\ud800)")
    assert reasons[17] == "occurred_at: '0001-01-01T00:00:00+05:00' is out of range"
    assert reasons[18] == "content: the Assistant part is empty"
    # The raw text is the line exactly as it was, so it can be fixed and dropped again.
    assert {rejected.line: rejected.raw for rejected in parsed.rejected}[3] == lines[2]


def test_deep_json_is_rejected_not_raised() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    good = json.dumps({"user_id": "a", "user": "b", "assistant": "c"})
    jsonl = parse_exchange_file("deep.jsonl", f"{deep}\n{good}".encode())
    assert [rejected.line for rejected in jsonl.rejected] == [1]
    assert jsonl.rejected[0].reason == "invalid JSON: nested too deep"
    assert len(jsonl.records) == 1

    whole = parse_exchange_file("deep.json", deep.encode())
    assert whole.fatal == "line 1: invalid JSON: nested too deep"


def test_huge_line_is_rejected_before_parsing() -> None:
    huge = '{"user_id": "a", "user": "' + "x" * 3_000_000 + '", "assistant": "b"}'
    parsed = parse_exchange_file("huge.jsonl", huge.encode())
    assert parsed.records == ()
    assert parsed.rejected[0].reason == f"record is {len(huge)} characters, more than 200000"
    assert parsed.rejected[0].raw == huge


def test_long_reasons_are_cut_to_one_short_line() -> None:
    parsed = parse_exchange_file("long.jsonl", _jsonl({"user_id": "x\n" * 10_000, "user": "a", "assistant": "b"}))
    (rejected,) = parsed.rejected
    assert len(rejected.reason) <= 300 and rejected.reason.endswith("…")
    assert "\n" not in rejected.reason


def test_json_list_items_are_rejected_by_index_with_their_exact_text() -> None:
    text = (
        "[\n"
        '  {"user_id": "ok", "user": "a", "assistant": "b"},\n'
        '  {"user_id": "bad|id",\n   "user": "a", "assistant": "b"},\n'
        "  7\n"
        "]\n"
    )
    parsed = parse_exchange_file("list.json", text.encode())
    assert [record.line for record in parsed.records] == [1]
    assert [(rejected.line, rejected.raw) for rejected in parsed.rejected] == [
        (2, '{"user_id": "bad|id",\n   "user": "a", "assistant": "b"}'),
        (3, "7"),
    ]


def test_markdown_dangling_blocks_are_rejected_and_pairs_kept() -> None:
    text = (
        "---\nuser_id: frank\ndate: 2024-01-02\n---\n"
        "Assistant: an answer with no question\n"  # 5
        "User: first\n"  # 6
        "Assistant: reply\n"  # 7
        "User: a question nobody answered\n"  # 8
        "User: empty reply\n"  # 9
        "Assistant:\n"  # 10
    )
    parsed = parse_exchange_file("t.md", text.encode())
    assert [(record.line, record.content) for record in parsed.records] == [(6, "User: first\nAssistant: reply")]
    assert [(rejected.line, rejected.reason) for rejected in parsed.rejected] == [
        (5, "Assistant block has no User block before it"),
        (8, "User block has no Assistant block after it"),
        (9, "Assistant block is empty"),
    ]
    assert parsed.rejected[2].raw == "User: empty reply\nAssistant:"


# --- whole-file failures --------------------------------------------------------------------------


_FRONT = b"---\nuser_id: a\ndate: 2024-01-01\n---\n"
_NO_EXCHANGE = "no exchange found: expected a 'User:' block followed by an 'Assistant:' block"
_UTF16 = "not UTF-8 text (byte 0xff at offset 0); it looks like UTF-16, save it as UTF-8"
_NUL = "contains a NUL character (a binary or UTF-16 file?); save it as UTF-8 text"
_NO_FRONT = "no front matter: start the file with '---', 'user_id: …', 'date: …', '---' lines"
_BAD_ID = "invalid user id 'a|b': use 1-64 letters, digits, '.', '_', '@' or '-', starting with a letter or digit"


@pytest.mark.parametrize(
    ("name", "data", "fatal"),
    [
        ("a.jsonl", b"", "line 1: file is empty"),
        ("a.md", b"\n  \n\t", "line 1: file is empty"),
        ("a.jsonl", b'{"user_id": "a"}\n{"user": "caf\xe9"}', "line 2: not UTF-8 text (byte 0xe9 at offset 30)"),
        ("a.json", "[]".encode("utf-16"), f"line 1: {_UTF16}"),
        ("a.jsonl", "{}".encode("utf-16-le"), f"line 1: {_NUL}"),
        ("a.json", b'[\n{"user_id": "a",\n"user": }]', "line 3: invalid JSON at column 9: Expecting value"),
        ("a.json", b'{"user_id": "a"} trailing', "line 1: invalid JSON at column 18: Extra data"),
        ("a.json", b'[{"user_id": "a"} {}]', "line 1: invalid JSON: expected ',' or ']' between list items"),
        ("a.json", b'[{"user_id": "a"},\n', "line 2: invalid JSON at column 1: Expecting value"),
        ("a.json", b"[] []", "line 1: invalid JSON: unexpected text after the list"),
        ("a.json", b"[]", "line 1: the JSON list is empty: there is no exchange in it"),
        ("a.json", b'"just a string"', "line 1: expected a JSON object or a list of objects, got a string"),
        ("a.md", b"User: hi\nAssistant: yo\n", f"line 1: {_NO_FRONT}"),
        ("a.md", _FRONT[:-4] + b"User: hi\n", "line 1: front matter is never closed with a '---' line"),
        ("a.md", b"---\ndate: 2024-01-01\n---\nUser: hi\nAssistant: yo\n", "line 3: front matter has no user_id"),
        ("a.md", b"---\nuser_id: a\n---\nUser: hi\nAssistant: yo\n", "line 3: front matter has no date"),
        ("a.md", b"---\nuser_id: a|b\ndate: 2024-01-01\n---\n", f"line 2: user_id: {_BAD_ID}"),
        ("a.md", b"---\nuser_id: a\ndate: soon\n---\n", "line 3: date: 'soon' is not an ISO-8601 date or datetime"),
        ("a.md", b"---\nuser_id: a\nuser_id: b\n---\n", "line 3: front matter gives user_id twice (first on line 2)"),
        ("a.md", _FRONT + b"Just notes.\n", f"line 5: {_NO_EXCHANGE}"),
        ("a.md", _FRONT + b"User: q1\nUser: q2\n", f"line 5: {_NO_EXCHANGE}"),
    ],
)
def test_whole_file_failures_name_the_line_and_the_reason(name: str, data: bytes, fatal: str) -> None:
    parsed = parse_exchange_file(name, data)
    assert parsed.fatal == fatal
    assert parsed.records == () and parsed.rejected == ()


def test_jsonl_with_every_line_bad_is_not_fatal() -> None:
    parsed = parse_exchange_file("bad.jsonl", b"nope\n[1]\n{}\n")
    assert parsed.fatal is None and parsed.records == ()
    assert [rejected.line for rejected in parsed.rejected] == [1, 2, 3]


# --- properties -----------------------------------------------------------------------------------

# No example database: the suite stays fast and writes nothing into the repository.
_FAST = settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

_json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
_json_values = st.recursive(
    _json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
_record_like = st.fixed_dictionaries(
    {},
    optional={
        "user_id": st.one_of(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._@|-]{0,8}", fullmatch=True), _json_values),
        "user": st.one_of(st.text(max_size=20), _json_values),
        "assistant": st.one_of(st.text(max_size=20), _json_values),
        "content": st.one_of(
            st.builds(lambda u, a: f"User: {u}\nAssistant: {a}", st.text(max_size=10), st.text(max_size=10)),
            _json_values,
        ),
        "occurred_at": st.one_of(
            st.none(), st.dates().map(str), st.datetimes().map(str), st.text(max_size=25), _json_values
        ),
    },
)


@_FAST
@given(suffix=st.sampled_from(SUPPORTED_SUFFIXES + (".txt",)), data=st.binary(max_size=400))
def test_arbitrary_bytes_never_raise(suffix: str, data: bytes) -> None:
    _assert_well_formed(parse_exchange_file("random" + suffix, data))


# The pieces of the three formats, plus the characters that break naive parsers.
_GARBAGE_ALPHABET = list('{}[]":,\n\r\t -_|UserAssistant:0123456789\u2028\ufeff\x00é')


@_FAST
@given(
    suffix=st.sampled_from(SUPPORTED_SUFFIXES),
    text=st.text(alphabet=st.sampled_from(_GARBAGE_ALPHABET), max_size=300),
    encoding=st.sampled_from(["utf-8", "utf-16", "latin-1"]),
)
def test_structured_garbage_in_any_encoding_never_raises(suffix: str, text: str, encoding: str) -> None:
    _assert_well_formed(parse_exchange_file("garbage" + suffix, text.encode(encoding, errors="replace")))


@_FAST
@given(
    lines=st.lists(
        st.one_of(_record_like.map(json.dumps), _json_values.map(json.dumps), st.text(max_size=30)), max_size=12
    )
)
def test_every_non_blank_jsonl_line_is_a_record_or_rejected(lines: list[str]) -> None:
    text = "\n".join(line.replace("\n", " ") for line in lines)
    parsed = parse_exchange_file("prop.jsonl", text.encode("utf-8", errors="surrogatepass"))
    _assert_well_formed(parsed)
    if parsed.fatal is not None:  # empty, NUL or (via surrogatepass) not UTF-8: the whole file is kept
        return
    lines_seen = text.removeprefix("\ufeff").split("\n")  # the parser drops a leading byte-order mark
    non_blank = [number for number, line in enumerate(lines_seen, start=1) if not _is_blank(line)]
    accounted = sorted([record.line for record in parsed.records] + [rejected.line for rejected in parsed.rejected])
    assert accounted == non_blank


@_FAST
@given(items=st.lists(st.one_of(_record_like, _json_values), min_size=1, max_size=8), indent=st.sampled_from([None, 2]))
def test_every_json_list_item_is_a_record_or_rejected(items: list[object], indent: int | None) -> None:
    parsed = parse_exchange_file("prop.json", json.dumps(items, indent=indent).encode())
    _assert_well_formed(parsed)
    assert parsed.fatal is None  # json.dumps escapes everything exotic, so the file always decodes
    accounted = sorted([record.line for record in parsed.records] + [rejected.line for rejected in parsed.rejected])
    assert accounted == list(range(1, len(items) + 1))
    for rejected in parsed.rejected:
        assert json.loads(rejected.raw) == items[rejected.line - 1]


_id_chars = st.text(alphabet=st.sampled_from(list("abcXYZ019._@-|")), max_size=10)


@_FAST
@given(head=_id_chars, tail=_id_chars)
def test_user_ids_with_a_pipe_are_rejected(head: str, tail: str) -> None:
    user_id = f"{head}|{tail}"  # Dagster joins partition dimensions with "|"
    parsed = parse_exchange_file("pipe.jsonl", _jsonl({"user_id": user_id, "user": "a", "assistant": "b"}))
    assert parsed.records == ()
    (rejected,) = parsed.rejected
    assert rejected.reason.startswith("user_id: invalid user id")

    # Quoted: a bare "|" starting a YAML value opens a block scalar.
    transcript = f"---\nuser_id: '{user_id}'\ndate: 2024-01-01\n---\nUser: a\nAssistant: b\n"
    assert (parse_exchange_file("pipe.md", transcript.encode()).fatal or "").startswith("line 2: user_id: invalid user id")
