"""The import layers of the package, read from its source: the rules ``docs/design.md`` states.

Floors, lowest first (a module may import its own floor and those below it, never one above):

0. ``contract`` with the package's top (``__init__``, ``checkpoint``) (stdlib only: they ship whole in
the agent zip)  1. ``storage`` and ``transfer`` (the run folder on
S3/GCS, big files in parts: stdlib + the storage SDKs, imported when a folder is opened)  2. the pure domain: ``spec``,
``catalog``, ``policy``, ``mlengine``  3. ``hooks`` (SDK + Airflow connection)  4. ``core`` (what
every engine shares: the cloud interface and its protocols, the ledger, retries, billing, records)
5. ``clouds`` (one module tree per provider, and the registry)  6. ``lifecycle`` (the engines)
7. ``triggers``  8. ``operators``, ``sensors``, ``links``  9. the command line and ``ui`` (the Cloud
training page's Airflow plugin, which reads the cost index as ``cloudtrain costs`` does).

Beside them: the ``agent`` (runs on the instance) imports only ``contract``, ``storage`` and itself;
the ``emulator`` (the local clouds) imports nothing of the Airflow side. Every import counts, at the
top of a module or inside a function or ``TYPE_CHECKING``: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_cloudtrain"
FLOORS: list[tuple[str, ...]] = [
    ("contract", "checkpoint", "__init__"),
    ("storage", "transfer"),
    ("spec", "catalog", "policy", "mlengine"),
    ("hooks",),
    ("core",),
    ("clouds",),
    ("lifecycle",),
    ("triggers",),
    ("operators", "sensors", "links"),
    (
        "cli",
        "cli_emulator",
        "cli_errors",
        "cli_jobs",
        "cli_supervisor",
        "cli_up",
        "cli_gc",
        "ui",
        "permissions",
        "cli_permissions",
        "celery_config",
        "worker_warmup",
    ),
]
FLOOR = {room: i for i, rooms in enumerate(FLOORS) for room in rooms}
AGENT_MAY_IMPORT = {"agent", "contract", "storage", "transfer", "checkpoint", "__init__"}
EMULATOR_MAY_IMPORT = {"emulator", "contract", "storage", "catalog", "spec", "mlengine", "__init__"}
# Imports from a lower floor to a higher one that are kept on purpose (each says why); at most two.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports() -> dict[str, set[str]]:
    """module -> the package's modules it imports (``from pkg import name`` counts as ``pkg.name``
    when that is a module)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    found: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                if target in modules and target != name:
                    found[name].add(target)
        found.setdefault(name, set())
    return found


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _external(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
    return names - {"airflow_cloudtrain"}


def test_no_floor_imports_a_higher_floor() -> None:
    upward = sorted(
        (_room(src), _room(dst), f"{src} -> {dst}")
        for src, dsts in _imports().items()
        for dst in dsts
        if _room(src) in FLOOR
        and _room(dst) in FLOOR
        and FLOOR[_room(dst)] > FLOOR[_room(src)]
        and (_room(src), _room(dst)) not in ALLOWED_UPWARD
    )
    assert not upward, "imports from a lower floor to a higher one:\n" + "\n".join(u[2] for u in upward)
    assert len(ALLOWED_UPWARD) <= 2


def test_the_agent_and_the_emulator_stay_on_their_side() -> None:
    wrong = sorted(
        f"{src} -> {dst}"
        for src, dsts in _imports().items()
        for dst in dsts
        if (_room(src) == "agent" and _room(dst) not in AGENT_MAY_IMPORT)
        or (_room(src) == "emulator" and _room(dst) not in EMULATOR_MAY_IMPORT)
    )
    assert not wrong, "\n".join(wrong)


def test_the_contract_floor_imports_only_the_standard_library() -> None:
    paths = [*sorted((PACKAGE / "contract").glob("*.py")), PACKAGE / "__init__.py", PACKAGE / "checkpoint.py"]
    for path in paths:
        outside = _external(path) - set(sys.stdlib_module_names) - {"__future__"}
        assert not outside, f"{path.name} imports {sorted(outside)}"
    for src, dsts in _imports().items():
        if _room(src) == "contract":
            assert all(_room(d) in ("contract", "__init__") for d in dsts), (src, dsts)


def test_no_import_cycles() -> None:
    """Between modules (Tarjan's strongly connected components), and so between folders too."""
    graph = _imports()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    # a package's __init__ re-exporting its own modules is not a cycle of behaviour
    cycles = [c for c in cycles if not all(m.startswith(min(c, key=len)) for m in c)]
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)
