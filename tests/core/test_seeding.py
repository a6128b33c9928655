"""The one seed rule: seeds derive through speedkit.core.seeding, never by arithmetic, and do not collide."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import speedkit
from speedkit.core import seeding

PACKAGE = Path(speedkit.__file__).parent
SEED_NAME = re.compile(r"(^|_)seed$", re.IGNORECASE)  # seed, self.seed, state.seed, sampler_seed; not seeds
ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.BitXor, ast.BitOr, ast.LShift, ast.Mod)


def _names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    return []


def seed_arithmetic(source: str) -> list[int]:
    """Lines where a seed is an operand of arithmetic (``seed * 1_000_003 + epoch``, ``seed + worker``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ARITHMETIC):
            if any(SEED_NAME.search(name) for side in (node.left, node.right) for name in _names(side)):
                found.append(node.lineno)
    return found


def test_the_check_sees_the_arithmetic_it_forbids():
    assert seed_arithmetic("s = rank_seed(self.state.seed * 1_000_003 + epoch)") == [1]
    assert seed_arithmetic("TPESampler(seed=config.sampler_seed + worker_index)") == [1]
    assert seed_arithmetic("derive_seed(seed, EPOCH_RNG, epoch)\nrange(SEED_START, SEED_START + n_seeds)") == []


def test_no_seed_arithmetic_outside_seeding():
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        if path == Path(seeding.__file__):
            continue  # the one place that turns a seed into another
        lines = seed_arithmetic(path.read_text())
        if lines:
            offenders[str(path.relative_to(PACKAGE))] = lines
    assert not offenders, f"derive seeds through speedkit.core.seeding (derive_seed, epoch_seed): {offenders}"


def test_epoch_seeds_do_not_collide_across_seeds_epochs_and_loader_streams():
    epoch_seeds = {(s, e): seeding.epoch_seed(s, e) for s in range(20) for e in range(20)}
    assert len(set(epoch_seeds.values())) == len(epoch_seeds)  # (0, 1) and (1, 0) no longer share one
    loader_streams = {seeding.derive_seed(s, e) for s in range(20) for e in range(20)}
    named = {seeding.derive_seed(s, key) for s in range(20) for key in seeding.STREAMS.values()}
    assert not set(epoch_seeds.values()) & loader_streams
    assert not loader_streams & named
    assert len(set(seeding.STREAMS.values())) == len(seeding.STREAMS)


def test_process_seeds_keep_the_first_process_and_separate_the_rest():
    assert seeding.process_seed(7, 0) == 7
    others = {seeding.process_seed(s, i, bits=32) for s in range(10) for i in range(1, 10)}
    assert len(others) == 90 and all(0 <= x < 2**32 for x in others)


def test_a_negative_key_is_refused():
    with pytest.raises(ValueError, match="non-negative"):
        seeding.derive_seed(-1, 0)
