"""One leave-one-out: the benchmark and the search plan their ablations with speedkit.experiments.ablation,
so the same recipe left one part out at a time gives the same runs in both."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from speedkit.experiments import ablation
from speedkit.experiments.bench import harness
from speedkit.experiments.summary import seed_of
from speedkit.experiments.tune import confirm
from speedkit.record.runs import RunRecord
from speedkit.tasks import get_recipe

# precision given as it runs here: the benchmark compares "auto" as what it resolves to on the device
WINNER = get_recipe("fashion-mnist", "hot").with_changes(name="tune-winner", precision="fp32")


def _reached(name: str, recipe: str, seed: int, at: float | None) -> RunRecord:
    """A run of ``recipe`` on ``seed`` that reached accuracy 0.9 at ``at`` seconds (None: never)."""
    run = RunRecord(name=name, target={"metric": "eval/accuracy", "value": 0.9},
                    config={"recipe": recipe, "seed": seed})
    run.add_eval({"batch": 1, "wall_s": at or 9.0}, {"eval/accuracy": 0.5 if at is None else 0.95})
    return run


def _bench_ablations(monkeypatch, recipe, reference, records=None) -> dict[str, tuple]:
    """{part: (recipe, config["ablation"], seed)} of the benchmark's leave-one-out of ``recipe`` against
    ``reference``, among the main runs ``records`` (default: one run of ``recipe``, on seed 0)."""
    ran = {}

    def fake_run_one(profile, run_recipe, seed, run_name, run_dir, bench_info, extra_config=None, **kwargs):
        marker = extra_config["ablation"]
        ran[marker["left_out"]] = (run_recipe, marker, seed)
        return RunRecord(name=run_name, config={"recipe": run_recipe.name, "ablation": marker})

    monkeypatch.setattr(harness, "run_one", fake_run_one)
    monkeypatch.setattr(harness, "scheduled_recipe", lambda profile, name: recipe if name == recipe.name else reference)
    records = records or [RunRecord(name="full", config={"recipe": recipe.name, "seed": 0})]
    profile = harness.get_profile("vision").replace(device="cpu")
    harness.run_leave_one_out(profile, records, recipe.name, "unused", "session", log=lambda line: None,
                              baseline=reference.name)
    taken_apart = {record.run_id: seed_of(record) for record in records}
    assert all(taken_apart.get(marker["of_run"]) == seed for _, marker, seed in ran.values())
    return ran


def _tune_ablations(monkeypatch, recipe, reference, seeds=(1,), winner_times=(4.0,),
                    baseline_times=(8.0,)) -> dict[str, tuple]:
    """{part: (recipe, config["ablation"], seed)} of the search's leave-one-out of its confirmed winner ``recipe``
    against its strongest confirmed baseline ``reference``, confirmed on ``seeds`` with those times to target."""
    ran = {}
    confirmation = {"seeds": list(seeds), "best_recipe": "search:7", "strongest_baseline": "baseline:3",
                    "recipes": {"search:7": {"recipe": recipe.to_dict(), "time_to_target_s": list(winner_times)}},
                    "baselines": {"baseline:3": {"recipe": reference.to_dict(),
                                                 "time_to_target_s": list(baseline_times)}}}
    monkeypatch.setattr(confirm, "summarize_confirmation", lambda config, study: confirmation)
    # the winner's confirmation runs, one a seed; no ablation ran yet
    winner_runs = {("search:7", seed): RunRecord(name=f"full-s{seed}") for seed in seeds}
    monkeypatch.setattr(confirm, "_confirmed", lambda config, study, candidates=None:
                        winner_runs if candidates is None or "search:7" in candidates else {})
    monkeypatch.setattr(confirm, "run_name_for", lambda config, key, seed: "full")

    def fake_confirm_run(config, study, runner, role, key, seed, run_recipe, should_stop, log=print, ablation=None):
        ran[ablation["left_out"]] = (run_recipe, ablation, seed)

    monkeypatch.setattr(confirm, "_confirm_run", fake_confirm_run)
    config = SimpleNamespace(settings=SimpleNamespace(run=SimpleNamespace(device="cpu")))
    confirm.run_leave_one_out(config=config, study=None, runner=lambda context: None)
    assert all(marker["of_run"] == winner_runs["search:7", seed].run_id for _, marker, seed in ran.values())
    return ran


def test_bench_and_tune_leave_out_the_same_parts_as_the_same_runs(monkeypatch):
    """Against the same baseline, the benchmark and the search leave the same parts out of a recipe, as the same
    runs marked alike: each method the baseline lacks, and each other part (budget, precision ...) where the two
    differ, given the baseline's value."""
    reference = get_recipe("fashion-mnist", "plain-bf16")
    bench = _bench_ablations(monkeypatch, WINNER, reference)
    tune = _tune_ablations(monkeypatch, WINNER, reference)
    assert list(bench) == list(tune)
    assert set(WINNER.methods) - set(reference.methods) < set(bench) and {"budget", "precision"} < set(bench)
    for part in bench:
        bench_recipe, bench_marker, _ = bench[part]
        tune_recipe, tune_marker, _ = tune[part]
        assert {**bench_recipe.to_dict(), "name": None} == {**tune_recipe.to_dict(), "name": None}
        # each names its own full run by id as well
        assert {**bench_marker, "of_run": None} == {**tune_marker, "of_run": None} == {
            "of": "full", "left_out": part, "against": "plain-bf16", "of_run": None}


