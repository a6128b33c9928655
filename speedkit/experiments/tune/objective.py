"""What a tune trial measures: training seconds to the target (evaluation excluded, ``RunRecord.time_to_target``),
and for a run that misses it ``limit_s * (1 + shortfall)``, behind every run that reached it; the same score at
each evaluation is what the pruner compares, with training time as its resource.
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Callable

from speedkit.core.engine import Callback
from speedkit.record.runs import RunRecord, lower_is_better

USER_STOP = "the search was stopped"
MAX_SHORTFALL = 10.0  # a diverged run (nan, or a loss far off) scores as 11x the limit, no worse


def shortfall(metric: str, value: float | None, target: float) -> float:
    """How far ``value`` is from ``target``, relative to the target (0 when reached, capped)."""
    if value is None or not math.isfinite(value):
        return MAX_SHORTFALL
    gap = (value - target) if lower_is_better(metric) else (target - value)
    return min(MAX_SHORTFALL, max(0.0, gap / max(abs(target), 1e-12)))


def penalized(metric: str, target: float, limit_s: float, time_to_target: float | None,
              value: float | None) -> float:
    """The objective: the time to target if reached, else the limit stretched by the shortfall."""
    if time_to_target is not None:
        return float(time_to_target)
    return float(limit_s) * (1.0 + shortfall(metric, value, target))


def score_record(record: RunRecord, metric: str, target: float, limit_s: float) -> float:
    """A finished run's objective, from its record alone (so any record can be re-scored later)."""
    return penalized(metric, target, limit_s, record.time_to(metric, target), record.best(metric))


@dataclasses.dataclass
class TrialContext:
    """Everything one trial's run needs, and the hooks through which it reports progress.

    A runner (the default one trains through ``make_trainer``) calls :meth:`on_eval` after each
    evaluation; it reports to the Optuna trial and says whether to stop (pruned, over the time
    limit, or unable to beat the best run so far).
    """

    run: object  # speedkit.tasks.RunRequest: task, recipe, seed, run folder and name, the search's settings
    metric: str
    target: float
    limit_s: float  # the per-trial limit the penalty is measured against
    stop_after_s: float  # when this run is stopped (the limit, the search's deadline, or the best run so far)
    trial: object | None = None  # optuna.Trial, or None for confirmation runs
    should_stop: Callable[[], bool] | None = None  # the search was asked to stop (Stop button, Ctrl-C handler)
    stop_reason: str | None = None
    budget_done: float | None = None  # the share of its budget the run had trained at its last evaluation

    def on_eval(self, wall_s: float, value: float | None) -> bool:
        """Report one evaluation; True when the run should stop now."""
        if self.trial is not None:
            reached = shortfall(self.metric, value, self.target) == 0.0
            current = penalized(self.metric, self.target, self.limit_s, wall_s if reached else None, value)
            self.trial.report(current, step=max(1, int(round(wall_s * 1000))))  # resource: training ms
            if not reached and self.trial.should_prune():
                self.stop_reason = "pruned"
                return True
        return self.over_time(wall_s)

    def over_time(self, wall_s: float) -> bool:
        if self.stop_reason is None and self.should_stop is not None and self.should_stop():
            self.stop_reason = USER_STOP
        if wall_s >= self.stop_after_s and self.stop_reason is None:
            self.stop_reason = f"time limit ({self.stop_after_s:.1f}s of training)"
        return self.stop_reason is not None

    def record_path(self) -> Path:
        return Path(self.run.run_dir) / self.run.run_name / "record.json"


