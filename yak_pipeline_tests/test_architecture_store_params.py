"""The store passes values by name and hands out rows read by name (issue 36).

Two checks, both over the package's source parsed with :mod:`ast`:

- no positional ``%s`` placeholder in a string of ``store/`` (SQL takes ``%(name)s`` with a dict,
  or ``sql.Placeholder(name)`` where identifiers vary); the logging calls' ``%s`` are not SQL;
- outside ``store/``, no row a store function returns is indexed by position (``row[3]``): its
  fields are read by name. The store's row-returning functions are the public ones whose return
  annotation names a tuple or a row type of the store (a NamedTuple class defined there).

Values inlined into SQL text (``sql.Literal``) bypass the parameters on purpose; each place that
does is listed with its reason in :data:`LITERALS_ALLOWED`.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import yak_pipeline
from yak_pipeline_tests.test_architecture_sql import docstring_ids

PACKAGE = Path(yak_pipeline.__file__).parent
STORE = PACKAGE / "store"

# Store modules not converted to named placeholders yet, and why.
POSITIONAL_NOT_YET_CONVERTED: set[str] = set()

# Where the store inlines a value into SQL text (``sql.Literal``) rather than sending it as a
# parameter, and why each must.
LITERALS_ALLOWED = {
    # The planner proves a partial index's predicate only from a literal: the user of an own index.
    "vector_legs.py": "a user's own partial HNSW index is used only when the user is a literal",
    "user_indexes.py": "CREATE INDEX ... WHERE user_id = <literal>: DDL takes no parameters",
    "reembed.py": "ALTER COLUMN ... TYPE vector(<n>): DDL takes no parameters",
    "backup.py": "restore's deferred-column statements are built once per table and run by executemany",
}

_PLACEHOLDER = re.compile(r"%%|%s")
_LOGGING = {"debug", "info", "warning", "error", "exception", "critical", "log"}


def _log_messages(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are a logging call's message (``logger.info("... %s", x)``)."""
    found = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _LOGGING
                and node.args and isinstance(node.args[0], ast.Constant)):
            found.add(id(node.args[0]))
    return found


def positional_placeholders(source: str) -> list[int]:
    """Lines of ``source`` whose string literals (f-string parts too) hold a positional ``%s``."""
    tree = ast.parse(source)
    skipped = docstring_ids(tree) | _log_messages(tree)
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            if "%s" in _PLACEHOLDER.findall(node.value):
                lines.add(node.lineno)
    return sorted(lines)


def literal_lines(source: str) -> list[int]:
    """Lines of ``source`` that inline a value into SQL text (``sql.Literal(...)``)."""
    return sorted(node.lineno for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "Literal"
                  and isinstance(node.func.value, ast.Name) and node.func.value.id == "sql")


def test_the_placeholder_finder_sees_positional_ones_but_not_named_ones_logging_or_docstrings() -> None:
    """The check below can fail: the finder flags each form a positional placeholder takes."""
    source = textwrap.dedent('''
        """Docstring: a ``%s::uuid[]`` parameter is prose here."""
        def f(conn, column, logger):
            """Docstring: WHERE id = %s."""
            conn.execute("SELECT id FROM memories WHERE id = %s", (1,))
            conn.execute(f"UPDATE memories SET {column} = %s WHERE id = %(id)s", {"id": 1})
            conn.execute(sql.SQL("{} = %s").format(sql.Identifier(column)))
            conn.execute("SELECT id FROM memories WHERE id = %(id)s AND content LIKE '100%%s'", {"id": 1})
            logger.info("stored %s rows", 3)
            conn.execute("""
                INSERT INTO audit_log (actor) VALUES (%s)""", ("me",))
    ''')
    assert positional_placeholders(source) == [5, 6, 7, 10]


def test_no_positional_placeholder_in_the_store() -> None:
    """Every statement of ``store/`` names its parameters (``%(name)s``)."""
    offenders = [f"store/{path.name}:{line}" for path in sorted(STORE.rglob("*.py"))
                 if path.name not in POSITIONAL_NOT_YET_CONVERTED
                 for line in positional_placeholders(path.read_text(encoding="utf-8"))]
    assert not offenders, "positional %s placeholders — name them, %(name)s with a dict:\n" + "\n".join(offenders)


def test_the_modules_not_yet_converted_still_need_their_exception() -> None:
    """An exception is removed once its module is converted (the list only shrinks)."""
    done = [name for name in POSITIONAL_NOT_YET_CONVERTED
            if not positional_placeholders((STORE / name).read_text(encoding="utf-8"))]
    assert not done, f"converted: remove from POSITIONAL_NOT_YET_CONVERTED: {done}"


def test_values_are_inlined_into_sql_only_where_listed() -> None:
    """``sql.Literal`` (a value in the SQL text, not a parameter) stands only in the listed modules."""
    found = {path.name for path in sorted(STORE.rglob("*.py")) if literal_lines(path.read_text(encoding="utf-8"))}
    assert found <= set(LITERALS_ALLOWED), f"sql.Literal outside LITERALS_ALLOWED: {sorted(found - set(LITERALS_ALLOWED))}"
    assert set(LITERALS_ALLOWED) <= found, f"no sql.Literal left: remove {sorted(set(LITERALS_ALLOWED) - found)}"
    assert literal_lines("x = sql.Literal(user_id)\ny = sql.Identifier(t)\n") == [1]


