"""Bad input (issue 6 §5, drop folder): hypothesis-generated files through the real drop-folder sensor
and the claiming its requested runs do.

Random bytes, wrong encodings, huge lines, deep JSON, missing fields, bad dates, unknown users,
``|`` in user ids and 10 MB files: every record ends up either stored in PostgreSQL or quarantined
in ``failed/`` with its original text and a reason, never lost, and the sensor never raises.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from yak_pipeline.defs.automation.sensors import drop_folder_sensor
from yak_pipeline.defs.exchanges.assets import DROP_FILES_TAG
from yak_pipeline.defs.resources import PostgresResource
from yak_pipeline.ingestion.claim import claim_drop_files
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline_tests.pipeline_helpers import drop_dir, fetch_all, new_instance, pipeline_env  # noqa: F401 - fixtures
from yak_pipeline_tests.reliability_helpers import report_figure

pytestmark = pytest.mark.usefixtures("pipeline_env")

MAX_RECORD_CHARS = 200_000  # the parser's limit on one record


def _tick(instance: dg.DagsterInstance, settings: Settings) -> dg.SensorResult:
    context = dg.build_sensor_context(instance=instance,
                                      resources={"postgres": PostgresResource.from_settings(settings)})
    result = drop_folder_sensor(context)  # must never raise, whatever the files hold
    assert isinstance(result, dg.SensorResult)
    return result


def _store_requested(database: Database, drop: Path, result: dg.SensorResult) -> None:
    """What each requested run's ``raw_exchanges`` does with its files (the asset's own call, without
    a Dagster run per partition: a batch here asks for dozens; test_pipeline_sensors runs them)."""
    for request in result.run_requests:
        # A partition whose memories wait from an earlier batch is requested without files.
        claim_drop_files(database, drop, names=json.loads(request.tags.get(DROP_FILES_TAG, "[]")))


def _drop(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    past = time.time() - 60  # finished writing a minute ago: ready to claim
    os.utime(path, (past, past))
    return path


# --- generated records -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One generated record: its raw text and, if it can only be a good exchange, what must be stored."""

    raw: str
    token: str  # a unique marker inside the exchange text, when there is one
    user_id: str | None  # set for a good record: the user it must be stored for

    @property
    def good(self) -> bool:
        return self.user_id is not None


def _unique() -> str:
    """A fresh marker of fixed length (so it never changes what hypothesis draws next)."""
    return uuid.uuid4().hex[:12]


good_users = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,20}", fullmatch=True)
bad_users = st.one_of(st.just("eve|x"), st.just("|"), st.just(""), st.just(" alice"), st.just("a" * 65),
                      st.text(max_size=10).filter(lambda u: not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}", u)),
                      st.integers(), st.none())
good_dates = st.sampled_from(["2026-03-14", "2026-03-14T10:00:00Z", "2025-12-31T23:59:59+05:00", "2001-01-01"])
bad_dates = st.one_of(st.sampled_from(["1999-12-31", "2999-01-01", "yesterday", "2026-13-01", "2026-02-30T10:00",
                                       "0001-01-01T00:00+01:00", "", "  "]),
                      st.integers(), st.lists(st.integers(), max_size=2), st.text(max_size=12))
texts = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=80)


