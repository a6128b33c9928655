"""How a baseline is tuned: one plan of runs, for bench (``--sweep``, ``--find-budgets``) and tune (its baseline
study) alike.

A speed-up is only as honest as the baseline it is measured against, and a skeptic suspects its learning rate
first, then its budget. So the plan first tries, on one seed and at one budget, each learning rate and schedule of
a grid, going on past the grid's edge while the edge keeps winning (a baseline tuned to its grid's edge is not
tuned). Then, at the pick, it walks the budget a step at a time to the fewest steps with which the baseline reaches
the target on every seed, starting where the pick reached it. Every run stops at the target: past it a run says
nothing more about whether, or how soon, it gets there. Where no grid is named, bench's ``--sweep`` and tune's
baseline plan try the same one (``default_sweep``).

Runs are ranked by batches to the target, not seconds: every candidate trains the same model on batches of one
size, and batches do not depend on what else the machine was doing (the runs need not be timed on a quiet machine).

The plan is a function of the runs tried so far (``next_run``), and ``run_plan`` is the one loop that runs it, for
bench and tune alike: each run is a RunRecord in the run folder, so a killed plan resumes from the runs that
finished (bench finds them by ``harness.plan_run_id``, tune by the list its study keeps).
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Callable, Sequence

from speedkit.core.time import Time, scaled_duration
from speedkit.experiments.compare import time_rank
from speedkit.experiments.measure import shortest_budget

EDGE_STEPS = 2  # rates tried past the grid's edge while the edge keeps winning
# The default grid's rates, as factors of the baseline's own: a rate off by 2x either way is what a skeptic
# suspects first. The baseline's own rate comes first: among equals, the first tried is the pick.
DEFAULT_RATE_FACTORS = (1.0, 0.5, 2.0)


@dataclasses.dataclass(frozen=True)
class Point:
    """One run of the plan. ``stage``: ``"sweep"`` (a rate of the grid or past its edge) or ``"budget"`` (the
    walk); it names the run and is not part of what the run is."""

    lr: float
    schedule: dict | None  # None: the optimizer's rate throughout
    budget: str
    seed: int
    stage: str = dataclasses.field(default="sweep", compare=False)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a run of the plan measured: batches to the target (None: it missed) and its final metric."""

    point: Point
    batches_to_target: float | None
    final: float | None
    time_to_target_s: float | None = None
    run: str | None = None  # the run's name


@dataclasses.dataclass(frozen=True)
class BaselinePlan:
    """The runs that tune one baseline. ``rates`` and ``schedules``: the grid, tried at ``sweep_budget`` on
    ``sweep_seed`` (one rate and one schedule: nothing to sweep). ``budget_step``: the budget walk's step
    (None: the budget is not searched); the walk starts at the pick's batches to the target rounded up to a step
    (a step in batches) or else at ``start_steps``, and goes no further than ``most_steps`` (default twice the
    start, and at least ``start_steps``); a budget holds where every one of ``seeds`` reaches the target.
    ``lr_range`` bounds the rates past the grid's edge."""

    metric: str
    rates: tuple[float, ...]
    schedules: tuple[dict | None, ...]
    sweep_budget: str
    sweep_seed: int
    budget_step: str | None = None
    seeds: tuple[int, ...] = ()
    start_steps: int | None = None
    most_steps: int | None = None
    lr_range: tuple[float, float] = (0.0, math.inf)

    def budget(self, steps: int) -> str:
        return scaled_duration(self.budget_step, steps)

    def grid(self) -> list[Point]:
        """The sweep's points, every rate with the first schedule, then with the next: a plan cut short (tune's, by
        its share of the budget) has tried the rates first. A grid of one point is no sweep but the budget walk's
        first run."""
        stage = "sweep" if len(self.rates) * len(self.schedules) > 1 else "budget"
        return [Point(lr, schedule, self.sweep_budget, self.sweep_seed, stage) for schedule in self.schedules
                for lr in self.rates]