def test_a_leave_one_out_runs_on_the_first_seed_where_the_recipe_and_its_baseline_both_reached_the_target(
        monkeypatch):
    """Each part's share is of the recipe's speed-up over the baseline on the leave-one-out's seed: on a seed where
    that baseline missed the target there is no speed-up to split, so the benchmark and the search take the recipe
    apart on the first seed where both reached it (where none did, the first where the recipe did)."""
    assert ablation.seed_to_ablate([0, 1, 2], [3.0, 4.0, 5.0], [None, 8.0, 9.0]) == 1
    assert ablation.seed_to_ablate([0, 1, 2], [3.0, None, 5.0], [None, 8.0, 9.0]) == 2
    assert ablation.seed_to_ablate([0, 1], [None, 4.0], [8.0, None]) == 1
    assert ablation.seed_to_ablate([0, 1], [None, None], [None, None]) == 0
    reference = get_recipe("fashion-mnist", "plain-bf16")
    records = [_reached("hot-s0", WINNER.name, 0, 3.0), _reached("plain-s0", reference.name, 0, None),
               _reached("hot-s1", WINNER.name, 1, 4.0), _reached("plain-s1", reference.name, 1, 8.0)]
    bench = _bench_ablations(monkeypatch, WINNER, reference, records)
    tune = _tune_ablations(monkeypatch, WINNER, reference, seeds=(1, 2), winner_times=(3.0, 4.0),
                           baseline_times=(None, 8.0))
    assert {seed for _, _, seed in bench.values()} == {1} and {seed for _, _, seed in tune.values()} == {2}
    assert {marker["of"] for _, marker, _ in bench.values()} == {"hot-s1"}


def test_against_a_baseline_the_non_method_parts_are_left_out_too():
    plain_bf16 = get_recipe("fashion-mnist", "plain-bf16")
    ablated = ablation.ablated_recipes(WINNER, plain_bf16)
    assert "channels_last" not in ablated  # the baseline has it too, as it is
    assert ablated["budget"].duration == plain_bf16.duration
    assert ablated["augment"].augment == plain_bf16.augment  # None stays None (with_changes would skip it)


