"""The console's drop line names the first rejected record's place and reason, as the README promises.

`yak up`'s console prints what the drop-folder sensor (a file with nothing to store) and the
memory runs' ``raw_exchanges`` (files with exchanges) log at INFO; both log through
``ClaimReport.log_to``. Each path is driven as the daemon drives it, on a real database and disk.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import dagster as dg
import pytest

from yak_pipeline.defs.automation.sensors import drop_folder_sensor
from yak_pipeline.defs.exchanges.assets import DROP_FILES_TAG, raw_exchanges
from yak_pipeline.defs.resources import PostgresResource
from yak_pipeline.settings import Settings
from yak_pipeline_tests.pipeline_helpers import (
    DAY,
    drop_dir,  # noqa: F401 - fixture
    new_instance,
    pipeline_env,  # noqa: F401 - fixture
    pipeline_resources,
    run_partition,
)

pytestmark = pytest.mark.usefixtures("pipeline_env")

BAD_USER_REASON = ("user_id: invalid user id 'eve|x': use 1-64 letters, digits, '.', '_', '@' or '-', starting with a "
                   "letter or digit")


def _record(user_id: str, text: str) -> dict:
    return {"user_id": user_id, "user": text, "assistant": "Noted.", "occurred_at": f"{DAY.isoformat()}T10:00:00Z"}


def _drop(folder: Path, name: str, *records: dict | str) -> None:
    """A finished drop file (written a minute ago) of JSON lines."""
    path = folder / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    past = time.time() - 60
    os.utime(path, (past, past))


def test_a_file_whose_only_record_is_rejected_gets_its_reason_on_the_console(
        settings: Settings, drop_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    _drop(drop_dir, "broken.jsonl", _record("eve|x", "I own a boat."))
    context = dg.build_sensor_context(instance=new_instance(),
                                      resources={"postgres": PostgresResource.from_settings(settings)})
    capfd.readouterr()

    result = drop_folder_sensor(context)

    assert result.run_requests == []  # nothing to store: the tick itself quarantines it
    printed = capfd.readouterr()
    lines = [line for line in (printed.out + printed.err).splitlines() if "drop file broken.jsonl" in line]
    assert len(lines) == 1, printed
    assert lines[0].endswith(f"drop file broken.jsonl: 0 stored, 0 duplicates, 1 rejected (line 1: {BAD_USER_REASON})")
    # The same words as the quarantine's error file, which `yak queue status` lists.
    assert (drop_dir / "failed" / "broken.rejected.jsonl.error.txt").read_text() == f"line 1: {BAD_USER_REASON}\n"


def test_a_run_storing_a_mixed_file_names_its_first_rejection_and_counts_the_rest(
        settings: Settings, drop_dir: Path) -> None:
    _drop(drop_dir, "mixed.jsonl", _record("carol", "I have a cat."), _record("eve|x", "I own a boat."),
          '{"user_id": "carol", "user": "unterminated')
    instance = new_instance()

    run = run_partition(instance, pipeline_resources(settings), "carol", DAY, assets=[raw_exchanges],
                        tags={DROP_FILES_TAG: json.dumps(["mixed.jsonl"])})

    assert run.success
    messages = [entry.user_message for entry in instance.all_logs(run.run_id)
                if entry.user_message.startswith("drop file ")]
    assert messages == [f"drop file mixed.jsonl: 1 stored, 0 duplicates, 2 rejected (line 2: {BAD_USER_REASON}; "
                        "1 more in failed/)"]