def default_sweep(recipe) -> dict:
    """The grid of a baseline whose sweep names none, ``{"lr": rates, "schedule": schedules}``: its own rate
    halved and doubled (``DEFAULT_RATE_FACTORS``), each with its own schedule and a linear decay after the same
    warmup (``default_decays``); the baseline as given is the first point."""
    lr = recipe.optimizer["lr"]
    return {"lr": tuple(float(f"{lr * factor:.12g}") for factor in DEFAULT_RATE_FACTORS),
            "schedule": default_decays(recipe.schedule)}


def default_decays(schedule) -> tuple:
    """A baseline's own schedule and a linear decay to zero after the same warmup: the decays a default sweep
    tries (one, where the baseline's is that linear decay)."""
    warmup = schedule.get("warmup") if isinstance(schedule, dict) else None
    linear = {"name": "linear_to_zero", **({"warmup": warmup} if warmup else {})}
    return (schedule,) if schedule == linear else (schedule, linear)


def default_step(budget: str) -> str:
    """A budget walk's step where none is given: about a tenth of ``budget``, in whole units of it that divide it
    (``8ep`` -> ``1ep``, ``550ba`` -> ``55ba``), as the search walks a tenth at a time."""
    time = Time.from_string(budget)
    whole = int(time.value)
    step = next((d for d in range(max(1, whole // 10), 0, -1) if whole % d == 0), 1) if whole == time.value else 1
    return str(Time(step, time.unit))


def next_run(plan: BaselinePlan, tried: Sequence[Outcome]) -> Point | None:
    """The plan's next run after ``tried``, or None where the plan is done. The order of ``tried`` matters only
    where two runs of the sweep tie (the first is picked)."""
    done = {_key(o.point) for o in tried}
    untried = [p for p in plan.grid() if _key(p) not in done]
    if untried:
        return untried[0]
    beyond = _past_the_edge(plan, swept(plan, tried))
    if beyond is not None:
        return beyond
    if plan.budget_step is None:
        return None
    return _walk(plan, tried)[0]


def run_plan(plan: BaselinePlan, tried: Sequence[Outcome], run: Callable[[Point], Outcome | None]) -> list[Outcome]:
    """Run ``plan`` on from ``tried``: each next point through ``run`` until the plan is done, or until ``run``
    returns None (stopped: the budget given to tuning is spent, or the user asked). Returns every run tried."""
    tried = list(tried)
    while (point := next_run(plan, tried)) is not None:
        outcome = run(point)
        if outcome is None:
            break
        tried.append(outcome)
    return tried


def swept(plan: BaselinePlan, tried: Sequence[Outcome]) -> list[Outcome]:
    """The runs at the sweep's budget and seed, in the order given."""
    return [o for o in tried if o.point.budget == plan.sweep_budget and o.point.seed == plan.sweep_seed]


def pick(plan: BaselinePlan, tried: Sequence[Outcome]) -> Outcome | None:
    """The sweep's fastest run to the target in batches (ties and misses: the best final metric; then the first)."""
    runs = swept(plan, tried)
    return min(runs, key=lambda o: time_rank([o.batches_to_target], [o.final], plan.metric)) if runs else None


def _past_the_edge(plan: BaselinePlan, runs: list[Outcome]) -> Point | None:
    grid_rates = sorted(set(plan.rates))
    rates = sorted({o.point.lr for o in runs})
    if len(grid_rates) < 2 or len(rates) - len(grid_rates) >= EDGE_STEPS:
        return None
    best = pick(plan, runs).point
    if best.lr == rates[-1]:
        lr = rates[-1] * rates[-1] / rates[-2]
    elif best.lr == rates[0]:
        lr = rates[0] * rates[0] / rates[1]
    else:
        return None
    lr = float(f"{lr:.12g}")  # 0.4, not 0.4000000000000001, in run names and the sweeps file
    low, high = plan.lr_range
    return Point(lr, best.schedule, plan.sweep_budget, plan.sweep_seed) if low <= lr <= high else None


def _walk(plan: BaselinePlan, tried: Sequence[Outcome]) -> tuple[Point | None, int | None, list[str]]:
    """The walk so far: its next run (None: it is done), its answer in steps (None: not known, or no budget held)
    and the budgets it has visited."""
    best = pick(plan, tried).point
    runs = {_key(o.point): o for o in tried}
    start = start_steps(plan, tried)
    pending: list[Point] = []
    visited: list[str] = []

    def holds(steps: int) -> bool | None:
        visited.append(plan.budget(steps))
        for seed in plan.seeds:
            point = Point(best.lr, best.schedule, plan.budget(steps), seed, "budget")
            outcome = runs.get(_key(point))
            if outcome is None:
                pending.append(point)
                return None
            if outcome.batches_to_target is None:
                return False  # one seed short is enough to reject a budget
        return True

    steps = shortest_budget(holds, start, plan.most_steps or max(2 * start, plan.start_steps or 0))
    return (pending[-1] if pending else None), steps, visited


def start_steps(plan: BaselinePlan, tried: Sequence[Outcome]) -> int:
    """Where the budget walk starts: the pick's batches to the target rounded up to the step, where the step is in
    batches and the pick reached it; else ``plan.start_steps``. The answer is near there, on either side: a shorter
    schedule decays sooner, which may bring the target forward or, with too little time at the full learning
    rate, out of reach (the walk then goes up)."""
    step, best = Time.from_string(plan.budget_step), pick(plan, tried)
    if step.unit.value == "ba" and best is not None and best.batches_to_target is not None:
        steps = max(1, math.ceil(best.batches_to_target / step.value))
        return min(steps, plan.most_steps) if plan.most_steps else steps
    if plan.start_steps is None:
        raise ValueError(f"a budget walk in steps of {plan.budget_step} needs a start where the sweep's pick gives "
                         f"none; set start_steps")
    return plan.start_steps


def answer(plan: BaselinePlan, tried: Sequence[Outcome]) -> Outcome | None:
    """The run the plan stands on now, on the sweep's seed: at the pick, the shortest budget that reached the target
    there and on no seed missed it (the sweep's run itself where none shorter did), None before any run."""
    best = pick(plan, tried)
    if best is None or best.batches_to_target is None:
        return best
    at_pick = [o for o in tried if (o.point.lr, o.point.schedule) == (best.point.lr, best.point.schedule)]
    missed = {o.point.budget for o in at_pick if o.batches_to_target is None}
    held = [o for o in at_pick if o.point.seed == plan.sweep_seed and o.batches_to_target is not None
            and o.point.budget not in missed]
    return min(held, key=lambda o: Time.from_string(o.point.budget).value) if held else best


def budget_found(plan: BaselinePlan, tried: Sequence[Outcome]) -> dict:
    """The walk's result as ``--find-budgets`` writes it: ``{"budget", "tried": {budget: seeds that reached}}``
    (``budget`` None where none held or the walk is not done)."""
    pending, steps, visited = _walk(plan, tried)
    best = pick(plan, tried).point
    reached = {}
    for budget in visited:
        runs = [o for o in tried if (o.point.lr, o.point.schedule, o.point.budget) == (best.lr, best.schedule, budget)
                and o.point.seed in plan.seeds]
        if runs:
            reached[budget] = sum(o.batches_to_target is not None for o in runs)
    return {"budget": plan.budget(steps) if pending is None and steps is not None else None, "tried": reached}


def sweep_found(plan: BaselinePlan, tried: Sequence[Outcome]) -> dict:
    """The sweep's result as ``--sweep`` writes it: ``{"tried": [...], "pick": {"lr", "schedule"}}``."""
    rows = [{"lr": o.point.lr, "schedule": o.point.schedule, "time_to_target_s": o.time_to_target_s,
             "batches_to_target": o.batches_to_target, "final_metric": o.final, "run": o.run}
            for o in swept(plan, tried)]
    best = pick(plan, tried).point
    return {"tried": rows, "pick": {"lr": best.lr, "schedule": best.schedule}}


def _key(point: Point) -> tuple:
    return point.lr, json.dumps(point.schedule, sort_keys=True), point.budget, point.seed
