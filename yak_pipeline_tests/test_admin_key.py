"""`yak keys show-admin`: the admin key `yak serve` made, found through YAK_HOME wherever it is."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx

from yak_pipeline_tests.test_cli_serve import YAK, start_serve, stop_serve


def test_show_admin_prints_the_key_serve_stored_in_another_yak_home(db_url: str, tmp_path: Path) -> None:
    home = tmp_path / "elsewhere" / "yak-home"  # not ./.yak
    env = {**os.environ, "YAK_DATABASE_URL": db_url, "YAK_EMBEDDER": "hashing", "YAK_HOME": str(home)}
    process, url, _ = start_serve(env, tmp_path)
    try:
        shown = subprocess.run([str(YAK), "keys", "show-admin"], env=env, cwd=tmp_path, capture_output=True,
                               text=True, timeout=60)
        assert shown.returncode == 0 and shown.stderr == "", shown.stderr
        key = shown.stdout.strip()
        assert shown.stdout == key + "\n" and key == (home / "admin-api-key").read_text().strip()
        assert httpx.get(f"{url}/api/keys", headers={"X-API-Key": key}, timeout=10).status_code == 200
        as_json = subprocess.run([str(YAK), "keys", "show-admin", "--json"], env=env, capture_output=True,
                                 text=True, timeout=60)
        assert json.loads(as_json.stdout) == {"key": key, "file": str(home / "admin-api-key")}
        # The sign-in page says how to get the key, not a path with a variable in it.
        page = httpx.get(f"{url}/ui/login", timeout=10).text
        assert "yak keys show-admin" in page and "$YAK_HOME" not in page
    finally:
        stop_serve(process)

    missing = subprocess.run([str(YAK), "keys", "show-admin"], capture_output=True, text=True, timeout=60,
                             env={**env, "YAK_HOME": str(tmp_path / "never-served")})
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr == (f"error: no admin key in {tmp_path / 'never-served' / 'admin-api-key'}: `yak serve` "
                              "or `yak up` creates it on its first start (is YAK_HOME the one they ran with?)\n")
