"""The package's import graph: no cycles (imports inside functions count too), and imports point one way.

Read from the source with ``ast`` (nothing is imported), so an import hidden inside a function that would
close a cycle, or a lower layer reaching up to a higher one, fails here with the modules named.
"""
from __future__ import annotations

import ast
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1] / "speedkit"

# The layers, bottom to top, as folders (and the few top-level modules) of speedkit/. A module imports only
# from its own layer or the ones below it. Peers in one layer may import each other (no cycles, tested below).
LAYERS = (
    ("version",),
    ("core",),
    ("record",),
    ("methods", "functional", "optim", "data", "models", "callbacks"),
    ("train",),
    ("hosts",),  # speedkit's methods in loops it does not own: a plain loop, Accelerate, Lightning, HF
    ("tasks",),
    ("experiments",),
    ("ui", "cli"),
    ("__init__", "__main__"),
)
BOTTOM = ("speedkit.version", "speedkit.core.seeding")  # what any module may import without a cycle


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _known(name: str) -> str:
    """The module that ``name`` lives in (a name imported from a package resolves to the package)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(module: str) -> set[str]:
    """Every speedkit module ``module`` imports, at the top or inside a function."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {_known(a.name) for a in node.names if a.name.split(".")[0] == "speedkit"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                kept = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(kept + ([node.module] if node.module else []))
            if base.split(".")[0] != "speedkit":
                continue
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else _known(base) for a in node.names}
    found.discard(module)
    return found


GRAPH = {module: _imports(module) for module in MODULES}


def _in(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in GRAPH:
        if module not in index:
            visit(module)
    return found


def test_the_graph_is_read():
    assert {"speedkit.train.trainer", "speedkit.core.engine", "speedkit.methods.ema"} <= set(MODULES)
    assert "speedkit.train.checkpoint" in GRAPH["speedkit.train.trainer"]


def test_no_import_cycles():
    cycles = _cycles()
    details = {tuple(c): {m: sorted(GRAPH[m] & set(c)) for m in c} for c in cycles}
    assert not cycles, f"import cycles (module -> the modules of its cycle it imports): {details}"


def test_core_imports_nothing_above_it():
    upward = {m: sorted(i for i in GRAPH[m] if not _in(i, ("speedkit.core", *BOTTOM)))
              for m in MODULES if _in(m, ("speedkit.core",))}
    assert not {m: i for m, i in upward.items() if i}


def _layer(module: str) -> int:
    room = module.split(".")[1] if "." in module else "__init__"
    return next(i for i, rooms in enumerate(LAYERS) if room in rooms)


def test_every_folder_of_speedkit_is_a_layer():
    rooms = {p.stem for p in ROOT.iterdir() if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
    assert rooms == {room for rooms in LAYERS for room in rooms}


def test_imports_point_down_the_layers():
    upward = {m: sorted(i for i in GRAPH[m] if _layer(i) > _layer(m)) for m in MODULES}
    assert not {m: i for m, i in upward.items() if i}


def test_the_bottom_imports_nothing_of_speedkit():
    assert not {m: GRAPH[m] for m in BOTTOM if GRAPH[m]}


def test_parallel_and_checkpoint_sit_below_the_trainer():
    assert not GRAPH["speedkit.core.distributed"] - set(BOTTOM)  # only collectives and torch: no data, no trainer
    assert not GRAPH["speedkit.train.parallel"] - {"speedkit.core.distributed", *BOTTOM}
    assert "speedkit.train.trainer" not in GRAPH["speedkit.train.checkpoint"]


def test_the_trainer_keeps_the_loop_only():
    """trainer.py names no method (what a method varies comes from its card) and branches on no parallel
    strategy (the plan in speedkit.core.distributed does); it stays short enough to read in one sitting."""
    from speedkit.methods import REGISTRY

    source = (ROOT / "train" / "trainer.py").read_text()
    tree = ast.parse(source)
    strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert not strings & set(REGISTRY)
    branches = [ast.unparse(node.test) for node in ast.walk(tree) if isinstance(node, (ast.If, ast.IfExp))]
    assert not [b for b in branches if "parallel" in b or "ddp" in b or "fsdp" in b or "plan.name" in b]
    assert len(source.splitlines()) <= 520


def _package_of(module: str) -> str:
    """The room a module belongs to: its subpackage (speedkit.methods) or itself (speedkit.train.trainer).
    speedkit.functional is the methods' functional face (it re-exports their forms), so it is theirs."""
    if module == "speedkit.functional":
        return "speedkit.methods"
    parts = module.split(".")
    return ".".join(parts[:2])


def test_no_private_name_is_imported_across_packages():
    """What packages share is public (core.method.show, runs.json_safe, speedkit.core.seeding, ...)."""
    crossing = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("speedkit") and not node.level:
                private = [a.name for a in node.names if a.name.startswith("_") and a.name != "__version__"]
                source = _known(node.module)
                if private and _package_of(source) != _package_of(module):
                    crossing.append(f"{module} imports {private} from {node.module}")
                if _package_of(source) != _package_of(module) and any(p.startswith("_") for p in source.split(".")):
                    crossing.append(f"{module} imports from the private module {node.module}")
    assert not crossing