@st.composite
def records(draw: st.DrawFn) -> Line:
    """One JSON record: good, or broken in one of the ways the issue lists."""
    token = f"tok{_unique()}x"
    kind = draw(st.sampled_from(["good", "good", "good", "bad_user", "pipe_user", "bad_date", "missing", "wrong_type",
                                 "content_form", "huge", "deep", "not_object", "broken_json", "nul"]))
    user_text = f"{token} {draw(texts)}"
    record: dict = {"user_id": draw(good_users), "user": user_text, "assistant": draw(texts)}
    if draw(st.booleans()):
        record["occurred_at"] = draw(good_dates)
    if kind == "good":
        # The stored text is stripped; a text that strips to nothing is a (legitimate) reject.
        good = record["assistant"].strip() != "" and "\x00" not in user_text + record["assistant"]
        return Line(json.dumps(record, ensure_ascii=draw(st.booleans())), token, record["user_id"] if good else None)
    if kind == "bad_user":
        record["user_id"] = draw(bad_users)
    elif kind == "pipe_user":
        record["user_id"] = f"{draw(good_users)}|{draw(good_users)}"
    elif kind == "bad_date":
        record["occurred_at"] = draw(bad_dates)
    elif kind == "missing":
        del record[draw(st.sampled_from(["user_id", "user", "assistant"]))]
    elif kind == "wrong_type":
        record[draw(st.sampled_from(["user", "assistant"]))] = draw(st.one_of(st.integers(), st.lists(st.text()),
                                                                              st.booleans()))
    elif kind == "content_form":
        del record["user"], record["assistant"]
        record["content"] = draw(st.sampled_from([f"{token} no roles here", f"User: {token}\nAssistant:",
                                                  f"Assistant: {token}\nUser: hi"]))
    elif kind == "huge":
        record["user"] = token + "x" * (MAX_RECORD_CHARS + draw(st.integers(1, 1000)))
    elif kind == "deep":
        depth = draw(st.integers(1000, 100_000))
        return Line("[" * depth + "]" * depth, token, None)
    elif kind == "not_object":
        return Line(json.dumps(draw(st.one_of(st.integers(), st.text(max_size=20), st.lists(st.integers())))), token, None)
    elif kind == "broken_json":
        text = json.dumps(record)
        return Line(text[: draw(st.integers(1, len(text) - 1))], token, None)
    elif kind == "nul":
        record["assistant"] = "bad \u0000 byte"
    # Anything but a good record is rejected; its token must then not be found.
    return Line(json.dumps(record), token, None)


@st.composite
def files(draw: st.DrawFn) -> tuple[str, bytes, list[Line] | None, str]:
    """A drop file: its name, bytes, the records in it (None: random bytes) and how they were laid out."""
    lines = draw(st.lists(records(), min_size=1, max_size=8))
    layout = draw(st.sampled_from(["jsonl", "jsonl", "json", "utf16", "latin1", "random"]))
    name = f"f{_unique()}.{'json' if layout == 'json' else 'jsonl'}"
    if layout == "json":
        return name, ("[\n" + ",\n".join(line.raw for line in lines) + "\n]").encode(), lines, layout
    text = "\n".join(line.raw for line in lines) + draw(st.sampled_from(["", "\n", "\n\n", "\r\n"]))
    if layout == "utf16":
        return name, text.encode("utf-16"), lines, layout
    if layout == "latin1":  # a wrong encoding: fine if it happens to be ASCII, unreadable otherwise
        return name, (text + " café").encode("latin-1", "replace"), lines, layout
    if layout == "random":
        return name, draw(st.binary(min_size=1, max_size=2000)), None, layout
    return name, text.encode(), lines, layout


def _reasons(error_file: Path) -> dict[int, str]:
    """``line N: reason`` (or ``item N: …``) lines of a quarantine error file."""
    found = {}
    for line in error_file.read_text().splitlines():
        match = re.match(r"(?:line|item) (\d+): (.+)", line)
        assert match, line
        found[int(match.group(1))] = match.group(2)
    return found


def _account(drop: Path, name: str, data: bytes, lines: list[Line] | None, database: Database) -> tuple[int, int]:
    """Check where every record of one claimed file went; return (stored, quarantined)."""
    assert not (drop / name).exists()
    processed, failed = drop / "processed" / name, drop / "failed" / name
    assert processed.exists() != failed.exists()
    if failed.exists():  # unreadable as a whole: kept byte for byte, with the reason beside it
        assert failed.read_bytes() == data
        reason = (drop / "failed" / f"{name}.error.txt").read_text()
        assert reason.startswith(f"{name}: ") and len(reason.strip()) > len(name) + 2
        return 0, len(lines) if lines else 1
    assert processed.read_bytes() == data  # the original is kept too
    stem, suffix = name.rsplit(".", 1)
    rejected_file = drop / "failed" / f"{stem}.rejected.{suffix}"
    reasons = _reasons(Path(f"{rejected_file}.error.txt")) if rejected_file.exists() else {}
    rejected_text = rejected_file.read_text() if rejected_file.exists() else ""
    if lines is None:  # random bytes that happen to decode: every non-blank line is a reject
        numbers = {n for n, text in enumerate(data.decode("utf-8").split("\n"), start=1) if text.strip(" \t\r\n")}
        assert set(reasons) == numbers
        return 0, len(reasons)
    stored = 0
    for number, line in enumerate(lines, start=1):
        found = fetch_all(database, "SELECT user_id FROM memories WHERE strpos(content, %s) > 0", (line.token,))
        if number in reasons:
            assert found == [], (number, line.raw[:200], reasons[number])  # rejected, so not stored
            # Quarantined as written, or (refused at ingestion, e.g. a date before 2000) as a record with
            # the same text that can be fixed and dropped again.
            assert line.raw in rejected_text or (line.token in line.raw and line.token in rejected_text)
        else:
            assert line.good, (number, line.raw[:200])  # a bad record is never silently dropped
            assert found == [(line.user_id,)], (number, line.raw[:200])  # a good one is stored, once
            stored += 1
    assert set(reasons) <= set(range(1, len(lines) + 1))
    return stored, len(reasons)


