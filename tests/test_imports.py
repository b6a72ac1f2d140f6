"""The package's imports run one way: `cli -> api -> warehouse -> extract -> compute`, and inside warehouse/ and
extract/ from room to room too; no module imports its importer (at top level or inside a function), and the command
line stands on the API alone."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOMS = ("cli", "api", "warehouse", "extract", "compute")  # each may import only those after it
# The rooms inside warehouse/ and extract/ (a subpackage, or a module of its own), in the same one-way order: each may
# import only itself and those after it, and rooms side by side in one tuple neither of each other. The package's own
# __init__ comes before them all.
INNER = {
    "warehouse": (("running", "publishing"), ("storing",)),
    "extract": (("behaviour",), ("sources",), ("formats",), ("layouts",), ("transport",), ("checkpoint",)),
}


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (packages by their __init__.py)."""
    found = {}
    for path in sorted(ROOT.glob("*.py")) + sorted(p for room in ("extract", "compute", "warehouse")
                                                   for p in (ROOT / room).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        found[".".join(("headforms", *parts))] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The package modules a file imports anywhere in it (function bodies included): `from a import b` is
    module a.b when that is a module, else a."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known else node.module
                      for alias in node.names}
    return {name for name in found if name in known}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) for name, path in found.items()}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None (depth-first search, colouring the modules)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else None


def inner(module: str) -> tuple[str, int] | None:
    """(inner room, its place in INNER's order) of a module of warehouse/ or extract/ (the package itself: ('', 0)),
    None for the others; a module in no inner room raises, so a new one is given its place."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in INNER:
        return None
    if len(parts) == 2:
        return "", 0
    place = next((i for i, side in enumerate(INNER[parts[1]], 1) if parts[2] in side), None)
    assert place is not None, f"{module} is in no room of {parts[1]}/: give it its place in INNER"
    return parts[2], place


def wrong_way(a: str, b: str) -> bool:
    """Whether module a importing module b goes against INNER's order: both in one room of INNER, b neither in a's inner
    room nor after it."""
    if room(a) != room(b) or inner(a) is None:
        return False
    (room_a, place_a), (room_b, place_b) = inner(a), inner(b)
    return room_a != room_b and place_b <= place_a


def test_no_module_imports_its_importer():
    assert cycle(graph()) is None, " -> ".join(cycle(graph()))


def test_rooms_import_downwards_only():
    """cli -> api -> warehouse -> extract -> compute: a room imports only the rooms after it (or itself)."""
    backwards = [(a, b) for a, targets in graph().items() for b in targets
                 if room(a) and room(b) and ROOMS.index(room(b)) < ROOMS.index(room(a))]
    assert backwards == []


def test_inner_rooms_import_downwards_only():
    """Inside warehouse/ (running, publishing -> storing) and extract/ (behaviour -> sources -> formats -> layouts ->
    transport -> checkpoint): a module imports only its own inner room and those after it."""
    backwards = [(a, b) for a, targets in graph().items() for b in targets if wrong_way(a, b)]
    assert backwards == []


def test_a_wrong_way_import_between_inner_rooms_is_seen():
    """The check above fails on an import against INNER's order, side by side or upwards, and on a module of no room."""
    assert wrong_way("headforms.extract.layouts.spec", "headforms.extract.formats.hf")
    assert wrong_way("headforms.extract.checkpoint", "headforms.extract.layouts.rope")
    assert wrong_way("headforms.extract.formats.hf", "headforms.extract")
    assert wrong_way("headforms.warehouse.running.load", "headforms.warehouse.publishing.export")
    assert not wrong_way("headforms.extract.formats.hf", "headforms.extract.formats.unreadable")
    assert not wrong_way("headforms.extract.sources", "headforms.extract.transport.hub")
    assert not wrong_way("headforms.api", "headforms.extract.layouts.rope")
    with pytest.raises(AssertionError, match="in no room of extract/"):
        inner("headforms.extract.readers.hf")


def test_cli_imports_only_the_api():
    """What a command does, a notebook does with the same call: cli.py reaches the package through the API."""
    assert graph()["headforms.cli"] == {"headforms.api"}


def test_the_cycle_finder_finds_a_cycle():
    """The checks above fail on a cycle: a planted one is found, whole."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycle(edges) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_sees_function_level_imports(tmp_path):
    """An import inside a function counts as much as one at the top."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from headforms.api import extract\n    import headforms.compute.spectra\n")
    assert imports(source, {"headforms.api", "headforms.compute.spectra"}) == {"headforms.api",
                                                                             "headforms.compute.spectra"}


def _loaded(imports: str, watched: tuple[str, ...]) -> list[str]:
    code = f"import json, sys; {imports}; print(json.dumps([m for m in {watched!r} if m in sys.modules]))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


# What starting the command line loads: the analysis only when a command extracts.
ANALYSIS = ("scipy", "pyarrow", "headforms.compute.analysis", "headforms.warehouse.running.executors",
            "headforms.warehouse.running.load")


def test_the_command_line_starts_without_the_analysis():
    """`headforms sql`, `status`, `--help` (any command that does not extract) start without the extraction's
    libraries: in a fresh interpreter, the CLI and the API leave every module of ANALYSIS unloaded; an extraction
    loads them all."""
    assert _loaded("import headforms.cli", ANALYSIS) == []
    assert _loaded("import headforms.cli, headforms.warehouse.running.load", ANALYSIS) == list(ANALYSIS)


# What the warehouse loads: none of it belongs in a worker process.
WAREHOUSE = ("duckdb", "polars", "headforms.api", "headforms.warehouse.storing.store")


def test_a_worker_starts_without_the_warehouse(tmp_path):
    """A `--jobs` or Ray worker imports the layer's task and the readers (executors.WORKER_IMPORTS), and a notebook
    may import the math alone: in a fresh interpreter neither loads DuckDB, polars or the API. The API and the
    command line load them where a call opens the warehouse (an extraction once its first layers have started)."""
    from headforms.warehouse.running.executors import WORKER_IMPORTS

    assert _loaded(f"import {', '.join(WORKER_IMPORTS)}", WAREHOUSE) == []
    assert _loaded("import headforms, headforms.compute.analysis", WAREHOUSE) == []
    assert _loaded("import headforms.cli; import headforms; headforms.connect", WAREHOUSE) == ["headforms.api"]
    assert _loaded(f"import headforms; headforms.connect({str(tmp_path / 'w.duckdb')!r}, read_only=False)",
                   WAREHOUSE) == list(WAREHOUSE)