def test_bench_and_tune_summarise_leave_one_out_as_one_table_and_the_search_stores_never_reached_as_null():
    """Both leave-one-out tables are ablation.leave_one_out_summary's, with compare.slowdown's ratio; a method
    without which the winner never reached the target is infinity in the run board's table and null in the
    search's summary (as its JSON), and the benchmark's report renders the search's table too."""
    import math
    from types import SimpleNamespace

    from speedkit.experiments.bench.harness import summarize_leave_one_out
    from speedkit.experiments.report import leave_one_out_markdown
    from speedkit.experiments.compare import leave_one_out

    def record(name, reached_at, **config):
        run = RunRecord(name=name, target={"metric": "eval/accuracy", "value": 0.9}, config={"recipe": "hot", **config})
        run.add_eval({"batch": 1, "wall_s": 1.0}, {"eval/accuracy": 0.5})
        if reached_at is not None:
            run.add_eval({"batch": 2, "wall_s": reached_at}, {"eval/accuracy": 0.95})
        return run

    marked = {"of": "full", "against": "plain-bf16"}
    full, ablations = record("full", 4.0), [record("no-ls", 6.0, ablation={**marked, "left_out": "label_smoothing"}),
                                            record("no-ema", None, ablation={**marked, "left_out": "ema"})]
    board = leave_one_out([full, *ablations])["full"]
    bench = summarize_leave_one_out([full], ablations)
    # the search's confirmation runs, as confirm.confirmed_runs finds them: by (candidate, seed)
    runs = {("loo:search:3:label_smoothing", 1): ablations[0], ("loo:search:3:ema", 1): ablations[1],
            ("loo:search:3:ema", 2): record("other-seed", 1.0)}
    confirmation = {"seeds": [1], "strongest_baseline": "baseline:0",
                    "baselines": {"baseline:0": {"time_to_target_s": [8.0], "recipe": {"name": "plain-bf16"}}},
                    "recipes": {"search:3": {"time_to_target_s": [4.0], "final_metric": [0.95],
                                             "recipe": {"name": "tune-winner"}}}}
    config = SimpleNamespace(settings=SimpleNamespace(study_name="tune"), metric="eval/accuracy", target=0.9)
    tune = confirm.summarize_leave_one_out(config, "search:3", confirmation, runs)
    assert board["label_smoothing"]["slowdown"] == bench["parts"]["label_smoothing"]["slowdown"] == 1.5
    assert tune["parts"]["label_smoothing"]["slowdown"] == 1.5
    assert tune["parts"]["label_smoothing"]["share"] == math.log(1.5) / math.log(8.0 / 4.0)  # of 2x over the baseline
    assert math.isinf(board["ema"]["slowdown"]) and tune["parts"]["ema"]["slowdown"] is None
    assert set(tune) == set(bench) and set(tune["parts"]["ema"]) == set(bench["parts"]["ema"])
    assert tune["not_reached_without"] == bench["not_reached_without"] == ["ema"]
    assert tune["against"] == bench["against"] == "plain-bf16" and tune["of"] == "tune-confirm-search-3-s1"
    text = "\n".join(leave_one_out_markdown(tune))
    assert "each row gives one part the baseline's value against plain-bf16" in text
    assert "| ema | not reached |" in text


def test_a_leave_one_out_splits_the_speed_up_over_its_baseline_on_its_own_seed():
    """The benchmark's table and the run board's split the full run's speed-up over the baseline the parts came
    from on the seed the leave-one-out ran, paired as every speed-up (and as the search's table does), not over
    that baseline's median, which on a slow seed would credit the parts with another seed's luck."""
    import math

    from speedkit.experiments.bench.harness import summarize_leave_one_out
    from speedkit.experiments.compare import leave_one_out

    def run(name, recipe, seed, reached_at, **config):
        record = RunRecord(name=name, target={"metric": "eval/accuracy", "value": 0.9},
                           config={"task": "fashion-mnist", "recipe": recipe, "seed": seed, **config})
        record.add_eval({"batch": 2, "wall_s": reached_at}, {"eval/accuracy": 0.95})
        return record

    baselines = [run(f"plain-s{seed}", "plain-bf16", seed, at) for seed, at in ((0, 8.0), (1, 20.0), (2, 30.0))]
    full = run("hot-s0", "hot", 0, 4.0)
    without = run("hot-s0-without-ls", "hot", 0, 6.0,
                  ablation={"of": "hot-s0", "left_out": "label_smoothing", "against": "plain-bf16"})
    on_seed_0 = math.log(6.0 / 4.0) / math.log(8.0 / 4.0)  # of the 2x over plain-bf16 on seed 0, not the 5x median
    bench = summarize_leave_one_out([*baselines, full], [without])
    assert bench["parts"]["label_smoothing"]["share"] == pytest.approx(on_seed_0)
    assert leave_one_out([*baselines, full, without])["hot-s0"]["label_smoothing"]["share"] \
        == pytest.approx(on_seed_0)
