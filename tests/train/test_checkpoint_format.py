"""The checkpoint format lives in one module: ``speedkit.train.checkpoint.format`` alone names the payload's
keys (the fields of ``CheckpointContents``); the Checkpointer, the parallel plans, the Trainer and export
see a ``CheckpointContents``. The plan only gathers state dicts and says who writes."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import torch
from helpers import toy_loaders, toy_model

from speedkit import Trainer
from speedkit.train.checkpoint import CheckpointContents, load_checkpoint, read
from speedkit.train.parallel import CheckpointShare, SingleProcess

ROOT = Path(__file__).resolve().parents[2] / "speedkit"
FORMAT = "train/checkpoint/format.py"
PAYLOAD_KEYS = {f.name for f in dataclasses.fields(CheckpointContents) if f.name != "sharded"} | {"format_version"}
# Keys no other dictionary or argument of speedkit uses ("model", "methods", "callbacks", ... name others too).
CHECKPOINT_ONLY_KEYS = {"format_version", "rng_by_rank", "grad_scaler", "microbatching", "timestamp", "rng", "sharded"}
# The modules that handle checkpoints: they read and write them through CheckpointContents only.
HANDLERS = ("train/checkpoint/checkpointer.py", "train/parallel.py", "train/trainer.py", "cli/export.py",
            "callbacks/checkpoint_saver.py")


def _strings(tree) -> list[tuple[int, str]]:
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _keys_looked_up(tree) -> list[tuple[int, str]]:
    """String keys of ``x["key"]``, ``x.get("key")`` and ``x.pop("key")``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            found.append((node.lineno, node.slice.value))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop")
              and node.args and isinstance(node.args[0], ast.Constant)):
            found.append((node.lineno, node.args[0].value))
    return found


def test_only_the_format_module_names_the_payload_keys():
    named = {}
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative == FORMAT:
            continue
        tree = ast.parse(path.read_text())
        hits = [(line, s) for line, s in _strings(tree) if s in CHECKPOINT_ONLY_KEYS]
        if relative in HANDLERS:
            hits += [(line, k) for line, k in _keys_looked_up(tree) if k in PAYLOAD_KEYS]
        if hits:
            named[relative] = sorted(set(hits))
    assert not named, f"payload keys named outside {FORMAT}: {named}"


def test_a_trainers_checkpoint_holds_exactly_the_fields_of_checkpoint_contents(tmp_path):
    train, _ = toy_loaders()
    Trainer(toy_model(), train, max_duration="2ba", device="cpu", run_dir=tmp_path, run_name="r").fit()
    latest = tmp_path / "r" / "checkpoints" / "latest.ckpt"
    # One process: its one RNG state; an in-memory loader: no loader state (its epochs are functions of the seed).
    assert set(load_checkpoint(latest)) == PAYLOAD_KEYS - {"rng_by_rank", "dataloader"}
    contents = read(latest)
    assert contents.timestamp["batch"] == 2 and not contents.sharded and contents.record_dict["name"] == "r"


def test_the_plan_gathers_state_dicts_and_says_who_writes():
    model = toy_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    class State:
        pass

    state = State()
    state.model, state.optimizers = model, [optimizer]
    share = SingleProcess(torch.device("cpu")).gather_checkpoint(state, None, rng={}, last_checkpoint=None)
    assert isinstance(share, CheckpointShare) and share.writes and not share.sharded and share.rng_by_rank is None
    assert share.model.keys() == model.state_dict().keys() and share.optimizers == [optimizer.state_dict()]
