"""``State`` declares every field it carries: nothing in the package gives a State an attribute its
``__init__`` does not set. Read from the source with ``ast`` (like tests/test_import_graph.py), so a new
``state.something = ...`` anywhere fails here with the module and line named, until State declares it."""
from __future__ import annotations

import ast
from pathlib import Path

import torch

from speedkit.core import State, Time

ROOT = Path(__file__).resolve().parents[2] / "speedkit"


def _declared() -> set[str]:
    state = State(model=None, loss_fn=None, max_duration=Time.from_input("1ep"), device=torch.device("cpu"),
                  precision="fp32", seed=0)
    return set(vars(state)) | {name for name in dir(State) if not name.startswith("__")}


def _is_state(node) -> bool:
    """``state`` or ``<anything>.state``: how the package names a State."""
    return (isinstance(node, ast.Name) and node.id == "state") or (isinstance(node, ast.Attribute)
                                                                  and node.attr == "state")


def state_field_writes(source: str) -> list[tuple[int, str]]:
    """(line, field) of every attribute written on a State in ``source``: assigned (also in a tuple, or
    augmented) or set through ``setattr(state, "field", ...)``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for element in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
                if isinstance(element, ast.Attribute) and _is_state(element.value):
                    found.append((node.lineno, element.attr))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                and len(node.args) >= 2 and _is_state(node.args[0]) and isinstance(node.args[1], ast.Constant)):
            found.append((node.lineno, node.args[1].value))
    return found


def test_the_check_sees_every_kind_of_write():
    source = """
state.log_every = 10
self.state.batch, state.microbatch_index, weight = 1, 2, 3
state.timestamp += 1
setattr(state, "extra", 1)
other.log_every = 10
state.batch.x = 1
"""
    assert state_field_writes(source) == [(2, "log_every"), (3, "batch"), (3, "microbatch_index"), (4, "timestamp"),
                                          (5, "extra")]


def test_every_field_the_package_writes_on_a_state_is_declared():
    declared = _declared()
    undeclared = {}
    for path in sorted(ROOT.rglob("*.py")):
        for line, field in state_field_writes(path.read_text()):
            if field not in declared:
                undeclared.setdefault(path.relative_to(ROOT).as_posix(), []).append((line, field))
    assert not undeclared, (f"these modules give a State fields its __init__ does not declare; declare them in "
                            f"speedkit/core/state.py: {undeclared}")
