"""The history-file parsers are pure: ``ingestion/formats/`` imports, from Yak, only ``core/`` and
itself — no store, settings, services or Dagster — so a file's bytes become records with nothing
else involved, and the parsers stay testable on bytes alone.

Every import statement is read with :mod:`ast` (module level and inside functions alike), and an
offender is named by file and line.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import yak_pipeline

FORMATS = Path(yak_pipeline.__file__).parent / "ingestion" / "formats"
# What a parser may build on: the domain vocabulary, and the other parsers.
ALLOWED_PREFIXES = ("yak_pipeline.core.", "yak_pipeline.ingestion.formats.")
# Third-party packages that would mean I/O or orchestration inside a parser.
FORBIDDEN_PACKAGES = ("dagster", "psycopg", "psycopg_pool", "httpx", "pgvector")


def imported_modules(source: str) -> list[tuple[int, str]]:
    """``(line, module)`` of every absolute import in ``source``, anywhere in it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return sorted(found)


def offending_imports(source: str) -> list[tuple[int, str]]:
    """The imports of ``source`` a pure parser may not make."""
    return [(line, module) for line, module in imported_modules(source)
            if (module.startswith("yak_pipeline") and not module.startswith(ALLOWED_PREFIXES))
            or module.split(".")[0] in FORBIDDEN_PACKAGES]


def test_the_check_names_a_parser_that_reaches_the_store() -> None:
    """The check below can fail: the store, the settings and Dagster are named with their lines."""
    source = textwrap.dedent('''
        import json
        from yak_pipeline.core.exchanges import format_exchange
        from yak_pipeline.store.memories import insert_memory
        def parse():
            from yak_pipeline import settings
            import dagster
    ''')
    assert offending_imports(source) == [(4, "yak_pipeline.store.memories.insert_memory"),
                                         (6, "yak_pipeline.settings"), (7, "dagster")]


def test_the_format_parsers_import_only_core_and_each_other() -> None:
    """No module of ``ingestion/formats/`` imports the store, settings, services, or Dagster."""
    paths = sorted(FORMATS.rglob("*.py"))
    assert len(paths) > 5, "ingestion/formats/ holds the parsers"
    offenders = [f"{path.relative_to(FORMATS.parent.parent).as_posix()}:{line}: imports {module}"
                 for path in paths for line, module in offending_imports(path.read_text(encoding="utf-8"))]
    assert not offenders, "a history-file parser is no longer pure:\n" + "\n".join(offenders)
