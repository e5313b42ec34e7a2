"""Configuration only at the edges: who may read the settings, and what importing Yak may change.

The settings are read by the entry points (the CLI, the API's factory, the Dagster code location
and its resources) and by ``wiring.py``; every lower layer receives them, or the parts it needs,
as arguments. And importing any of Yak's modules changes no environment variable.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import yak_pipeline

PACKAGE = Path(yak_pipeline.__file__).resolve().parent
READERS = frozenset({"get_settings", "load_settings"})
# Paths relative to the package: the entry points, and wiring.py that builds parts for them.
ENTRY_POINTS = frozenset({"settings.py", "wiring.py", "definitions.py", "defs/resources.py", "api/app.py"})
ENTRY_FOLDERS = ("cli/",)  # every `yak` command is an entry point of its own
# The Dagster code location is built when Dagster imports it: its settings are read then.
IMPORT_TIME_READERS = frozenset({"definitions.py"})


def _settings_reads(tree: ast.Module) -> list[tuple[int, bool]]:
    """Each call of get_settings/load_settings in ``tree``: its line and whether it runs at import time."""
    found: list[tuple[int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name in READERS:
                found.append((node.lineno, not in_function))
        inside = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            # A decorator's arguments run when the function is defined: at import time.
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and child in node.decorator_list:
                visit(child, in_function)
            else:
                visit(child, inside)

    visit(tree, False)
    return found


def settings_offenders(package: Path) -> list[str]:
    """``file:line`` of every settings read outside the entry points, or at import time."""
    offenders = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        entry = relative in ENTRY_POINTS or relative.startswith(ENTRY_FOLDERS)
        for line, at_import in _settings_reads(ast.parse(path.read_text(), str(path))):
            if not entry:
                offenders.append(f"{relative}:{line} reads the settings outside an entry point")
            elif at_import and relative not in IMPORT_TIME_READERS:
                offenders.append(f"{relative}:{line} reads the settings when imported")
    return offenders


def test_only_the_entry_points_read_the_settings() -> None:
    assert settings_offenders(PACKAGE) == []


def test_the_check_names_a_lower_layer_that_reads_the_settings(tmp_path: Path) -> None:
    # The check itself must be able to fail: a service calling get_settings() and a schedule
    # reading it in its decorator are both named, with file and line.
    (tmp_path / "services").mkdir()
    (tmp_path / "services" / "late.py").write_text(
        "from yak_pipeline.settings import get_settings\n\n\ndef f():\n    return get_settings().home\n")
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "eager.py").write_text(
        "import yak_pipeline.settings as s\n\n\n@decorate(tz=s.get_settings().timezone)\ndef g():\n    pass\n")
    (tmp_path / "cli" / "fine.py").write_text(
        "from yak_pipeline.settings import get_settings\n\n\ndef h():\n    return get_settings()\n")
    assert settings_offenders(tmp_path) == [
        "cli/eager.py:4 reads the settings when imported",
        "services/late.py:5 reads the settings outside an entry point",
    ]


# Imports every module of the package, then prints what changed in os.environ.
_IMPORT_ALL = """
import importlib, json, os, pkgutil, sys
import yak_pipeline
before = dict(os.environ)
names = sorted(m.name for m in pkgutil.walk_packages(yak_pipeline.__path__, "yak_pipeline."))
changed = {}
for name in names:
    seen = dict(os.environ)
    importlib.import_module(name)
    for key in set(seen) | set(os.environ):
        if seen.get(key) != os.environ.get(key):
            changed.setdefault(name, []).append(key)
print(json.dumps({"modules": len(names), "changed": changed}))
"""


def test_importing_the_package_changes_no_environment_variable() -> None:
    # Variables Yak (or a library it imports) used to set on import are removed first, so a
    # module that sets one when imported shows up.
    env = {k: v for k, v in os.environ.items() if k not in
           {"XDG_RUNTIME_DIR", "GX_ANALYTICS_ENABLED", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS"}}
    result = subprocess.run([sys.executable, "-c", _IMPORT_ALL], capture_output=True, text=True, env=env,
                            cwd=PACKAGE.parent, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["modules"] > 50  # the walk really imported the package
    assert report["changed"] == {}
