"""The package's layers, enforced: no import circle among ddpdoctor's modules, and no package
importing one above it (DESIGN.md, "layout"; README, "Layout"). Imports under TYPE_CHECKING are
annotations only and do not count."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "ddpdoctor"

# Lowest first. A module may import its own package and anything in a lower layer.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset(
        {"_version", "exit_codes", "errors", "console", "findings", "rank_ranges", "background"}
    ),
    frozenset({"protocol", "launchers"}),
    frozenset({"runtime", "checks", "stacks", "explain"}),
    frozenset({"reference", "integrations"}),
    frozenset({"launch", "distributed_doctor"}),
    frozenset({"monitor"}),
    frozenset({"tui", "report"}),
    frozenset({"commands"}),
    frozenset({"cli", "__main__", "__init__"}),
)
LAYER_OF = {unit: level for level, units in enumerate(LAYERS) for unit in units}


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def runtime_imports(
    name: str, path: Path, known: dict[str, Path], *, annotations: bool = False
) -> set[str]:
    """The ddpdoctor modules `name` imports when it runs (lazy imports inside functions count);
    with `annotations`, also those it imports for type checkers only."""
    tree = ast.parse(path.read_text())
    annotations_only = {
        id(node)
        for branch in ast.walk(tree)
        if not annotations
        and isinstance(branch, ast.If)
        and "TYPE_CHECKING" in ast.unparse(branch.test)
        for stmt in branch.body
        for node in ast.walk(stmt)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in annotations_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def unit_of(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = module_names()
    return {name: runtime_imports(name, path, known) for name, path in known.items()}


@pytest.fixture(scope="module", params=["at run time", "with type-checking imports"])
def any_graph(request, graph) -> dict[str, set[str]]:
    """A circle through annotation-only imports is still two modules that need each other."""
    if request.param == "at run time":
        return graph
    known = module_names()
    return {
        name: runtime_imports(name, path, known, annotations=True) for name, path in known.items()
    }


def test_every_package_and_top_level_module_has_a_layer(graph):
    assert {unit_of(m) for m in graph} - set(LAYER_OF) == set()


def is_package(unit: str) -> bool:
    return (PACKAGE / unit).is_dir()


def reaches_up(src: str, dst: str) -> bool:
    """Packages import only from lower layers; the top-level modules of one layer (the shared
    vocabulary, the package's face) may use each other, which the circle test keeps acyclic."""
    a, b = unit_of(src), unit_of(dst)
    if a == b:
        return False
    if LAYER_OF[b] == LAYER_OF[a]:
        return is_package(a) or is_package(b)
    return LAYER_OF[b] > LAYER_OF[a]


def test_no_import_reaches_a_higher_layer(graph):
    upward = sorted(
        f"{src} -> {dst}"
        for src, targets in graph.items()
        for dst in targets
        if reaches_up(src, dst)
    )
    assert upward == []


def test_no_import_circle(any_graph):
    graph = any_graph
    # Tarjan's strongly connected components; any component of more than one module is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

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
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert circles == []


def test_the_top_of_the_package_holds_only_its_face_and_shared_vocabulary():
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(top) <= 10, top


# The monitor's stages, lowest first (ddpdoctor/monitor/__init__.py): data flows follow -> model
# -> judge -> tell, and a stage imports only from the stages before it in this order. The model
# comes first because every stage reads its types (the Snapshot, a rank's record).
MONITOR_STAGES = ("model", "follow", "judge", "tell", "pipeline")


def monitor_stage(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 3 or parts[1] != "monitor":
        return None
    return parts[2]


def test_the_monitor_holds_only_its_stages():
    monitor = PACKAGE / "monitor"
    loose = sorted(p.name for p in monitor.glob("*.py") if p.name != "__init__.py")
    folders = sorted(p.name for p in monitor.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert loose == []
    assert folders == sorted(MONITOR_STAGES)
    for stage in MONITOR_STAGES:
        assert ast.get_docstring(ast.parse((monitor / stage / "__init__.py").read_text()))


def test_no_monitor_stage_imports_a_later_stage(graph):
    order = {stage: level for level, stage in enumerate(MONITOR_STAGES)}
    backwards = sorted(
        f"{src} -> {dst}"
        for src, targets in graph.items()
        for dst in targets
        if (a := monitor_stage(src)) in order
        and (b := monitor_stage(dst)) in order
        and order[b] > order[a]
    )
    assert backwards == []


MAX_MODULE_LINES = 450  # DESIGN.md: small modules with one job each


def test_every_module_is_small():
    long = {
        str(path.relative_to(PACKAGE)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: split them by job"
