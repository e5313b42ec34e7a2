"""Bad input (issue 6 §5, API): schemathesis against ``/openapi.json`` of a live ``yak serve``.

Every operation of the published schema is fuzzed with a valid admin key (schema examples,
boundary values and random data, valid and invalid); the run must see zero 5xx responses and
zero responses that break the schema the API itself publishes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import Seeded, seeded  # noqa: F401 - fixture
from yak_pipeline_tests.reliability_helpers import report_figure, yak_env, yak_serve

pytestmark = pytest.mark.slow

ADMIN_KEY = "fuzz-admin-key-0123456789abcdef"
CHECKS = "not_a_server_error,response_schema_conformance,content_type_conformance"
ST = Path(sys.executable).parent / "st"


def test_schemathesis_finds_no_server_error_and_no_schema_violation(
        db_url: str, database: Database, seeded: Seeded, tmp_path: Path) -> None:
    env = yak_env(db_url, tmp_path / "home", YAK_ADMIN_API_KEY=ADMIN_KEY)
    with yak_serve(env, tmp_path) as server:
        operations = sum(len(methods) for methods in httpx.get(f"{server.url}/openapi.json").json()["paths"].values())
        report_dir = tmp_path / "st-report"
        run = subprocess.run(
            [str(ST), "run", f"{server.url}/openapi.json", "--checks", CHECKS, "--header", f"X-API-Key: {ADMIN_KEY}",
             "--phases", "examples,coverage,fuzzing", "--max-examples", "25", "--workers", "2", "--seed", "6",
             "--report", "ndjson", "--report-dir", str(report_dir), "--request-timeout", "30",
             "--suppress-health-check", "all", "--generation-database", "none", "--no-color"],
            capture_output=True, text=True, timeout=900, cwd=tmp_path)
        logs = server.logs()
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    statuses: dict[int, int] = {}
    for report in report_dir.glob("*.ndjson"):
        for line in report.read_text().splitlines():
            for code in re.findall(r'"status_code":\s*(\d{3})', line):
                statuses[int(code)] = statuses.get(int(code), 0) + 1
    assert statuses, output[-3000:]
    assert not [code for code in statuses if code >= 500], statuses
    assert "Traceback" not in logs
    summary = [line.strip() for line in output.splitlines() if re.search(r"\b(passed|failed|test cases)\b", line)]
    report_figure("schemathesis", f"{operations} operations, {sum(statuses.values())} responses "
                  f"({json.dumps(dict(sorted(statuses.items())))}): 0 5xx, 0 schema violations; "
                  + " / ".join(summary[-3:]))
