"""The dependency rule: lower rooms never import higher ones, folders never import in a circle;
the sizes: modules of at most 500 lines, functions of at most 80; and the dialects: no module
but the dialect objects (``meta_tables/store/sql/dialects/``) branches on a database's name.

The rooms, lowest first (docs/architecture.md draws them). A module may import its own room
and the rooms before it, never one after it; ``TYPE_CHECKING`` and function-level imports
count too, since a lazy upward import is still a tangle.

==============  =================================================================
errors          ``lockstep.errors``: the one error hierarchy
topology        the graph of jobs and tables: names, validation, lineage, rendering
barrier         value types, protocol rules, the issuer, job sessions, the Spark runtime,
                root sources, the Iceberg adapter, the operations (ports to the store)
readers         consistency levels, snapshot sets, read sessions
meta_tables     the store interface and its SQL implementation, the meta views and
                their query engine, delay reports
api             the HTTP contract shared by service and client: routes, wire format
core            ``lockstep`` itself: facade, config, the store registry, the HTTP client
examples        example pipelines: user code, as a user writes it
service         the coordinator service (FastAPI, auth, status page, uvicorn)
cli             the command line, the demo and the walkthrough
==============  =================================================================
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]

ROOMS = (
    "errors",
    "topology",
    "barrier",
    "readers",
    "meta_tables",
    "api",
    "core",
    "examples",
    "service",
    "cli",
)
# Source folders and the package each one is installed as (pyproject's package-dir).
PACKAGE_DIRS = {
    "lockstep": "lockstep",
    "topology": "lockstep.topology",
    "barrier": "lockstep.barrier",
    "readers": "lockstep.readers",
    "meta_tables": "lockstep.meta_tables",
    "examples": "lockstep.examples",
}
_ROOM_OF_PREFIX = {
    "lockstep.errors": "errors",
    "lockstep.topology": "topology",
    "lockstep.barrier": "barrier",
    "lockstep.readers": "readers",
    "lockstep.meta_tables": "meta_tables",
    "lockstep.examples": "examples",
    "lockstep.api": "api",
    "lockstep.service": "service",
    "lockstep.cli": "cli",
    "lockstep.demo": "cli",
    "lockstep.walkthrough": "cli",
}


def room_of(module: str) -> str | None:
    """The room of a ``lockstep`` module (None: not ours)."""
    if module != "lockstep" and not module.startswith("lockstep."):
        return None
    for prefix, room in _ROOM_OF_PREFIX.items():
        if module == prefix or module.startswith(prefix + "."):
            return room
    return "core"


def module_name(path: Path) -> str:
    """``barrier/runtime/runner.py`` -> ``lockstep.barrier.runtime.runner``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = PACKAGE_DIRS[parts[0]]
    rest = parts[1:]
    if rest and rest[-1] == "__init__":
        rest = rest[:-1]
    return ".".join([package, *rest])


