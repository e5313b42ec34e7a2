"""The `.env` that `make setup` writes for plain `dagster` commands: an exported variable beats it.

Dagster's CLI loads ``.env`` from the working directory over the environment, so a plain
``YAK_DAGSTER_PG_URL=…`` line there beat ``export YAK_DAGSTER_PG_URL=…`` (another ``YAK_HOME``, an
external database) and ``dagster definitions validate`` went to ``./.yak/pgdata``. The line is now
``${YAK_DAGSTER_PG_URL:-…}``. The file is made by the Makefile's own rule, read by Dagster's own
loader, and used by a real ``dagster`` command.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dagster._core.secrets.env_file import get_env_var_dict

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DAGSTER = Path(sys.executable).parent / "dagster"


def _make_env(folder: Path) -> None:
    done = subprocess.run(["make", "-s", "-C", str(folder), "-f", str(PROJECT_ROOT / "Makefile"), ".env"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_env_file_gives_way_to_an_exported_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _make_env(tmp_path)
    embedded = f"postgresql+psycopg2://postgres:@/dagster?host={tmp_path}/.yak/pgdata"
    monkeypatch.delenv("YAK_DAGSTER_PG_URL", raising=False)
    assert get_env_var_dict(str(tmp_path)) == {"YAK_DAGSTER_PG_URL": embedded}
    monkeypatch.setenv("YAK_DAGSTER_PG_URL", "postgresql+psycopg2://me:pw@db.example:5432/dagster")
    assert get_env_var_dict(str(tmp_path)) == {
        "YAK_DAGSTER_PG_URL": "postgresql+psycopg2://me:pw@db.example:5432/dagster"}


def test_an_env_file_of_an_earlier_setup_gets_the_new_line_and_keeps_the_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".env").write_text("# Written by make setup for plain `dagster` commands in this folder (see README).\n"
                                   "MY_OWN=1\n"
                                   "YAK_DAGSTER_PG_URL=postgresql+psycopg2://postgres:@/dagster?host=/old/.yak/pgdata\n")
    _make_env(tmp_path)
    _make_env(tmp_path)  # and again: nothing more changes
    monkeypatch.setenv("YAK_DAGSTER_PG_URL", "postgresql+psycopg2://me@db.example/dagster")
    assert get_env_var_dict(str(tmp_path)) == {"MY_OWN": "1",
                                               "YAK_DAGSTER_PG_URL": "postgresql+psycopg2://me@db.example/dagster"}
    assert (tmp_path / ".env").read_text().count("YAK_DAGSTER_PG_URL=") == 1


def test_dagster_definitions_validate_uses_the_exported_url_over_the_env_file(db_url: str, tmp_path: Path) -> None:
    """The README's step: in the project folder (its dagster.yaml, the .env `make setup` wrote, which
    points at a ./.yak that has no server), with the URL exported, `dagster definitions validate` passes."""
    folder = tmp_path / "project"
    folder.mkdir()
    shutil.copy(PROJECT_ROOT / "dagster.yaml", folder / "dagster.yaml")
    _make_env(folder)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("YAK_", "DAGSTER_"))}
    env.update(PYTHONPATH=str(PROJECT_ROOT), YAK_EMBEDDER="hashing", YAK_HOME=str(tmp_path / "home"),
               YAK_DATABASE_URL=db_url,
               YAK_DAGSTER_PG_URL=re.sub(r"^postgres(ql)?://", "postgresql+psycopg2://", db_url))
    done = subprocess.run([str(DAGSTER), "definitions", "validate", "-m", "yak_pipeline.definitions"], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Validation successful" in done.stdout + done.stderr
