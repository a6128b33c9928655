"""The RunRecord is output: only the record's own writers (``speedkit/record/``) and the Trainer write its
``notes`` and ``timings``. Every other component reports what it has to say through the logger
(``logger.log_note``, ``logger.log_timing``) and keeps what it needs to resume in its own ``state_dict``.

Read from the source with ``ast``, like tests/test_import_graph.py, so a new ``state.record.notes[...] = ...``
anywhere else fails here with the module and line named.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "speedkit"
FIELDS = ("notes", "timings")
WRITERS = ("record/", "train/trainer.py")  # the record's own writers, and the loop that owns the record
RECORD_WRITE_CALLS = ("add_note", "add_timing", "set_timing")  # RunRecord's writing methods
MUTATING = ("setdefault", "update", "pop", "popitem", "clear", "__setitem__", "__delitem__")


def _is_field(node) -> bool:
    """``<anything>.notes`` or ``<anything>.timings``."""
    return isinstance(node, ast.Attribute) and node.attr in FIELDS


def _targets(node) -> list:
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = node.targets
    else:
        return []
    flat = []
    for target in targets:
        flat.extend(target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target])
    return flat


def record_writes(source: str) -> list[tuple[int, str]]:
    """(line, code) of every write into ``.notes``/``.timings`` in ``source``: assigning the field or an item
    of it, a mutating method of it, or a RunRecord writing method."""
    found = []
    for node in ast.walk(ast.parse(source)):
        for target in _targets(node):
            if _is_field(target) or (isinstance(target, ast.Subscript) and _is_field(target.value)):
                found.append((node.lineno, ast.unparse(target)))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver, name = node.func.value, node.func.attr
            if (_is_field(receiver) and name in MUTATING) or name in RECORD_WRITE_CALLS:
                found.append((node.lineno, ast.unparse(node.func)))
    return sorted(found)


def test_the_check_sees_every_kind_of_write():
    source = """
state.record.notes["x"] = 1
record.timings["y"] += 2.0
record.notes = {}
a.steps, a.notes = [], {}
state.record.notes.setdefault("surgery", []).append("r")
record.timings.update(z=1)
record.add_timing("eval_s", 1.0)
del record.notes["x"]
seconds = record.timings.get("train_s")
logger.log_note("x", 1)
"""
    assert [line for line, _ in record_writes(source)] == [2, 3, 4, 5, 6, 7, 8, 9]


def test_only_the_record_and_the_trainer_write_the_records_notes_and_timings():
    writes = {}
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(WRITERS):
            continue
        found = record_writes(path.read_text())
        if found:
            writes[relative] = found
    assert not writes, (f"these modules write the RunRecord's notes or timings; report through the logger "
                        f"instead (logger.log_note / logger.log_timing), and keep resume state in a state_dict: {writes}")


# Front ends and experiments read finished records to show and compare them; what trains never reads them back.
OUTPUT_READERS = ("record/", "ui/", "cli/", "experiments/")


def test_nothing_that_trains_reads_the_records_notes_or_timings_back():
    """What a component resumes with comes from its own state in the checkpoint (Microbatching's size, the
    Checkpointer's last checkpoint), never from ``record.notes``/``record.timings``."""
    readers = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(OUTPUT_READERS):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if _is_field(node) and isinstance(node.ctx, ast.Load):
                readers.append(f"{relative}:{node.lineno}: {ast.unparse(node)}")
    assert not readers, f"these modules read the record back: {readers}"

