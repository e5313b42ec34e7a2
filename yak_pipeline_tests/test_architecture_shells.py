"""The shells call services only: ``api/`` and ``cli/`` import no ``yak_pipeline.store`` module
(issue 18), apart from the plumbing listed in ``ALLOWED`` with the reason for each.

Every import statement is read with :mod:`ast` — module level, inside functions (the CLI's lazy
imports) and under ``TYPE_CHECKING`` alike — and an offender is named by file and line.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import yak_pipeline

PACKAGE = Path(yak_pipeline.__file__).parent
SHELLS = ("api", "cli")

# store modules a shell may import, and why. Everything else goes through services/.
ALLOWED: dict[str, str] = {
    # Exception types the shells turn into an HTTP status or a one-line CLI error; no SQL.
    "yak_pipeline.store.errors": "*",
    # The connection pool type for dependency injection and the URL helpers (resolve, redact,
    # the Dagster database beside Yak's); no table's SQL.
    "yak_pipeline.store.database": "*",
    # `yak db` administers the store itself — migrations, the embedded server and its upgrade —
    # so its commands reach the store's own administration modules directly.
    "yak_pipeline.store.migrations": "cli/db.py",
    "yak_pipeline.store.embedded": "cli/db.py",
    "yak_pipeline.store.embedded_upgrade": "cli/db.py",
}


def store_imports(source: str) -> list[tuple[int, str]]:
    """``(line, module)`` of every ``yak_pipeline.store`` module that ``source`` imports, anywhere in it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("yak_pipeline.store")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "yak_pipeline":
                found += [(node.lineno, "yak_pipeline.store") for alias in node.names if alias.name == "store"]
            elif node.module == "yak_pipeline.store":
                found += [(node.lineno, f"yak_pipeline.store.{alias.name}") for alias in node.names]
            elif node.module.startswith("yak_pipeline.store."):
                found.append((node.lineno, node.module))
    return sorted(found)


def test_the_finder_sees_every_form_of_store_import() -> None:
    """The check below can fail: each way of importing the store is found, with its line."""
    source = textwrap.dedent('''
        from yak_pipeline.store.memories import get_memory
        import yak_pipeline.store.review
        from yak_pipeline.store import conflicts
        from yak_pipeline import store
        from yak_pipeline.services.curation import review
        def command():
            from yak_pipeline.store.api_keys import find_api_key
    ''')
    assert store_imports(source) == [
        (2, "yak_pipeline.store.memories"), (3, "yak_pipeline.store.review"), (4, "yak_pipeline.store.conflicts"),
        (5, "yak_pipeline.store"), (8, "yak_pipeline.store.api_keys")]


def test_api_and_cli_call_services_not_the_store() -> None:
    """No route, page, MCP tool or command imports a store module beyond the allowed plumbing."""
    offenders = []
    for shell in SHELLS:
        for path in sorted((PACKAGE / shell).rglob("*.py")):
            relative = path.relative_to(PACKAGE).as_posix()
            for line, module in store_imports(path.read_text(encoding="utf-8")):
                allowed = ALLOWED.get(module)
                if allowed != "*" and allowed != relative:
                    offenders.append(f"yak_pipeline/{relative}:{line}: imports {module}")
    assert not offenders, "a shell reaches past the services into the store:\n" + "\n".join(offenders)
