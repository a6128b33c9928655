"""The quickstart's ratio line (what the notebook and ``speedkit demo`` print), read from the ``Measurement`` the one
measuring core returns; no training: the runs are records made here."""
from __future__ import annotations

import pytest

from speedkit.experiments.measure import Measurement, measure
from speedkit.record.runs import RunRecord
from speedkit.ui.notebook_helpers import speedup_summary

TIMES = {"baseline": [10.0, 12.0, 9.0], "hot": [4.0, 4.0, 4.5]}  # seconds to the target, pair by pair


def _run(name: str, recipe: str, reached_at: float | None) -> RunRecord:
    """A run's record that first reached the target at ``reached_at`` training seconds (None: never)."""
    record = RunRecord(name=name, status="target_reached", target={"metric": "eval/accuracy", "value": 0.8},
                       config={"recipe": recipe, "max_duration": "2ep"})
    record.add_eval({"batch": 1, "wall_s": 1.0}, {"eval/accuracy": 0.5})
    if reached_at is not None:
        record.add_eval({"batch": 2, "wall_s": reached_at}, {"eval/accuracy": 0.85})
    return record


def _pairs(seeds, times=TIMES) -> Measurement:
    return measure(["hot"], ["baseline"], seeds, lambda name, pair: _run(f"{name}-{pair}", name, times[name][pair]))


def test_the_summary_reads_the_ratios_of_the_measurement_and_the_demo_reads_the_same_back():
    pairs = _pairs(range(3))
    ratio, line = speedup_summary(pairs)
    assert pairs.ratios("hot") == [2.5, 3.0, 2.0] and ratio == 2.5
    assert line == ("hot reached eval/accuracy 0.8 2.50x sooner than the baseline (budgets baseline 2ep and hot 2ep, "
                    "each stopped at the target; training seconds, evaluation excluded): median of 3 interleaved "
                    "pairs, spread 2.00x to 3.00x (2.50x, 3.00x, 2.00x)")
    # the demo loads the quickstart's records from its run folder: the same Measurement, the same line
    again = Measurement.of_runs({"baseline": pairs.runs["baseline"], "hot": pairs.runs["hot"]}, ["baseline"])
    assert again.times == pairs.times and again.seeds == [0, 1, 2] and speedup_summary(again) == (ratio, line)


def test_one_pair_says_it_has_no_spread_and_a_run_that_missed_the_target_is_named():
    assert speedup_summary(_pairs([0]))[1].endswith(
        "from one pair of runs (one pair has no spread, and on a busy machine it can be far off)")
    missed = _pairs([0], {"baseline": [10.0], "hot": [None]})
    with pytest.raises(ValueError, match="hot-0 never reached the target.*lower target or raise duration"):
        speedup_summary(missed)
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        speedup_summary(_pairs([]))
