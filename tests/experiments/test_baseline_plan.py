"""The one plan that tunes a baseline (bench's --sweep/--find-budgets, tune's baseline phase), as a pure function."""
from __future__ import annotations

import math
import random

from speedkit.experiments.baseline_plan import BaselinePlan, Outcome, answer, budget_found, next_run, sweep_found

COSINE = {"name": "cosine"}


def world(point) -> float | None:
    """Batches to the target: lr 0.2 is best (30% more batches for each factor of two away from it); a run needs
    330 batches on seed 0 and 380 on seed 1 at that rate, and a budget shorter than that misses."""
    needs = {0: 330, 1: 380}[point.seed] * (1 + 0.3 * abs(math.log2(point.lr / 0.2)))
    budget = int(point.budget.removesuffix("ba"))
    return needs if budget >= needs else None


def run_plan(plan: BaselinePlan) -> list[Outcome]:
    tried = []
    while (point := next_run(plan, tried)) is not None:
        tried.append(Outcome(point, world(point), 1.0))
        assert len(tried) < 50
    return tried


def test_the_plan_sweeps_then_walks_the_budget_from_where_the_pick_reached():
    plan = BaselinePlan(metric="eval/accuracy", rates=(0.1, 0.2, 0.4), schedules=(COSINE,), sweep_budget="600ba",
                        sweep_seed=0, budget_step="50ba", seeds=(0, 1), start_steps=12)
    tried = run_plan(plan)
    swept = [(o.point.lr, o.point.budget) for o in tried if o.point.stage == "sweep"]
    assert swept == [(0.1, "600ba"), (0.2, "600ba"), (0.4, "600ba")]  # the middle wins: nothing past the edge
    walked = [(o.point.budget, o.point.seed) for o in tried if o.point.stage == "budget"]
    # from the pick's 330 batches rounded up to 350: seed 1 misses there, so up a step, where both reach
    assert walked == [("350ba", 0), ("350ba", 1), ("400ba", 0), ("400ba", 1)]
    assert budget_found(plan, tried) == {"budget": "400ba", "tried": {"350ba": 1, "400ba": 2}}
    assert sweep_found(plan, tried)["pick"] == {"lr": 0.2, "schedule": COSINE}
    assert answer(plan, tried).point.budget == "400ba"  # 350 reached on seed 0 but not on seed 1


def test_the_plan_resumes_from_its_runs_in_any_order():
    plan = BaselinePlan(metric="eval/accuracy", rates=(0.1, 0.2, 0.4), schedules=(COSINE,), sweep_budget="600ba",
                        sweep_seed=0, budget_step="50ba", seeds=(0, 1), start_steps=12)
    tried = run_plan(plan)
    for done in range(len(tried)):
        earlier = tried[:done]
        random.Random(done).shuffle(earlier)
        assert next_run(plan, earlier) == tried[done].point


def test_past_the_grids_edge_at_most_two_rates_and_never_out_of_range():
    edge = BaselinePlan(metric="eval/accuracy", rates=(0.05, 0.1), schedules=(COSINE,), sweep_budget="600ba",
                        sweep_seed=0)
    assert [o.point.lr for o in run_plan(edge)] == [0.05, 0.1, 0.2, 0.4]  # 0.2 wins, 0.4 loses: the pick is 0.2
    bounded = BaselinePlan(metric="eval/accuracy", rates=(0.05, 0.1), schedules=(COSINE,), sweep_budget="600ba",
                           sweep_seed=0, lr_range=(0.01, 0.15))
    assert [o.point.lr for o in run_plan(bounded)] == [0.05, 0.1]


def test_without_a_step_the_budget_is_walked_in_about_tenths_that_divide_it():
    from speedkit.experiments.baseline_plan import default_step

    assert [default_step(b) for b in ("8ep", "550ba", "150ba", "155ba", "7ba", "2.5ep")] == \
        ["1ep", "55ba", "15ba", "5ba", "1ba", "1ep"]


def test_the_default_grid_starts_from_the_baseline_as_given():
    """bench's `--sweep` and tune's baseline plan try one grid where none is named: the rate as given first (the
    pick among equals), halved and doubled, each with the baseline's own schedule, then a linear decay after the
    same warmup; a baseline already on that decay, or on none, is not given the same schedule twice."""
    import dataclasses

    from speedkit.experiments.baseline_plan import default_sweep
    from speedkit.tasks import get_recipe

    recipe = get_recipe("fashion-mnist", "plain-bf16")
    grid = default_sweep(recipe)
    assert grid["lr"] == (recipe.optimizer["lr"], recipe.optimizer["lr"] / 2, recipe.optimizer["lr"] * 2)
    assert grid["schedule"] == (recipe.schedule, {"name": "linear_to_zero", "warmup": recipe.schedule["warmup"]})
    linear = recipe.with_changes(schedule={"name": "linear_to_zero", "warmup": recipe.schedule["warmup"]})
    assert default_sweep(linear)["schedule"] == (linear.schedule,)
    constant = dataclasses.replace(recipe, schedule=None)
    assert default_sweep(constant)["schedule"] == (None, {"name": "linear_to_zero"})
    first = BaselinePlan(metric="eval/accuracy", rates=grid["lr"], schedules=grid["schedule"],
                         sweep_budget=recipe.duration, sweep_seed=0).grid()[0]
    assert (first.lr, first.schedule, first.budget) == (recipe.optimizer["lr"], recipe.schedule, recipe.duration)
