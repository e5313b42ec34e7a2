"""docs/ARCHITECTURE.md walks three journeys through the code, naming each step as
``file::function`` (paths under ``yak_pipeline/``). A rename or a move that forgets the walk fails
here, naming the stale reference, so the walk stays true to the code.

Names are looked up with :mod:`ast`: a top-level function or class, or ``Class.method``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yak_pipeline

PACKAGE = Path(yak_pipeline.__file__).resolve().parent
WALK = PACKAGE.parent / "docs" / "ARCHITECTURE.md"
# `store/recall.py::recall_candidates`, `services/proxy.py::MemoryProxy.converse`, or a bare `api/routes/proxy.py`
# (a path from the repository's root, `yak_pipeline_tests/…`, is not a step of the walk).
REFERENCE = re.compile(r"`(?!yak_pipeline)((?:[a-z_]+/)+[a-z_]+\.py)(?:::([A-Za-z_][\w.]*))?`")


def _defined(tree: ast.Module) -> set[str]:
    """Top-level functions and classes of ``tree``, and ``Class.method`` for each class's methods."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{item.name}" for item in node.body
                      if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)}
        # A module-level assignment (an asset built by a factory, a job) is a name too.
        if isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    return names


def stale_references(text: str, package: Path) -> list[str]:
    """The references of ``text`` whose file or name is not in ``package``."""
    stale = []
    for path, name in REFERENCE.findall(text):
        source = package / path
        if not source.is_file():
            stale.append(f"{path}: no such file")
        elif name and name not in _defined(ast.parse(source.read_text(), str(source))):
            stale.append(f"{path}::{name}: not defined there")
    return stale


def test_every_step_of_the_walk_names_code_that_exists() -> None:
    text = WALK.read_text()
    assert len(REFERENCE.findall(text)) >= 30  # the walk names its steps (a format change would find none)
    assert stale_references(text, PACKAGE) == []


def test_the_check_names_a_moved_file_and_a_renamed_function(tmp_path: Path) -> None:
    (tmp_path / "services").mkdir()
    (tmp_path / "services" / "recall.py").write_text(
        "def build_context():\n    pass\n\n\nclass Proxy:\n    def converse(self):\n        pass\n")
    text = ("`services/recall.py::build_context`, `services/recall.py::Proxy.converse`, "
            "`services/recall.py::search_memories`, `services/recall.py::Proxy.send`, `store/gone.py`")
    assert stale_references(text, tmp_path) == [
        "services/recall.py::search_memories: not defined there",
        "services/recall.py::Proxy.send: not defined there",
        "store/gone.py: no such file",
    ]
