"""The one measuring core: recipes against baselines on seeds, to a target, as paired ratios.

``measure`` runs every baseline and recipe once per seed, seed by seed (A B A B ...), so slow drifts of a shared
machine hit both sides alike and each seed's pair ran side by side, and returns a ``Measurement`` whose
``ratios`` are baseline time / recipe time seed by seed (``compare.paired_speedups``). The benchmark's main runs,
the search's confirmation, the demo and the notebooks all measure through it; what differs is only ``run``
(how one recipe is trained on one seed). ``shortest_budget`` is the one budget search (a baseline's, in
``baseline_plan``, and the search's longer budgets for a winner that missed a seed).
``finished_runs`` is the one resume: the measured runs found finished in a run folder, by what they are runs of
(the benchmark's ``--reuse`` and ``--only``, the search's confirmation continued after a kill or with more budget).
"""
from __future__ import annotations

import dataclasses
import time as _time
from pathlib import Path
from typing import Any, Callable, Hashable, Sequence

from speedkit.core.time import Time
from speedkit.experiments.compare import fastest, median_or_none, paired_speedups
from speedkit.record.runs import RunRecord, load_records


# What makes a run request a measured run (the benchmark's runs, the search's trials and confirmation runs): a
# measurement is not resumed, so it is not checkpointed and runs again from the start under its name (running it
# again measures it again), and it shows no progress bar (whoever measures reports each run as it ends).
MEASURED_RUN = {"save_checkpoints": False, "overwrite": True, "progress_bar": False}


def refuse_planned(run, planned: dict[str, str], owner: str, each: str) -> None:
    """Refuse what ``run`` (the RunRequest every run of a benchmark profile or a search starts from) sets that the
    planner sets in each run itself: it would be overwritten there without a word, or (``methods``) override what
    the planner plans. ``planned``: field -> what to set instead; ``MEASURED_RUN``'s Trainer options are always
    the planner's (a measured run is never resumed, so it is neither checkpointed nor kept under its name)."""
    default = type(run)()
    for name, fix in planned.items():
        if getattr(run, name) != getattr(default, name):
            raise TypeError(f"{owner}: run.{name} is set by each {each}, so it would be ignored or would override "
                            f"what it plans; {fix}")
    fixed = sorted(set(MEASURED_RUN) & set(run.trainer_options))
    if fixed:
        raise TypeError(f"{owner}: run's Trainer options {fixed} are set by each {each} (a measured run: "
                        f"{MEASURED_RUN}); leave them out")


def fit(request, on_built: Callable[[Any], None] | None = None):
    """Build and fit the run ``request`` asks for (a RunRequest); the time to build it (data into memory, model,
    INIT surgery) is its ``setup_s``. ``on_built(trainer)`` sees the Trainer before it fits."""
    from speedkit.tasks import make_trainer

    started = _time.perf_counter()
    trainer = make_trainer(request)
    trainer.logger.log_timing("setup_s", _time.perf_counter() - started)
    if on_built is not None:
        on_built(trainer)
    return trainer.fit()


def finished_runs(run_dir, key: Callable[[RunRecord], Hashable | None]) -> dict[Hashable, RunRecord]:
    """The newest run under ``run_dir`` of each ``key(record)`` (what the record is a run of: a (recipe, seed), a
    (candidate, seed); None for a run that is not one of them, or did not finish as a measurement); failed runs
    are left out. A measurement resumed from here runs only what is missing."""
    newest = {}
    for record in load_records(run_dir) if Path(run_dir).is_dir() else ():  # oldest first: later ones replace
        found = None if record.status == "failed" else key(record)
        if found is not None:
            newest[found] = record
    return newest


