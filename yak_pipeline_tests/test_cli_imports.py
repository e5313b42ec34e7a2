"""What a `yak` command imports before it sends its one request: every command pays for it."""

import json
import subprocess
import sys

# The database driver, the pipeline, the models, and httpx's client (its httpcore probes for trio
# and loads the CA certificates even for plain http): none is needed to ask a running server.
HEAVY = ("psycopg", "dagster", "torch", "sentence_transformers", "pandas", "great_expectations", "httpx",
         "httpcore", "trio")


def test_the_cli_imports_nothing_heavy_before_a_command_runs() -> None:
    code = ("import json, sys; import yak_pipeline.cli.main; "
            f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout) == []
