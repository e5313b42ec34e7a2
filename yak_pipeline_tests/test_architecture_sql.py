"""Every SQL statement lives in ``store/`` (the module owning its table) or in ``sql/`` (issue 18).

The package's Python files outside ``store/`` are parsed with :mod:`ast` and every string
literal (f-string parts included, docstrings and comments not) is matched against the shapes of
SQL statements; an offender is named by file and line.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import yak_pipeline

PACKAGE = Path(yak_pipeline.__file__).parent
# Where SQL belongs: the store, and the migrations (``sql/``, which may live inside the package).
SQL_HOMES = ("store", "sql")

_STATEMENT = re.compile(
    r"""^\s*\(?\s*(?:
        (?-i:SELECT)\s.+?\bFROM\b | SELECT\s+\d
      | INSERT\s+INTO\b | UPDATE\s+\w+(?:\s+\w+)?\s+SET\b | DELETE\s+FROM\b | MERGE\s+INTO\b
      | WITH\s+(?:RECURSIVE\s+)?\w+\s+AS\b
      | (?:CREATE|DROP|ALTER)\s+(?:UNIQUE\s+)?(?:TABLE|INDEX|DATABASE|EXTENSION|SCHEMA|ROLE|VIEW|FUNCTION|TRIGGER)\b
      | TRUNCATE\b | VACUUM\b | COPY\s+\w+.*\b(?:FROM|TO)\b | LOCK\s+TABLE\b
      | SET\s+(?:TRANSACTION|SESSION|LOCAL)\b
    )""",
    re.IGNORECASE | re.DOTALL | re.VERBOSE,
)
# ``SELECT`` in capitals only: "Select a user from the list" is a sentence, not a query.
# Fragments that only SQL contains, wherever they stand in a string.
_FRAGMENT = re.compile(r"\bFOR\s+(?:NO\s+KEY\s+)?UPDATE\b|\bON\s+CONFLICT\b|\bRETURNING\s+\w+\s*$", re.IGNORECASE)


def docstring_ids(tree: ast.AST) -> set[int]:
    """The ids of the constant nodes that are docstrings (module, class, function)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def sql_literals(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every string literal of ``source`` shaped like SQL (docstrings aside)."""
    tree = ast.parse(source)
    docstrings = docstring_ids(tree)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if _STATEMENT.search(node.value) or _FRAGMENT.search(node.value):
                hits.append((node.lineno, " ".join(node.value.split())))
    return sorted(hits)


def test_the_finder_sees_sql_in_strings_and_f_strings_but_not_in_docstrings_or_comments() -> None:
    """The check below can fail: the finder flags each shape of statement the package uses."""
    source = textwrap.dedent('''
        """Module docstring: SELECT id FROM memories is prose here."""
        # a comment: DELETE FROM memories
        def f(conn, column):
            """Docstring: UPDATE distillations SET content = now()."""
            conn.execute("SELECT id FROM memories WHERE id = %s", (1,))
            conn.execute(f"UPDATE distillations SET {column} = now() WHERE id = %s")
            conn.execute("""
                INSERT INTO audit_log (actor) VALUES (%s)""")
            conn.execute("SELECT 1")
            tail = " FOR UPDATE SKIP LOCKED"
            conn.execute(f'CREATE DATABASE "{column}"')
            message = "Select a user from the list to see their memories"
            return "delete the file from the drop folder"
    ''')
    lines = [line for line, _ in sql_literals(source)]
    assert lines == [6, 7, 8, 10, 11, 12]


def test_no_sql_statement_outside_the_store() -> None:
    """No module outside ``store/`` (and ``sql/``) holds SQL; services call the owning store module."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in SQL_HOMES:
            continue
        for line, text in sql_literals(path.read_text(encoding="utf-8")):
            offenders.append(f"yak_pipeline/{relative.as_posix()}:{line}: {text[:80]}")
    assert not offenders, "SQL outside store/ — move it to the store module that owns the table:\n" + "\n".join(offenders)


def test_a_distillations_text_is_written_by_one_store_function() -> None:
    """Versions of a distillation are inserted in one place, so none skips its audit row.

    ``store/distillations.py``'s ``_write_version`` writes the version row and the audit row;
    every content change (first text, new version, merge, re-distillation, manual edit) calls it.
    """
    writers = []
    for path in sorted((PACKAGE / "store").rglob("*.py")):
        for line, text in sql_literals(path.read_text(encoding="utf-8")):
            if re.match(r"\s*INSERT\s+INTO\s+distillation_versions\b", text, re.IGNORECASE):
                writers.append(f"{path.name}:{line}")
    source = (PACKAGE / "store" / "distillations.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    writer = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_write_version")
    inside = [f"distillations.py:{line}" for line, text in sql_literals(ast.unparse(writer))]
    assert len(writers) == 1, f"distillation versions are inserted in more than one place: {writers}"
    assert inside, "_write_version no longer inserts the version row"
    calls = [n for n in ast.walk(writer) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "write_audit"]
    assert calls, "_write_version no longer writes the audit row"


# The statements outside ``add_version`` that set a distillation's ``content``, and why each may.
CONTENT_WRITERS_ALLOWED = {
    # Forgetting rolls a distillation back to its latest version left after the tainted ones are
    # removed: the text is already a recorded version, and forget writes its own audit row.
    "forget.py",
}


def test_a_distillations_live_text_changes_only_through_add_version() -> None:
    """``UPDATE distillations SET content`` stands in ``add_version`` (which then writes the version
    and audit row through ``_write_version``), or in a listed exception."""
    offenders = []
    for path in sorted((PACKAGE / "store").rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        add_version = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "add_version"
                            and path.name == "distillations.py"), None)
        inside = range(add_version.lineno, add_version.end_lineno + 1) if add_version else range(0)
        for line, text in sql_literals(source):
            if re.match(r"UPDATE\s+distillations\b(?:\s+\w+)?\s+SET\b.*\bcontent\s*=", text, re.IGNORECASE):
                if line not in inside and path.name not in CONTENT_WRITERS_ALLOWED:
                    offenders.append(f"store/{path.name}:{line}")
    assert not offenders, f"a distillation's text is changed outside add_version: {offenders}"
    writer = next(n for n in ast.walk(ast.parse((PACKAGE / "store" / "distillations.py").read_text(encoding="utf-8")))
                  if isinstance(n, ast.FunctionDef) and n.name == "add_version")
    assert any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "_write_version" for n in ast.walk(writer))