@dataclasses.dataclass
class Measurement:
    """What ``measure`` ran: ``runs[name]`` holds each seed's result of ``run`` in seed order (None where it
    returned none), ``times[name]`` its time to the target. A measurement read back from where its runs are
    stored (the benchmark's records, the search's confirmation trials) has ``times`` and ``finals`` (each seed's
    final metric, which breaks ties between equal times) and no ``runs``; both are judged here, one way."""

    seeds: list
    baselines: tuple[str, ...]
    recipes: tuple[str, ...]
    runs: dict[str, list[Any]]
    times: dict[str, list[float | None]]
    finals: dict[str, list[float | None]] = dataclasses.field(default_factory=dict)

    @classmethod
    def read_back(cls, times: dict[str, list], finals: dict[str, list], baselines: Sequence[str],
                  seeds: Sequence = ()) -> "Measurement":
        """A measurement read back from where its runs are stored: ``times`` and ``finals`` by name, each in
        seed order; the names not in ``baselines`` are its recipes."""
        return cls(seeds=list(seeds), baselines=tuple(baselines), recipes=tuple(n for n in times if n not in baselines),
                   runs={}, times=dict(times), finals=dict(finals))

    @classmethod
    def of_runs(cls, runs: dict[str, list], baselines: Sequence[str]) -> "Measurement":
        """Runs ``measure`` made before, loaded again (RunRecords by name, each in seed order, as ``runs`` holds
        them): the demo reads its quickstart's records back this way. The seeds are the pairs' positions."""
        count = len(next(iter(runs.values()), []))
        return cls(seeds=list(range(count)), baselines=tuple(baselines),
                   recipes=tuple(n for n in runs if n not in baselines), runs=dict(runs),
                   times={name: [r.time_to_target for r in records] for name, records in runs.items()})

    def ratios(self, recipe: str, baseline: str | None = None) -> list[float | None]:
        """Baseline time / recipe time, seed by seed (None where either side never reached the target);
        against the first baseline by default."""
        return paired_speedups(self.times[baseline or self.baselines[0]], self.times[recipe])

    def median_ratio(self, recipe: str, baseline: str | None = None) -> float | None:
        return median_or_none(self.ratios(recipe, baseline))

    def fastest(self, names: Sequence[str], metric: str | None = None) -> str | None:
        """Of ``names``, the first by ``compare.time_rank`` on these seeds (None where there are none)."""
        if not names:
            return None
        return fastest({name: (self.times[name], self.finals.get(name, ())) for name in names}, metric)

    def strongest_baseline(self, metric: str | None = None) -> str:
        """The baseline every speed-up is measured against: the fastest of them on these seeds."""
        return self.fastest(self.baselines, metric)


def measure(recipes: Sequence[str], baselines: Sequence[str], seeds: Sequence, run: Callable[[str, Any], Any], *,
            keep_going: Callable[[Measurement], bool] | None = None,
            on_run: Callable[[Any], None] | None = None) -> Measurement:
    """Run each baseline, then each recipe, once per seed, seed by seed, and pair them by seed.

    ``run(name, seed)`` trains one (a RunRecord, or None for a run it skips, such as one done before);
    ``keep_going(measurement so far)`` is asked before every seed after the first (e.g. whether another pair
    fits a time budget); ``on_run`` sees each result.
    """
    baselines, recipes = tuple(baselines), tuple(r for r in recipes if r not in baselines)
    result = Measurement(seeds=[], baselines=baselines, recipes=recipes,
                         runs={name: [] for name in (*baselines, *recipes)},
                         times={name: [] for name in (*baselines, *recipes)})
    for seed in seeds:
        if result.seeds and keep_going is not None and not keep_going(result):
            break
        result.seeds.append(seed)
        for name in (*baselines, *recipes):
            outcome = run(name, seed)
            result.runs[name].append(outcome)
            result.times[name].append(None if outcome is None else outcome.time_to_target)
            if outcome is not None and on_run is not None:
                on_run(outcome)
    return result


def shortest_budget(holds: Callable[[int], bool | None], start: int, most: int, down: bool = True) -> int | None:
    """The fewest steps of budget for which ``holds(steps)`` (every seed reached the target).

    From ``start``: where it holds, down a step at a time while it still does (with ``down``); where it does
    not, up a step at a time to at most ``most``. None where no budget up to ``most`` holds, or where ``holds``
    answered None (not known yet: a planner that asks for that run first, ``baseline_plan``).
    """
    known = holds(start)
    if known is None:
        return None
    if known:
        best = start
        while down and best > 1:
            lower = holds(best - 1)
            if not lower:
                return best if lower is False else None
            best -= 1
        return best
    for steps in range(start + 1, most + 1):
        known = holds(steps)
        if known is None or known:
            return steps if known else None
    return None


def budget_scale(recipe, base) -> float | None:
    """The recipe's budget over the base's (None where their units differ)."""
    try:
        return Time.from_string(recipe.duration) / Time.from_string(base.duration)
    except (ValueError, TypeError):
        return None