def imported_modules(tree: ast.AST, modules: Collection[str]) -> Iterable[tuple[str, int]]:
    """Every module a source imports, with the line (``from package import module``
    counts as importing that module)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                yielded = submodule if submodule in modules else node.module
                yield yielded, node.lineno


def folder_of(module: str, is_package: bool) -> str:
    return module if is_package else module.rsplit(".", 1)[0]


def violations(sources: Mapping[str, tuple[str, str]]) -> list[str]:
    """Broken rules in ``sources`` ({module: (file shown in messages, source text)}).

    An upward import names the file, the line and both rooms; a circle between folders
    names the folders in the circle.
    """
    found = []
    folders = nx.DiGraph()
    packages = {m for m, (shown, _) in sources.items() if shown.endswith("__init__.py")}
    for module, (shown, text) in sorted(sources.items()):
        room = room_of(module)
        assert room is not None, module
        folder = folder_of(module, module in packages)
        for target, line in imported_modules(ast.parse(text, shown), sources):
            target_room = room_of(target)
            if target_room is None:
                continue
            if ROOMS.index(target_room) > ROOMS.index(room):
                found.append(
                    f"{shown}:{line}: {module} ({room}) imports {target} ({target_room}), "
                    f"a higher room; the rule is {' < '.join(ROOMS)}"
                )
            target_folder = folder_of(target, target in packages)
            if target not in sources and target_folder not in packages:
                target_folder = target.rsplit(".", 1)[0]  # a name imported from a module
            if target_folder != folder and not folder.startswith(target_folder + "."):
                folders.add_edge(folder, target_folder)
    for cycle in nx.simple_cycles(folders):
        found.append(f"folders import each other in a circle: {' -> '.join([*cycle, cycle[0]])}")
    return found


def project_sources() -> dict[str, tuple[str, str]]:
    sources = {}
    for folder in PACKAGE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            shown = str(path.relative_to(ROOT))
            sources[module_name(path)] = (shown, path.read_text())
    return sources


def test_no_upward_or_circular_imports() -> None:
    assert violations(project_sources()) == []


def test_every_module_has_a_room() -> None:
    rooms = {room_of(module) for module in project_sources()}
    assert rooms <= set(ROOMS)
    assert {"errors", "topology", "barrier", "readers", "meta_tables", "core", "cli"} <= rooms


def test_an_upward_import_is_caught_with_file_and_line() -> None:
    sources = project_sources()
    shown, text = sources["lockstep.topology.graph"]
    sources["lockstep.topology.graph"] = (shown, text + "\nfrom lockstep.barrier import model\n")
    upward, *circles = violations(sources)
    line = text.count("\n") + 2
    assert upward == (
        f"{shown}:{line}: lockstep.topology.graph (topology) imports lockstep.barrier.model "
        f"(barrier), a higher room; the rule is {' < '.join(ROOMS)}"
    )
    assert circles
    assert all("circle" in c and "lockstep.topology" in c for c in circles)


def test_a_lazy_upward_import_is_caught_too() -> None:
    sources = project_sources()
    shown, text = sources["lockstep.barrier.session"]
    lazy = "\n\ndef _sneaky() -> None:\n    from lockstep.facade import connect  # noqa\n"
    sources["lockstep.barrier.session"] = (shown, text + lazy)
    upward = [v for v in violations(sources) if "higher room" in v]
    assert [v.split(": ", 1)[0] for v in upward] == [f"{shown}:{text.count(chr(10)) + 4}"]


def test_a_circle_between_folders_of_one_room_is_caught() -> None:
    sources = project_sources()
    shown, text = sources["lockstep.barrier.iceberg.tables"]
    sources["lockstep.barrier.iceberg.tables"] = (
        shown,
        text + "\nfrom lockstep.barrier.runtime.runner import Job\n",
    )
    circles = [v for v in violations(sources) if "circle" in v]
    assert circles, "barrier.runtime imports barrier.iceberg; the reverse closes a circle"
    assert all("lockstep.barrier.iceberg" in c and "lockstep.barrier.runtime" in c for c in circles)


# -- sizes: small modules, small functions (docs/architecture.md) ---------------------------

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
# Every Python file of the repository is held to the sizes, the tests, benchmarks and tools
# too: a 600-line test module is as hard to read as a 600-line store module. Not the
# installed or generated trees.
SIZED_FOLDERS = (*PACKAGE_DIRS, "tests", "bench", "tools")


def size_breaches(sources: Mapping[str, str]) -> list[str]:
    """Modules over :data:`MAX_MODULE_LINES` lines and functions over
    :data:`MAX_FUNCTION_LINES` (from ``def`` to its last line, docstring included) in
    ``sources`` ({file shown in messages: source text}), each named with its size."""
    found = []
    for shown, text in sorted(sources.items()):
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{shown}: {lines} lines (at most {MAX_MODULE_LINES}): find its seam")
        for node in ast.walk(ast.parse(text, shown)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(
                        f"{shown}:{node.lineno}: {node.name} is {length} lines "
                        f"(at most {MAX_FUNCTION_LINES})"
                    )
    return found


def sized_sources() -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): path.read_text()
        for folder in SIZED_FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
    }


def test_modules_and_functions_are_small() -> None:
    assert size_breaches(sized_sources()) == []


def test_test_files_have_unique_names() -> None:
    """pytest's importlib mode names a test module by its file name alone (tests/ has no
    ``__init__.py``): a second test_x.py in another folder would be taken for the first."""
    names = [path.name for path in (ROOT / "tests").rglob("test_*.py")]
    assert sorted(names) == sorted(set(names))


def _function(name: str, body_lines: int) -> str:
    return f"def {name}() -> None:\n" + "    x = 1\n" * (body_lines - 1)


def test_a_501_line_module_and_an_81_line_function_are_caught() -> None:
    at_limit = _function("f", MAX_FUNCTION_LINES) + "\n" * (MAX_MODULE_LINES - MAX_FUNCTION_LINES)
    assert len(at_limit.splitlines()) == MAX_MODULE_LINES
    assert size_breaches({"ok.py": at_limit}) == []
    assert size_breaches({"long.py": at_limit + "y = 2\n"}) == [
        "long.py: 501 lines (at most 500): find its seam"
    ]
    assert size_breaches({"f.py": _function("g", MAX_FUNCTION_LINES + 1)}) == [
        "f.py:1: g is 81 lines (at most 80)"
    ]
    method = "class C:\n" + "".join(
        "    " + line + "\n" for line in _function("m", 81).splitlines()
    )
    assert size_breaches({"c.py": method}) == ["c.py:2: m is 81 lines (at most 80)"]


# -- shims: old import paths kept for users, never imported from inside the repository ------

# The deprecation shims and the module each re-exports. A shim is kept only where users
# import it (a path the README or docs once showed); the repository imports the module.
SHIMS = {
    "lockstep.barrier.context": "lockstep.barrier.runtime.context",
    "lockstep.barrier.kafka": "lockstep.barrier.sources.kafka",
}


def shims(sources: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """The shims among ``sources`` ({module: (file shown, source text)}), each with the
    module it re-exports: a module that warns ``DeprecationWarning`` at its top level."""
    found = {}
    for module, (shown, text) in sources.items():
        body = ast.parse(text, shown).body
        calls = [n.value for n in body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)]
        if any("DeprecationWarning" in ast.unparse(call) for call in calls):
            imported = [n.module for n in body if isinstance(n, ast.ImportFrom) and n.module]
            found[module] = next((m for m in imported if room_of(m)), "?")
    return found


def shim_imports(
    shim_modules: Mapping[str, str], files: Mapping[str, str], modules: Collection[str]
) -> list[str]:
    """Imports of a shim in ``files`` ({file shown in messages: source text}; ``modules``:
    every module of the package), each named with its file, line and the module to import.
    A test that checks a shim itself imports it by name (importlib), not by a statement."""
    found = []
    for shown, text in sorted(files.items()):
        for target, line in imported_modules(ast.parse(text, shown), modules):
            if target in shim_modules:
                found.append(
                    f"{shown}:{line}: imports the deprecated shim {target}: import "
                    f"{shim_modules[target]}"
                )
    return found


def test_the_shims_are_known() -> None:
    assert shims(project_sources()) == SHIMS


def test_no_shim_is_imported_from_inside_the_repository() -> None:
    sources = project_sources()
    assert shim_imports(shims(sources), sized_sources(), sources) == []


def test_an_import_of_a_shim_is_caught_with_file_and_line() -> None:
    sources = project_sources()
    files = sized_sources()
    levels = "tests/readers/test_levels.py"
    planted = {
        "bench/meta_queries.py": "\nfrom lockstep.barrier import kafka\n",
        "lockstep/cli/main.py": "\nfrom lockstep.barrier.context import BarrierContext\n",
        levels: "\n\ndef _lazy() -> None:\n    import lockstep.barrier.kafka\n",
    }
    lines = {}
    for shown, added in planted.items():
        lines[shown] = files[shown].count("\n") + added.count("\n")
        files[shown] += added
    assert shim_imports(shims(sources), files, sources) == [
        f"bench/meta_queries.py:{lines['bench/meta_queries.py']}: imports the deprecated "
        "shim lockstep.barrier.kafka: import lockstep.barrier.sources.kafka",
        f"lockstep/cli/main.py:{lines['lockstep/cli/main.py']}: imports the deprecated "
        "shim lockstep.barrier.context: import lockstep.barrier.runtime.context",
        f"{levels}:{lines[levels]}: imports the deprecated "
        "shim lockstep.barrier.kafka: import lockstep.barrier.sources.kafka",
    ]


def test_a_module_that_warns_at_import_is_a_shim() -> None:
    sources = project_sources()
    sources["lockstep.barrier.old_issuer"] = (
        "barrier/old_issuer.py",
        "import warnings\n\nfrom lockstep.barrier.issuer import BarrierIssuer\n\n"
        'warnings.warn("use lockstep.barrier.issuer", DeprecationWarning, stacklevel=2)\n',
    )
    found = shims(sources)
    assert found == {**SHIMS, "lockstep.barrier.old_issuer": "lockstep.barrier.issuer"}
    files = {"bench/x.py": "from lockstep.barrier.old_issuer import BarrierIssuer\n"}
    assert shim_imports(found, files, sources) == [
        "bench/x.py:1: imports the deprecated shim lockstep.barrier.old_issuer: import "
        "lockstep.barrier.issuer"
    ]


@pytest.mark.parametrize(("shim", "module"), sorted(SHIMS.items()))
def test_a_shim_warns_and_gives_the_module_s_names(shim: str, module: str) -> None:
    sys.modules.pop(shim, None)
    with pytest.warns(DeprecationWarning, match=module):
        old = importlib.import_module(shim)
    new = importlib.import_module(module)
    assert old.__all__
    assert all(getattr(old, name) is getattr(new, name) for name in old.__all__)


# -- dialects: one object per database, no branching on its name (docs/architecture.md) -----

DIALECT_PACKAGE = "meta_tables/store/sql/dialects/"
DATABASE_NAMES = frozenset({"sqlite", "postgresql", "postgres", "mysql", "mariadb"})


def _is_dialect_name(node: ast.expr) -> bool:
    """``dialect.name``, ``engine.dialect.name``, ``conn.dialect.name``..."""
    if not (isinstance(node, ast.Attribute) and node.attr == "name"):
        return False
    owner = node.value
    return (isinstance(owner, ast.Attribute) and owner.attr == "dialect") or (
        isinstance(owner, ast.Name) and owner.id.endswith("dialect")
    )


def _names_a_database(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in DATABASE_NAMES


def dialect_comparisons(sources: Mapping[str, str]) -> list[str]:
    """Branches on a database's name outside the dialect objects in ``sources`` ({file
    shown in messages: source text}): a comparison with a dialect's ``name``, an equality
    with a database's name (``== "postgresql"``), or a ``startswith`` of one."""
    found = []
    for shown, text in sorted(sources.items()):
        if shown.startswith(DIALECT_PACKAGE):
            continue
        for node in ast.walk(ast.parse(text, shown)):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                equality = any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops)
                branches = any(_is_dialect_name(o) for o in operands) or (
                    equality and any(_names_a_database(o) for o in operands)
                )
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                branches = node.func.attr == "startswith" and any(
                    _names_a_database(a) for a in node.args
                )
            else:
                continue
            if branches:
                found.append(
                    f"{shown}:{node.lineno}: branches on a database's name: ask its dialect "
                    f"object ({DIALECT_PACKAGE}) for a capability or a hook instead"
                )
    return found


