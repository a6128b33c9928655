"""The time-to-accuracy benchmark: baseline and recipes interleaved by seed, summarised as data.

``run_benchmark("vision")`` runs every recipe of the task's profile, merges its entry into
``bench/results/summary.json`` and writes ``summary.md`` and figures beside it. The protocol is
in bench/README.md; ``speedkit bench --task fashion-mnist`` is the same from the command line.
"""
from speedkit.callbacks.phase_timer import PhaseTimer, profile_steps  # where a run's time goes, by phase
from speedkit.experiments.bench.harness import (BenchResult, resolve_profile, run_benchmark, run_interleaved,
                                                run_leave_one_out, run_one, scheduled_recipe, summarize)
from speedkit.experiments.bench.profiles import PROFILES, TASK_KEYS, BenchProfile, get_profile, task_key
from speedkit.experiments.report import (merge_summary, metric_curves_figure, speedup_figure, summary_markdown,
                                         write_reports)
from speedkit.experiments.summary import pick_best

__all__ = ["BenchProfile", "BenchResult", "PROFILES", "PhaseTimer", "TASK_KEYS", "get_profile",
           "merge_summary", "metric_curves_figure", "pick_best", "profile_steps", "resolve_profile",
           "run_benchmark", "run_interleaved", "run_leave_one_out", "run_one", "scheduled_recipe", "speedup_figure",
           "summarize", "summary_markdown", "task_key", "write_reports"]
