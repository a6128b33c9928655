"""A planted world for tests/experiments/test_tune.py: fake runs whose time to target is known in advance.

``fake_run`` stands in for training (``speedkit.experiments.tune``'s ``runner=``): label_smoothing halves the time
to target, ema doubles it, a learning rate far from the base's slows it; everything else is neutral.
It reports evaluations through the same TrialContext hooks as the real trainer, writes a RunRecord,
and logs every start and end to ``$TUNE_FAKE_LOG`` so tests can see which trials ran.
"""
from __future__ import annotations

import math
import os
import time

from speedkit.core.method import NothingToChangeError, check_compatibility
from speedkit.methods import build_methods
from speedkit.record.runs import RunRecord

BASE_TIME = 4.0  # fake training seconds to the target with nothing on


def real_seconds_per_fake() -> float:
    """``$TUNE_FAKE_PACE``, read at each run: a test sets it after another test imported this module."""
    return float(os.environ.get("TUNE_FAKE_PACE", "0.01"))

RUN_SETTINGS = ("device", "data_fraction", "eval_fraction", "eval_interval")  # in a record's config, as a real run's


def planted_time(recipe) -> float:
    t = BASE_TIME
    if "label_smoothing" in recipe.methods:
        t *= 0.5
    if "ema" in recipe.methods:
        t *= 2.0
    t *= 1.0 + 0.3 * abs(math.log10(recipe.optimizer["lr"] / 0.1))  # the base lr (0.1) is best
    return t


def _log(line: str) -> None:
    path = os.environ.get("TUNE_FAKE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


_met = False


def _rendezvous() -> None:
    """With ``$TUNE_FAKE_RENDEZVOUS=DIR:N``, each process's first run waits until N processes have arrived,
    so a test of several workers does not depend on how fast a process starts."""
    global _met
    spec = os.environ.get("TUNE_FAKE_RENDEZVOUS")
    if not spec or _met:
        return
    folder, count = spec.rsplit(":", 1)
    open(os.path.join(folder, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(folder)) < int(count) and time.monotonic() < deadline:
        time.sleep(0.05)
    _met = True


def fake_run(context) -> RunRecord:
    check_compatibility(build_methods(context.run.recipe.methods))  # a conflicting set must never get here
    _rendezvous()
    if "gyro_dropout" in context.run.recipe.methods:  # as the real one does at FIT_START in a model without dropout
        raise NothingToChangeError("gyro_dropout found no nn.Dropout layers with p > 0 in the model")
    _log(f"start {context.run.run_name} {os.getpid()}")
    return _train(context, planted_time(context.run.recipe), 3 * BASE_TIME)


FAKE_SECONDS_PER_EPOCH = 0.75
SLOW_SEED = 2  # a confirmation seed on which every recipe needs 30% longer


def budgeted_run(context) -> RunRecord:
    """``fake_run``, but a run trains only as long as its budget (``FAKE_SECONDS_PER_EPOCH``), and on
    ``SLOW_SEED`` (which the search never runs) every recipe needs 30% longer to reach the target: a winner
    whose budget the search trimmed to fit seed 0 misses there."""
    from speedkit.core.time import Time

    check_compatibility(build_methods(context.run.recipe.methods))
    _log(f"start {context.run.run_name} {os.getpid()}")
    reach_at = planted_time(context.run.recipe) * (1.3 if context.run.seed == SLOW_SEED else 1.0)
    return _train(context, reach_at, Time.from_string(context.run.recipe.duration).value * FAKE_SECONDS_PER_EPOCH)


LUCKY_METHOD = "mixup"  # on the search's seed (0) it looks 2.5x faster; on every other seed it is 2x slower


def lucky_seed_run(context) -> RunRecord:
    """``fake_run``, but ``LUCKY_METHOD`` is fast only on seed 0, as a recipe that passes the target at an
    early evaluation by one seed's luck."""
    check_compatibility(build_methods(context.run.recipe.methods))
    _log(f"start {context.run.run_name} {os.getpid()}")
    reach_at = planted_time(context.run.recipe)
    if LUCKY_METHOD in context.run.recipe.methods:
        reach_at *= 0.4 if context.run.seed == 0 else 2.0
    return _train(context, reach_at, 3 * BASE_TIME)


def lucky_lr_run(context) -> RunRecord:
    """``fake_run``, but any learning rate other than the base's (0.1) is twice as fast on seed 0 and twice as
    slow on every other seed: the baseline plan, which ranks on seed 0, picks a tuned baseline that the base
    as given beats on the confirmation's seeds."""
    check_compatibility(build_methods(context.run.recipe.methods))
    _log(f"start {context.run.run_name} {os.getpid()}")
    reach_at = BASE_TIME * (0.5 if "label_smoothing" in context.run.recipe.methods else 1.0)
    if not math.isclose(context.run.recipe.optimizer["lr"], 0.1, rel_tol=0.01):
        reach_at *= 0.5 if context.run.seed == 0 else 2.0
    return _train(context, reach_at, 3 * BASE_TIME)


def _train(context, reach_at: float, available: float) -> RunRecord:
    top = context.target  # a run reaches the target exactly at reach_at
    record = RunRecord(name=context.run.run_name, config={"task": context.run.task, "recipe": context.run.recipe.name,
                                                           "recipe_spec": context.run.recipe.to_dict(),
                                                           **{k: getattr(context.run, k) for k in RUN_SETTINGS},
                                                           **context.run.extra_config},
                       target={"metric": context.metric, "value": context.target})
    record.methods = [{"name": m, "params": p} for m, p in context.run.recipe.methods.items()]
    wall = 0.0
    while wall < available - 1e-9:
        wall = round(wall + 0.25, 6)  # an evaluation every 0.25 fake seconds
        value = top * min(1.0, wall / reach_at)
        value = context.target if math.isclose(value, context.target) else value
        time.sleep(0.25 * real_seconds_per_fake())
        record.add_eval({"batch": int(round(wall * 4)), "wall_s": wall}, {context.metric: value})
        context.budget_done = wall / available  # as the real trainer's reporter sets it at each evaluation
        if value >= context.target or context.on_eval(wall, value):
            break
    record.timings["train_s"] = wall
    record.final_metrics = {context.metric: record.evals[-1][context.metric]}
    record.status = "target_reached" if value >= context.target else "stopped"
    record.save(context.record_path())
    _log(f"end {context.run.run_name} {os.getpid()}")
    return record
