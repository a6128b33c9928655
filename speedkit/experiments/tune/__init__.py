"""``speedkit.experiments.tune``: a measured search (Optuna) for the fastest recipe on a task:
``tune(TuneSettings(task, target, budget, searched_methods=...))``. What it searches, confirms and writes is in
docs/guide.md ("Tune: search for the fastest recipe"). Needs the optional extra: ``pip install 'torch-speedkit[tune]'``.
"""
from speedkit.experiments.tune.api import TuneResult, tune
from speedkit.experiments.tune.objective import TrialContext, TrialReporter, penalized, score_record, train_trial
from speedkit.experiments.tune.search import TuneConfig, TuneSettings, parse_budget
from speedkit.experiments.tune.space import SearchSpace, TuneInputError

__all__ = ["SearchSpace", "TrialContext", "TrialReporter", "TuneConfig", "TuneInputError", "TuneResult", "TuneSettings",
           "parse_budget", "penalized", "score_record", "train_trial", "tune"]