# --- rows read by position outside the store -------------------------------------------------

_COLLECTIONS = ("list[", "Sequence[", "set[", "frozenset[", "Iterator[", "Iterable[", "dict[", "Mapping[")


def row_functions(store_sources: dict[str, str]) -> dict[str, str]:
    """The store's public functions that return rows, by name: ``"one"`` (a row, or None) or
    ``"many"`` (a collection of rows; a dict's values are its rows)."""
    row_types = {"tuple", "Row"}
    trees = {name: ast.parse(source) for name, source in store_sources.items()}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b) in ("NamedTuple", "typing.NamedTuple")
                                                      for b in node.bases):
                row_types.add(node.name)
    kinds = {}
    for tree in trees.values():
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and node.returns is not None:
                returns = ast.unparse(node.returns)
                if any(re.search(rf"\b{re.escape(t)}\b", returns) for t in row_types):
                    kinds[node.name] = "many" if returns.startswith(_COLLECTIONS) else "one"
    return kinds


def _called(node: ast.AST, kinds: dict[str, str]) -> str | None:
    """The kind of store function ``node`` calls (``f(...)`` or ``module.f(...)``), if it calls one."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        return kinds.get(name or "")
    return None


def positional_row_reads(source: str, kinds: dict[str, str]) -> list[int]:
    """Lines of ``source`` that index a store row by an integer: ``f(...)[0]``, ``row[1]`` of a
    ``row = f(...)``, ``rows[i][2]``, ``r[0]`` of ``for r in rows`` (``rows.values()`` too)."""
    tree = ast.parse(source)
    one: set[str] = set()  # names bound to one row
    many: set[str] = set()  # names bound to a collection of rows
    # Two passes: a name bound anywhere in the module is tracked wherever it is read (names of
    # rows are not reused for other things in this package's short functions).
    for _ in range(2):
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                target, value = node.targets[0].id, node.value
                kind = _called(value, kinds)
                if kind == "one":
                    one.add(target)
                elif kind == "many":
                    many.add(target)
                elif isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) and value.value.id in many:
                    one.add(target)
            elif isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
                source_of = node.iter
                if isinstance(source_of, ast.Call) and isinstance(source_of.func, ast.Attribute) \
                        and source_of.func.attr == "values":
                    source_of = source_of.func.value
                if (isinstance(source_of, ast.Name) and source_of.id in many) or _called(source_of, kinds) == "many":
                    one.add(node.target.id)
    lines = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, int)):
            continue
        value = node.value
        if (isinstance(value, ast.Name) and value.id in one) or _called(value, kinds) == "one":
            lines.add(node.lineno)
        elif isinstance(value, ast.Subscript) and (
                (isinstance(value.value, ast.Name) and value.value.id in many) or _called(value.value, kinds) == "many"):
            lines.add(node.lineno)
    return sorted(lines)


def test_the_row_read_finder_sees_each_way_a_row_is_indexed(tmp_path: Path) -> None:
    """The check below can fail: a planted store module and a caller reading its rows by position."""
    store = {"planted.py": textwrap.dedent('''
        from typing import NamedTuple
        class Hit(NamedTuple):
            id: str
            score: float
        def one_hit(conn) -> Hit | None: ...
        def hits(conn) -> list[Hit]: ...
        def hits_by_id(conn) -> dict[str, tuple[str, float]]: ...
        def ids(conn) -> list[str]: ...
        def _private(conn) -> tuple[str, float]: ...
    ''')}
    kinds = row_functions(store)
    assert kinds == {"one_hit": "one", "hits": "many", "hits_by_id": "many"}
    caller = tmp_path / "caller.py"
    caller.write_text(textwrap.dedent('''
        def use(conn):
            row = one_hit(conn)
            a = row[0]
            b = one_hit(conn)[1]
            found = hits(conn)
            c = found[0][1]
            for hit in found:
                d = hit[1]
            by_id = hits_by_id(conn)
            e = [r[0] for r in by_id.values()]
            picked = by_id["x"]
            f = picked[1]
            first = found[0]
            g = ids(conn)[0]
            h = row.score
            i, j = row
            return a, b, c, d, e, f, first, g, h, i, j
    '''), encoding="utf-8")
    assert positional_row_reads(caller.read_text(encoding="utf-8"), kinds) == [4, 5, 7, 9, 11, 13]


def test_no_store_row_is_read_by_position_outside_the_store() -> None:
    """Services, routes, assets, the CLI and the evaluation read a store row's fields by name."""
    kinds = row_functions({path.name: path.read_text(encoding="utf-8") for path in sorted(STORE.rglob("*.py"))})
    assert kinds, "no row-returning store function found: the finder no longer reads the store"
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "store":
            continue
        offenders += [f"yak_pipeline/{relative.as_posix()}:{line}"
                      for line in positional_row_reads(path.read_text(encoding="utf-8"), kinds)]
    assert not offenders, "store rows read by position — read the field by name:\n" + "\n".join(offenders)