class TrialReporter(Callback):
    """Trainer callback: reports each evaluation to the trial; stops the run when it should end."""

    def __init__(self, context: TrialContext, stop_at_target: bool = False):
        self.context = context
        self.stop_at_target = stop_at_target  # where the Trainer's own stop cannot: a target on another metric
        self.trainer = None  # set once the Trainer exists (attach); stop() goes through its public API

    def attach(self, trainer) -> None:
        self.trainer = trainer
        # The run is measured towards the search's target, which may be on another metric than the task's own
        # (the one the Trainer recorded): whatever reads the record later (the run board, a leave-one-out table)
        # times it where the search did.
        trainer.record.target = {"metric": self.context.metric, "value": self.context.target}

    def eval_end(self, state, logger):
        self.context.budget_done = state.fraction_done()
        label, name = self.context.metric.rsplit("/", 1)
        value = state.eval_metrics.get(label, {}).get(name)
        value = None if value is None else float(value)
        if self.context.on_eval(state.timestamp.wall_s, value):
            self._stop()
        elif self.stop_at_target and shortfall(self.context.metric, value, self.context.target) == 0.0:
            self.trainer.stop(f"reached the target {self.context.metric} {self.context.target:g}")

    def batch_end(self, state, logger):
        if self.context.over_time(state.timestamp.wall_s):
            self._stop()

    def _stop(self):
        if self.trainer is not None:
            self.trainer.stop(self.context.stop_reason or "stopped by speedkit tune")


def trial_request(context: TrialContext):
    """The RunRequest of one trial's run: the context's, stopped at the target, a measured run
    (``measure.MEASURED_RUN``: a trial cut short by a stop runs again from the start, under its name)."""
    from speedkit.experiments.measure import MEASURED_RUN
    from speedkit.tasks import resolve_task

    # A request's target is a value of the task's own metric: a search towards another metric (eval/loss on a
    # task that targets accuracy) is stopped at its target by the TrialReporter instead.
    on_task_metric = context.metric == resolve_task(context.run.task).target_metric
    target = {"target": context.target, "stop_at_target": True} if on_task_metric else {}
    return context.run.replace(**target, **MEASURED_RUN)


def train_trial(context: TrialContext) -> RunRecord:
    """The default runner: the trial's request, fitted (``speedkit.experiments.measure.fit``) with the reporter."""
    from speedkit.experiments.measure import fit

    request = trial_request(context)
    reporter = TrialReporter(context, stop_at_target=not request.stop_at_target)
    return fit(request.replace(callbacks=[reporter]), on_built=reporter.attach)


Runner = Callable[[TrialContext], RunRecord]


def train_and_store(trial, context: TrialContext, runner: Runner) -> RunRecord | None:
    """Train ``context``'s run (a search trial or a confirmation run, both trials of their study) and store what it
    measured on ``trial``; None where the user stopped it, which is no measurement (it runs again when the search
    continues). An error of the run is raised, with the trial's wall time stored."""
    started = time.perf_counter()
    try:
        record = runner(context)
    except Exception:
        trial.set_user_attr("wall_s", round(time.perf_counter() - started, 3))
        raise
    if context.stop_reason == USER_STOP:
        return None
    trial.set_user_attr("record", str(record.path))
    trial.set_user_attr("time_to_target_s", record.time_to(context.metric, context.target))
    # how the baseline plan ranks its runs (speedkit.experiments.baseline_plan): batches do not depend on the machine
    trial.set_user_attr("batches_to_target", record.time_to(context.metric, context.target, x="batch"))
    trial.set_user_attr("final", record.best(context.metric))
    trial.set_user_attr("train_s", record.timings.get("train_s"))
    trial.set_user_attr("wall_s", round(time.perf_counter() - started, 3))
    trial.set_user_attr("budget_done", context.budget_done)
    trial.set_user_attr("stop_reason", context.stop_reason)
    return record


def resolve_runner(runner: Runner | str | None) -> Runner:
    """A runner callable from itself, ``"module:function"`` (what worker processes import), or the default."""
    if runner is None:
        return train_trial
    if callable(runner):
        return runner
    import importlib

    module, _, name = str(runner).partition(":")
    if not name:
        raise ValueError(f"runner must be a callable or 'module:function', got {runner!r}")
    return getattr(importlib.import_module(module), name)


def runner_path(runner: Runner | str | None) -> str | None:
    """``"module:function"`` for a runner, so other processes can import the same one."""
    if runner is None or isinstance(runner, str):
        return runner
    module, name = getattr(runner, "__module__", None), getattr(runner, "__qualname__", "")
    if not module or "<" in name or "." in name:
        return None  # a lambda or a nested function: usable in this process only
    return f"{module}:{name}"