@hypothesis_settings(max_examples=60, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                            HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(batch=st.lists(files(), min_size=1, max_size=4))
def test_every_dropped_record_is_stored_or_quarantined_with_a_reason_and_the_sensor_never_raises(
        settings: Settings, database: Database, drop_dir: Path, batch: list) -> None:
    instance = new_instance()
    for name, data, _, _ in batch:
        _drop(drop_dir, name, data)

    result = _tick(instance, settings)
    _store_requested(database, drop_dir, result)

    for name, data, lines, _ in batch:
        _account(drop_dir, name, data, lines, database)
    users = {u for (u,) in fetch_all(database, "SELECT DISTINCT user_id FROM memories")}
    assert not any("|" in u for u in users)  # '|' would break the user|date partition keys
    added = {key for request in result.dynamic_partitions_requests if request.partitions_def_name == "users"
             for key in request.partition_keys}
    assert added <= users


@pytest.mark.slow
@pytest.mark.xdist_group("ten_megabytes")  # minutes of storing: `make test-slow` gives it a worker of its own
def test_ten_megabyte_files_are_detected_in_one_tick_and_stored_with_nothing_lost(settings: Settings, database: Database,
                                                                     drop_dir: Path) -> None:
    ten_mb = 10 * 1024 * 1024
    # A 10 MB line between two good records: quarantined whole, the others stored.
    good = [json.dumps({"user_id": "alice", "user": f"I keep bee hive {i}.", "assistant": "ok",
                        "occurred_at": "2026-03-14"}) for i in range(2)]
    huge_line = json.dumps({"user_id": "alice", "user": "x" * ten_mb, "assistant": "ok"})
    _drop(drop_dir, "huge-line.jsonl", "\n".join([good[0], huge_line, good[1]]).encode())
    # 10 MB of random bytes.
    _drop(drop_dir, "noise.jsonl", os.urandom(ten_mb))
    # 10 MB of ordinary exchanges: an exported chat history.
    lines, size, i = [], 0, 0
    while size < ten_mb:
        line = json.dumps({"user_id": f"hist{i % 20}", "user": f"History line {i}: we talked about topic {i * 7}.",
                           "assistant": f"Answer {i} with some more words to make it a realistic reply.",
                           "occurred_at": f"2026-02-{1 + i % 28:02d}T10:00:00Z"})
        lines.append(line)
        size += len(line) + 1
        i += 1
    _drop(drop_dir, "history.jsonl", ("\n".join(lines) + "\n").encode())

    started = time.monotonic()
    result = _tick(new_instance(), settings)
    seconds = time.monotonic() - started
    started = time.monotonic()
    _store_requested(database, drop_dir, result)
    storing = time.monotonic() - started

    reasons = _reasons(drop_dir / "failed" / "huge-line.rejected.jsonl.error.txt")
    assert list(reasons) == [2] and "more than 200000" in reasons[2]
    assert (drop_dir / "failed" / "huge-line.rejected.jsonl").read_text() == huge_line + "\n"
    assert (drop_dir / "failed" / "noise.jsonl").stat().st_size == ten_mb
    assert (drop_dir / "failed" / "noise.jsonl.error.txt").read_text().startswith("noise.jsonl: ")
    assert (drop_dir / "processed" / "history.jsonl").exists()
    counts = dict(fetch_all(database, "SELECT user_id LIKE 'hist%%', count(*) FROM memories GROUP BY 1"))
    assert counts == {False: 2, True: len(lines)}
    report_figure("10 MB drop files", f"one tick in {seconds:.1f} s (detect and parse), the runs' storing in "
                  f"{storing:.1f} s: a 10 MB line quarantined whole with its reason "
                  f"(2 good lines stored), 10 MB of random bytes moved to failed/ with an error file, "
                  f"10 MB of exchanges ({len(lines)} records) all stored; 0 lost")
