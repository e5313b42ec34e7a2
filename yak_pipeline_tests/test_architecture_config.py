"""Configuration only at the edges: who may read the settings, and what importing Yak may change.

One composition root: the settings are read by ``wiring.py`` (which builds every part from them,
:func:`yak_pipeline.wiring.build_parts`), by the Dagster code location (``definitions.py``) and by
the ``yak`` CLI's root callback, which hands each command its parts; ``settings.py`` defines the
readers. Every other module — the API, each CLI command, eval, the resources, the services —
receives the settings, or the parts it needs, as arguments. And importing any of Yak's modules
changes no environment variable.
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
# Paths relative to the package that may read the settings, and where in them: None for anywhere in
# the module, else the one top-level function (a function nested in it counts as it).
ENTRY_POINTS: dict[str, str | None] = {
    "settings.py": None,  # defines the readers (get_settings calls load_settings)
    "wiring.py": None,  # builds the parts: process_parts() for an entry point without settings of its own
    "definitions.py": None,  # the Dagster code location
    "cli/main.py": "root",  # the CLI's root callback
}
# The Dagster code location is built when Dagster imports it: its settings are read then.
IMPORT_TIME_READERS = frozenset({"definitions.py"})


def _settings_reads(tree: ast.Module) -> list[tuple[int, bool, str | None]]:
    """Each call of get_settings/load_settings in ``tree``: its line, whether it runs at import time,
    and the top-level function it is in (None: module level)."""
    found: list[tuple[int, bool, str | None]] = []

    def visit(node: ast.AST, in_function: bool, top: str | None) -> None:
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name in READERS:
                found.append((node.lineno, not in_function, top))
        is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        inside = in_function or is_function or isinstance(node, ast.Lambda)
        within = node.name if is_function and top is None else top
        for child in ast.iter_child_nodes(node):
            # A decorator's arguments run when the function is defined: at import time, outside it.
            if is_function and child in node.decorator_list:
                visit(child, in_function, top)
            else:
                visit(child, inside, within)

    visit(tree, False, None)
    return sorted(found, key=lambda read: read[0])


def settings_offenders(package: Path) -> list[str]:
    """``file:line`` of every settings read outside the entry points, or at import time."""
    offenders = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        entry = relative in ENTRY_POINTS
        allowed_in = ENTRY_POINTS.get(relative)
        for line, at_import, top in _settings_reads(ast.parse(path.read_text(), str(path))):
            if not entry or (allowed_in is not None and top != allowed_in):
                offenders.append(f"{relative}:{line} reads the settings outside an entry point")
            elif at_import and relative not in IMPORT_TIME_READERS:
                offenders.append(f"{relative}:{line} reads the settings when imported")
    return offenders


def test_only_the_entry_points_read_the_settings() -> None:
    assert settings_offenders(PACKAGE) == []


def test_the_check_names_a_lower_layer_that_reads_the_settings(tmp_path: Path) -> None:
    # The check itself must be able to fail: a service calling get_settings(), a CLI command reading
    # them itself (not through its parts), a read in cli/main.py outside the root callback and a
    # schedule reading them in its decorator are each named, with file and line; so is wiring.py
    # reading them when imported (only the code location may).
    (tmp_path / "services").mkdir()
    (tmp_path / "services" / "late.py").write_text(
        "from yak_pipeline.settings import get_settings\n\n\ndef f():\n    return get_settings().home\n")
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "command.py").write_text(
        "from yak_pipeline.settings import get_settings\n\n\ndef h():\n    return get_settings()\n")
    (tmp_path / "cli" / "main.py").write_text(
        "import yak_pipeline.settings as s\n\n\ndef root():\n    def read():\n        return s.get_settings()\n"
        "\n\n@decorate(tz=s.get_settings().timezone)\ndef root_too():\n    return s.load_settings()\n")
    (tmp_path / "wiring.py").write_text(
        "from yak_pipeline.settings import get_settings\n\nSETTINGS = get_settings()\n\n\n"
        "def parts():\n    return get_settings()\n")
    assert settings_offenders(tmp_path) == [
        "cli/command.py:5 reads the settings outside an entry point",
        "cli/main.py:9 reads the settings outside an entry point",
        "cli/main.py:11 reads the settings outside an entry point",
        "services/late.py:5 reads the settings outside an entry point",
        "wiring.py:3 reads the settings when imported",
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
