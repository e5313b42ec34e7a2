"""Rooms of a size one can read: no module in ``yak_pipeline/`` over 450 lines, no function over 80.

Issue 36 split the overfull modules (``store/recall.py`` was 852 lines, ``eval/runner.py`` 1,070)
and their long functions; this keeps them split. A module or function that grows past the limit
is split by what it does, not squeezed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import yak_pipeline

PACKAGE = Path(yak_pipeline.__file__).resolve().parent
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def size_offenders(package: Path) -> list[str]:
    """Each module over :data:`MAX_MODULE_LINES` lines and each function (or method) over
    :data:`MAX_FUNCTION_LINES`, decorators excluded, as ``path: what, N lines``."""
    found: list[str] = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(package).as_posix()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{where}: module, {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{where}: {node.name}, {length} lines")
    return found


def test_no_module_over_450_lines_and_no_function_over_80() -> None:
    assert size_offenders(PACKAGE) == []


def test_the_check_names_a_long_module_and_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long_function.py").write_text(f"def too_long():\n{body}\n", encoding="utf-8")
    (tmp_path / "short.py").write_text("def fine():\n    return 1\n", encoding="utf-8")
    (tmp_path / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1), encoding="utf-8")
    assert size_offenders(tmp_path) == [
        f"big.py: module, {MAX_MODULE_LINES + 1} lines",
        f"long_function.py: too_long, {MAX_FUNCTION_LINES + 1} lines",
    ]
