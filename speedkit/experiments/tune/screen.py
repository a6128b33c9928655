"""The screen: the search's first, cheap look at its candidates, on a fraction of the training data (opt-in).

What the search ranks by is time to the target on all the data, and each such trial costs a training run.
On a third of the data a run costs about a third, so the screen runs the starting points (the task's
presets) and moves from the best of them at that price; only its best few (``TuneConfig.promote``) are
trained on all the data, where the search goes on with moves from the best (Hyperband's idea: cheap
fidelities first, survivors promoted).

It is off unless asked for (``screen_fraction``), because what it measured on held-out glyphs says it
ranks budgets wrongly there: a budget in epochs over a third of the data is a third of the steps, so the
presets that save most of their budget fall furthest. On all the data the rebuilt ``hot``, ``medium`` and
``mild`` reached the task's 90%; on a third of it they ended at 66%, 74% and 57% against a screen target
of 86% that the base reached, so a screen would have promoted none of them. It fits a search whose
candidates share one budget and differ in methods.

A model trained on less data ends lower, so the full target means nothing there. The screen's target is
the base recipe's own result on the screen's data, moved as far as the search's target is from the base's
result on all the data (target x screen best / full best): a search for the base's own final accuracy
screens for the base's own final accuracy on the fraction. So the screen's first trial is the base recipe
on the fraction, run without a target of its own; the screen's other trials wait for it.
"""
from __future__ import annotations

import time

from speedkit.experiments.tune.storage import finished_trials

BASE_START = "baseline"  # start_from of the base recipe's own trial, in the baseline study and in the screen
POLL_S = 1.0  # how often a worker looks again for the screen's target while another worker measures it


def screen_target(study) -> float | None:
    """The screen's target, once its base trial has set it."""
    value = study.user_attrs.get("target")
    return None if value is None else float(value)


def full_base_best(config, studies) -> float | None:
    """The base recipe's best value of the target metric on all the data (the baseline study's first trial)."""
    for trial in finished_trials(studies["baseline"], ("COMPLETE",)):
        if trial.user_attrs.get("start_from") == BASE_START:
            return trial.user_attrs.get("final")
    return None


def set_screen_target(config, studies, screen_best: float | None) -> float | None:
    """Fix the screen's target from the base's best on the fraction (``screen_best``) and on all the data."""
    full_best = full_base_best(config, studies)
    if screen_best is None or not full_best:
        return None
    target = float(screen_best) * config.target / full_best
    studies["screen"].set_user_attr("target", target)
    studies["screen"].set_user_attr("target_from", {"screen_best": screen_best, "full_best": full_best})
    return target


def base_trial(study):
    """The screen's base trial (the base recipe on the fraction), or None before it was queued."""
    return next((t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("start_from") == BASE_START), None)


def screen_state(config, studies) -> str:
    """"off", "ready" (a trial may start: the target is known, or the base is queued for this worker to take),
    "wait" (another worker is measuring the base) or "failed" (the base ended without a target: no screen)."""
    if config.screen_fraction is None:
        return "off"
    study = studies["screen"]
    if screen_target(study) is not None:
        return "ready"
    if study.user_attrs.get("no_base"):
        return "failed"
    base = base_trial(study)
    if base is None or base.state.name == "WAITING":
        return "ready" if full_base_best(config, studies) is not None else "wait"
    return "wait" if base.state.name == "RUNNING" else "failed"


def wait_for_screen(config, studies, should_stop=None) -> str:
    """``screen_state``, after waiting while another worker measures the screen's base (or the full base)."""
    state = screen_state(config, studies)
    while state == "wait" and config.spent_s() < config.budget_s and not (should_stop and should_stop()):
        if not _full_base_pending(studies):
            return "failed"  # no full base will ever finish: nothing to scale the screen's target by
        time.sleep(POLL_S)
        state = screen_state(config, studies)
    return state


def _full_base_pending(studies) -> bool:
    """Whether the base's run on all the data has finished or may still finish."""
    for trial in studies["baseline"].get_trials(deepcopy=False):
        if trial.user_attrs.get("start_from") == BASE_START:
            return trial.state.name in ("COMPLETE", "RUNNING", "WAITING")
    return True


def screen_seconds(studies) -> float:
    """Wall clock the screen's finished trials took."""
    return sum(t.user_attrs.get("wall_s") or 0.0 for t in finished_trials(studies["screen"]))


def screen_summary(config, studies) -> dict:
    """What the report says of the screen: its data, its target and where that came from, its trials, and
    how each promoted recipe did on all the data beside its time in the screen (did the screen rank well?)."""
    if config.screen_fraction is None:
        return {"fraction": None}
    study = studies["screen"]
    by_number = {t.number: t for t in finished_trials(study)}
    survivors = []
    for trial in finished_trials(studies["search"]):
        origin = str(trial.user_attrs.get("start_from") or "")
        if origin.startswith("screen #") and int(origin[8:]) in by_number:
            screened = by_number[int(origin[8:])]
            survivors.append({"screen_trial": screened.number, "search_trial": trial.number,
                              "screen_s": screened.user_attrs.get("time_to_target_s"),
                              "full_s": trial.user_attrs.get("time_to_target_s"),
                              "change": trial.user_attrs.get("change")})
    return {"fraction": config.screen_fraction, "target": screen_target(study),
            "target_from": study.user_attrs.get("target_from"), "trials": len(by_number),
            "seconds": round(screen_seconds(studies), 1), "promoted": survivors}