def test_no_module_branches_on_a_dialect_name() -> None:
    sources = {shown: text for shown, text in project_sources().values()}
    assert dialect_comparisons(sources) == []


def test_a_branch_on_a_dialect_name_is_caught_with_file_and_line() -> None:
    sources = {shown: text for shown, text in project_sources().values()}
    shown = "meta_tables/store/sql/heads.py"
    text = sources[shown]
    planted = (
        "\n\ndef _sneaky(connection, url):\n"
        "    if connection.dialect.name != 'postgresql':\n"
        "        return url.startswith('sqlite')\n"
        "    return dialect.name in ('mysql',) or backend == 'mariadb'\n"
    )
    sources[shown] = text + planted
    line = text.count("\n") + 4
    assert [v.split(": ", 1)[0] for v in dialect_comparisons(sources)] == [
        f"{shown}:{line}",
        f"{shown}:{line + 1}",
        f"{shown}:{line + 2}",
        f"{shown}:{line + 2}",
    ]
    # the dialect objects themselves may: that is where a name maps to its object
    inside = "meta_tables/store/sql/dialects/sqlite.py"
    assert dialect_comparisons({inside: planted}) == []


# -- SQLAlchemy in the store's SQL package alone (#49) ---------------------------------------

# Product code speaks to the database through the store's interfaces (``MetadataStore``, the
# served catalog's ``CatalogStore``), whose SQL implementation is the one package that
# imports SQLAlchemy. Tests, benchmarks and tools are not held to it: they build old schemas,
# tamper with rows and time statements on purpose.
SQL_PACKAGE = "meta_tables/store/sql/"


