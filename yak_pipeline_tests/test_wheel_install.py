"""A wheel install (not editable) carries the migrations: `pip install .` then `yak db migrate` works.

The migrations are package data (``yak_pipeline/sql/``, read with importlib.resources). This
builds the project from a copy of the source tree into a fresh virtual environment, offline: the
new environment sees the test environment's site-packages (dagster, psycopg, setuptools …) through
a ``.pth`` line, so nothing is downloaded, and ``--ignore-installed`` leaves the test environment's
own (editable) install alone. The installed ``yak`` then runs from outside the source tree, with
no PYTHONPATH, against a fresh database.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path

from yak_pipeline.store.migrations import discover_migrations
from yak_pipeline_tests.conftest import PROJECT_ROOT, create_database, drop_database


def _run(args: list[str], *, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_pip_install_of_the_project_then_db_migrate_applies_every_migration(pg_server_url: str, tmp_path: Path) -> None:
    # A copy of what `pip install .` reads: pip builds in the source tree (build/, *.egg-info),
    # which must not land in the checkout under test.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(PROJECT_ROOT / name, source / name)
    shutil.copytree(PROJECT_ROOT / "yak_pipeline", source / "yak_pipeline",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))

    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith("YAK_") and k != "PYTHONPATH"}
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env=env, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    site_packages = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              env=env, cwd=tmp_path).stdout.strip())
    # A plain path line: the test environment's packages come after the new environment's own,
    # and its .pth files (the editable install's finder) are not run.
    (site_packages / "yak-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    installed = _run([str(python), "-m", "pip", "install", "--no-index", "--no-deps", "--no-build-isolation",
                      "--ignore-installed", "--quiet", str(source)], env=env, cwd=tmp_path)
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    shutil.rmtree(source)  # the install must not need the source any more

    where = _run([str(python), "-c", "import yak_pipeline; print(yak_pipeline.__file__)"], env=env, cwd=tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(site_packages), where.stdout + where.stderr
    shipped = sorted(p.name for p in (site_packages / "yak_pipeline" / "sql").glob("*.sql"))
    expected = [m.name for m in discover_migrations()]
    assert shipped == [f"{name}.sql" for name in expected]

    name = f"yak_wheel_{uuid.uuid4().hex[:10]}"
    url = create_database(pg_server_url, name)
    try:
        yak_env = {**env, "YAK_DATABASE_URL": url, "YAK_EMBEDDER": "hashing", "YAK_HOME": str(tmp_path / "home")}
        first = _run([str(venv / "bin" / "yak"), "db", "migrate", "--json"], env=yak_env, cwd=tmp_path)
        assert first.returncode == 0, first.stderr[-2000:]
        assert json.loads(first.stdout)["applied"] == expected
        second = _run([str(venv / "bin" / "yak"), "db", "migrate", "--json"], env=yak_env, cwd=tmp_path)
        assert second.returncode == 0 and json.loads(second.stdout)["applied"] == [], second.stderr[-2000:]
        status = _run([str(venv / "bin" / "yak"), "db", "status", "--json"], env=yak_env, cwd=tmp_path)
        assert status.returncode == 0, status.stderr[-2000:]
        migrations = json.loads(status.stdout)["migrations"]
        assert [m["name"] for m in migrations] == expected and all(m["applied_at"] for m in migrations)
    finally:
        drop_database(pg_server_url, name)
