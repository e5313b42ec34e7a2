"""A wheel install (not editable) carries what Yak reads at run time: `yak db migrate` and `yak up` work.

The migrations, the Dagster instance config and the example conversations are package data
(``yak_pipeline/sql/``, ``yak_pipeline/shipped/``, read with importlib.resources). This builds a
wheel from a copy of the source tree (``dist/*.whl``) and installs it into a fresh virtual
environment, offline: the new environment sees the test environment's site-packages (dagster,
psycopg, setuptools …) through a ``.pth`` line, so nothing is downloaded, and
``--ignore-installed`` leaves the test environment's own (editable) install alone. The installed
``yak`` then runs from outside the source tree, with no PYTHONPATH, against a fresh database.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from yak_pipeline.ports import free_port
from yak_pipeline.store.database import connect
from yak_pipeline.store.migrations import discover_migrations
from yak_pipeline_tests.conftest import PROJECT_ROOT, create_database, drop_database


@dataclass(frozen=True)
class Installed:
    """A fresh virtual environment with the project's wheel installed, and the environment to run it in."""

    venv: Path
    site_packages: Path
    env: dict[str, str]


def _run(args: list[str], *, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def _install_wheel(tmp_path: Path) -> Installed:
    """Build the project's wheel from a copy of the source and `pip install dist/*.whl` in a new venv."""
    # A copy of what the build reads: it writes build/ and *.egg-info in the source tree, which must
    # not land in the checkout under test. copytree follows the links in yak_pipeline/shipped/, as
    # the wheel build does.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(PROJECT_ROOT / name, source / name)
    shutil.copytree(PROJECT_ROOT / "yak_pipeline", source / "yak_pipeline",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))

    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("YAK_", "DAGSTER_")) and k != "PYTHONPATH"}
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env=env, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    site_packages = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              env=env, cwd=tmp_path).stdout.strip())
    # A plain path line: the test environment's packages come after the new environment's own,
    # and its .pth files (the editable install's finder) are not run.
    (site_packages / "yak-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    dist = tmp_path / "dist"
    built = _run([str(python), "-m", "pip", "wheel", "--no-index", "--no-deps", "--no-build-isolation", "--quiet",
                  "--wheel-dir", str(dist), str(source)], env=env, cwd=tmp_path)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    shutil.rmtree(source)  # the install must not need the source any more
    [wheel] = dist.glob("*.whl")
    installed = _run([str(python), "-m", "pip", "install", "--no-index", "--no-deps", "--ignore-installed", "--quiet",
                      str(wheel)], env=env, cwd=tmp_path)
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]

    where = _run([str(python), "-c", "import yak_pipeline; print(yak_pipeline.__file__)"], env=env, cwd=tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(site_packages), where.stdout + where.stderr
    return Installed(venv, site_packages, env)


def test_pip_install_of_the_wheel_then_db_migrate_applies_every_migration(pg_server_url: str, tmp_path: Path) -> None:
    wheel = _install_wheel(tmp_path)
    shipped = sorted(p.name for p in (wheel.site_packages / "yak_pipeline" / "sql").glob("*.sql"))
    expected = [m.name for m in discover_migrations()]
    assert shipped == [f"{name}.sql" for name in expected]
    # What `yak up` copies: real files in the wheel, the same as the project's.
    carried = wheel.site_packages / "yak_pipeline" / "shipped"
    assert (carried / "dagster.yaml").read_bytes() == (PROJECT_ROOT / "dagster.yaml").read_bytes()
    examples = PROJECT_ROOT / "examples" / "drop"
    assert sorted(p.name for p in (carried / "examples" / "drop").iterdir()) == sorted(p.name for p in examples.iterdir())

    name = f"yak_wheel_{uuid.uuid4().hex[:10]}"
    url = create_database(pg_server_url, name)
    try:
        yak_env = {**wheel.env, "YAK_DATABASE_URL": url, "YAK_EMBEDDER": "hashing", "YAK_HOME": str(tmp_path / "home")}
        yak = str(wheel.venv / "bin" / "yak")
        first = _run([yak, "db", "migrate", "--json"], env=yak_env, cwd=tmp_path)
        assert first.returncode == 0, first.stderr[-2000:]
        assert json.loads(first.stdout)["applied"] == expected
        second = _run([yak, "db", "migrate", "--json"], env=yak_env, cwd=tmp_path)
        assert second.returncode == 0 and json.loads(second.stdout)["applied"] == [], second.stderr[-2000:]
        status = _run([yak, "db", "status", "--json"], env=yak_env, cwd=tmp_path)
        assert status.returncode == 0, status.stderr[-2000:]
        migrations = json.loads(status.stdout)["migrations"]
        assert [m["name"] for m in migrations] == expected and all(m["applied_at"] for m in migrations)
    finally:
        drop_database(pg_server_url, name)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _has_database(server_url: str, name: str) -> bool:
    with connect(server_url, autocommit=True, vector=False) as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


@pytest.mark.slow
def test_yak_up_from_the_installed_wheel_reaches_the_api_and_the_dagster_ui(pg_server_url: str, tmp_path: Path) -> None:
    wheel = _install_wheel(tmp_path)
    # What pip installs with dagster and dagster-webserver (their console scripts), here only on the
    # path through the .pth line: `yak up` starts them from its own bin folder.
    for script, module in (("dagster-daemon", "dagster._daemon.cli"), ("dagster-webserver", "dagster_webserver.cli")):
        path = wheel.venv / "bin" / script
        path.write_text(f"#!{wheel.venv / 'bin' / 'python'}\nimport sys\nfrom {module} import main\nsys.exit(main())\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)

    name = f"yak_wheel_up_{uuid.uuid4().hex[:10]}"
    url = create_database(pg_server_url, name)
    had_dagster_database = _has_database(pg_server_url, "dagster")
    home = tmp_path / "home"
    api, ui = free_port(), free_port()
    env = {**wheel.env, "YAK_DATABASE_URL": url, "YAK_EMBEDDER": "hashing", "YAK_HOME": str(home)}
    workdir = tmp_path / "elsewhere"  # no source tree, no dagster.yaml, no examples/ here
    workdir.mkdir()
    output = (tmp_path / "up.log").open("w")
    up = subprocess.Popen([str(wheel.venv / "bin" / "yak"), "up", "--api-port", str(api), "--dagster-port", str(ui)],
                          env=env, cwd=workdir, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        targets = [f"http://127.0.0.1:{api}/health", f"http://127.0.0.1:{api}/ui/login",
                   f"http://127.0.0.1:{ui}/server_info"]
        while not all(_answers(target) for target in targets):
            assert up.poll() is None, (tmp_path / "up.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "yak up did not answer:\n" + (tmp_path / "up.log").read_text()[-4000:]
            time.sleep(1)
        # It used the wheel's dagster.yaml and seeded the drop folder with the wheel's examples.
        assert (home / "dagster" / "dagster.yaml").read_bytes() == (PROJECT_ROOT / "dagster.yaml").read_bytes()
        assert (home / ".examples-seeded").exists()
        assert "(2 example files queued)" in (tmp_path / "up.log").read_text()
    finally:
        up.send_signal(signal.SIGINT)  # Ctrl-C: yak up stops everything it started
        try:
            up.wait(timeout=90)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
        output.close()
        drop_database(pg_server_url, name)
        if not had_dagster_database:
            drop_database(pg_server_url, "dagster")
    assert up.returncode == 0, (tmp_path / "up.log").read_text()[-4000:]