def sqlalchemy_imports(sources: Mapping[str, str]) -> list[str]:
    """Imports of SQLAlchemy outside :data:`SQL_PACKAGE` in ``sources`` ({file shown in
    messages: source text}), lazy and ``TYPE_CHECKING`` ones too, each with its line."""
    found = []
    for shown, text in sorted(sources.items()):
        if shown.startswith(SQL_PACKAGE):
            continue
        for node in ast.walk(ast.parse(text, shown)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            if any(n == "sqlalchemy" or n.startswith("sqlalchemy.") for n in names):
                found.append(
                    f"{shown}:{node.lineno}: imports SQLAlchemy; only {SQL_PACKAGE} does: "
                    "call the store's interface (meta_tables/store/base.py, catalog.py)"
                )
    return found


def test_only_the_stores_sql_package_imports_sqlalchemy() -> None:
    sources = {shown: text for shown, text in project_sources().values()}
    assert sqlalchemy_imports(sources) == []


def test_an_import_of_sqlalchemy_elsewhere_is_caught_with_file_and_line() -> None:
    sources = {shown: text for shown, text in project_sources().values()}
    shown = "lockstep/service/iceberg/catalog.py"
    text = sources[shown]
    lazy = "\n\ndef _sneaky() -> None:\n    import sqlalchemy.orm  # noqa\n"
    sources[shown] = text + "\nfrom sqlalchemy import select\n" + lazy
    line = text.count("\n") + 2
    assert [v.split(": ", 1)[0] for v in sqlalchemy_imports(sources)] == [
        f"{shown}:{line}",
        f"{shown}:{line + 4}",
    ]
    # the store's SQL package may, and a name that only starts like it is not SQLAlchemy
    inside = {"meta_tables/store/sql/catalog/pointers.py": "from sqlalchemy import select\n"}
    assert sqlalchemy_imports(inside) == []
    assert sqlalchemy_imports({"x.py": "import sqlalchemy_utils\n"}) == []
