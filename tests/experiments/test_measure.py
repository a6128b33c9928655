"""The one measuring core: interleaved runs paired by seed into ratios, and the one budget search."""
from __future__ import annotations

from types import SimpleNamespace

from speedkit.experiments.measure import measure, shortest_budget

TIMES = {("baseline", 0): 10.0, ("hot", 0): 4.0, ("baseline", 1): 12.0, ("hot", 1): None, ("baseline", 2): 9.0,
         ("hot", 2): 3.0}


def fake_run(order):
    def run(name, seed):
        order.append((name, seed))
        return SimpleNamespace(name=name, time_to_target=TIMES[(name, seed)])
    return run


def test_measure_runs_baselines_then_recipes_seed_by_seed_and_pairs_their_times():
    order = []
    seen = []
    result = measure(["baseline", "hot"], ["baseline"], [0, 1, 2], fake_run(order), on_run=seen.append)
    assert order == [("baseline", 0), ("hot", 0), ("baseline", 1), ("hot", 1), ("baseline", 2), ("hot", 2)]
    assert result.recipes == ("hot",) and result.baselines == ("baseline",)  # a baseline is never its own recipe
    assert result.times["hot"] == [4.0, None, 3.0]
    assert result.ratios("hot") == [2.5, None, 3.0]  # a seed where one side missed the target has no ratio
    assert result.median_ratio("hot") == 2.75
    assert [run.name for run in result.runs["hot"]] == ["hot"] * 3
    assert len(seen) == 6


def test_keep_going_decides_before_each_further_seed_and_skipped_runs_have_no_time():
    order = []
    result = measure(["hot"], ["baseline"], [0, 1, 2], fake_run(order), keep_going=lambda m: len(m.seeds) < 2)
    assert result.seeds == [0, 1] and len(order) == 4
    skipped = measure(["hot"], ["baseline"], [0], lambda name, seed: None)  # e.g. a confirmation run done before
    assert skipped.times == {"baseline": [None], "hot": [None]} and skipped.ratios("hot") == [None]


def test_shortest_budget_goes_down_while_it_holds_and_up_while_it_does_not():
    tried = []

    def reaches_from(least):
        def all_reach(steps):
            tried.append(steps)
            return steps >= least
        return all_reach

    assert shortest_budget(reaches_from(3), start=5, most=10) == 3 and tried == [5, 4, 3, 2]
    tried.clear()
    assert shortest_budget(reaches_from(7), start=5, most=10) == 7 and tried == [5, 6, 7]
    assert shortest_budget(reaches_from(11), start=5, most=10) is None
    tried.clear()
    assert shortest_budget(reaches_from(1), start=0, most=2, down=False) == 1 and tried == [0, 1]  # tune's: up only


def test_a_measurement_read_back_from_stored_runs_is_ranked_and_paired_by_the_one_rule():
    """The benchmark's summary and the search's confirmation both judge through Measurement: the strongest
    baseline by compare.time_rank (equal medians: the better final), a recipe that missed a seed never first."""
    from speedkit.experiments.measure import Measurement

    measured = Measurement.read_back(
        {"baseline": [10.0, 12.0], "plain": [12.0, 10.0], "hot": [4.0, None], "mild": [5.0, 6.0]},
        {"baseline": [0.92, 0.92], "plain": [0.94, 0.94], "hot": [0.95, 0.5], "mild": [0.93, 0.93]},
        ["baseline", "plain"], [0, 1])
    assert measured.recipes == ("hot", "mild") and measured.seeds == [0, 1]
    assert measured.strongest_baseline("eval/accuracy") == "plain"
    assert measured.fastest(measured.recipes, "eval/accuracy") == "mild" and measured.fastest([]) is None
    assert measured.ratios("mild", "plain") == [12.0 / 5.0, 10.0 / 6.0]
