"""``speedkit.experiments.tune``: a measured search (Optuna) for the fastest recipe on a task.

``tune(TuneSettings(task, target, budget, methods=...))`` tunes the baseline's learning rate and budget, searches
methods (on/off and their card's hyperparameters) and recipe fields against time to target, confirms
the winner and runner-up on fresh seeds beside the tuned baseline and the base as given (the speed-up
is over the faster of the two), and writes ``recipe.yaml``
(loadable by ``speedkit train --recipe``), ``report.md``, ``report.html`` and ``summary.json``.
Needs the optional extra: ``pip install 'torch-speedkit[tune]'``.
"""
from speedkit.experiments.tune.api import TuneResult, TuneSettings, tune
from speedkit.experiments.tune.objective import TrialContext, TrialReporter, penalized, score_record, train_trial
from speedkit.experiments.tune.search import TuneConfig, parse_budget
from speedkit.experiments.tune.space import SearchSpace, TuneInputError

__all__ = ["SearchSpace", "TrialContext", "TrialReporter", "TuneConfig", "TuneInputError", "TuneResult", "TuneSettings",
           "parse_budget", "penalized", "score_record", "train_trial", "tune"]
