"""The explorer without a browser: widgets set from Python, buttons clicked, runs on real data.

Runs use a small slice of Fashion-MNIST so each takes a few seconds on one thread.
"""
from __future__ import annotations

import ast
import json
import time

import pytest
from prerequisites import import_or_missing  # noqa: E402

import_or_missing("ipywidgets")

import plotly.graph_objects as go  # noqa: E402
from helpers import needs_fmnist  # noqa: E402

from speedkit.core.method import IncompatibleMethodsError, check_compatibility  # noqa: E402
from speedkit.experiments.compare import compare_table, leave_one_out, paired_speedups, pareto_front  # noqa: E402
from speedkit.methods import build_methods  # noqa: E402
from speedkit.record.runs import RunRecord  # noqa: E402
from speedkit.tasks import TASKS, Recipe  # noqa: E402
from speedkit.ui import plots  # noqa: E402
from speedkit.ui.board import RunBoard  # noqa: E402
from speedkit.tasks import RunRequest  # noqa: E402
from speedkit.ui.config import (explorer_request, is_custom, request_code, request_problems,  # noqa: E402
                                run_recipe)
from speedkit.ui.explorer import MethodExplorer  # noqa: E402
from speedkit.ui.live import BackgroundRun  # noqa: E402

SMALL = dict(data_fraction=0.03, eval_fraction=0.05, device="cpu")


@pytest.fixture
def explorer(tmp_path):
    return MethodExplorer(run_dir=tmp_path / "runs", duration="12ba", update_interval=0.05, **SMALL)


def _points(figure, run_id) -> int:
    return sum(len(t.x or ()) for t in figure.data if t.legendgroup == run_id)


# -- the controls describe the configuration ------------------------------------------------
def test_presets_set_the_grid_and_any_change_marks_it_custom(explorer):
    explorer.preset.value = "hot"
    hot = TASKS["fashion-mnist"].recipes["hot"]
    assert set(explorer.request.methods) == set(hot.methods)
    assert explorer.rows["muon"].checkbox.value and not explorer.rows["mixup"].checkbox.value
    assert explorer.duration.value == hot.duration and explorer.preset.value == "hot"
    assert explorer.request.methods["muon"] == {"lr": 0.04}  # only values off the card default
    assert explorer.request.methods["label_smoothing"] == {}  # hot's 0.1 is the card's default

    explorer.set_param("label_smoothing", "smoothing", 0.3)
    assert explorer.preset.value == "custom"
    assert explorer.request.methods["label_smoothing"] == {"smoothing": 0.3} and is_custom(explorer.request)
    explorer.preset.value = "baseline"
    assert explorer.request.methods == {} and not is_custom(explorer.request)


def test_controls_come_from_the_cards(explorer):
    row = explorer.rows["mixup"]
    alpha = row.card.hparam("alpha")
    control = row.controls["alpha"]
    assert (control.min, control.max) == (alpha.low, alpha.high)
    assert isinstance(explorer.rows["swa"].controls["swa_start"], type(control))
    with pytest.raises(ValueError, match="outside its range"):
        explorer.set_param("mixup", "alpha", alpha.high * 10)


def test_conflicts_show_the_engines_own_message(explorer):
    explorer.toggle("cutmix")
    explorer.toggle("mixup")
    with pytest.raises(IncompatibleMethodsError) as engine:
        check_compatibility(build_methods(["cutmix", "mixup"]))
    assert str(engine.value) in explorer.conflicts.value.replace("&#x27;", "'")
    assert explorer.run_button.disabled
    assert explorer.run() is None and "cannot run" in explorer.status.value
    explorer.toggle("mixup", False)
    assert explorer.conflicts.value == "" and not explorer.run_button.disabled


def test_methods_for_another_domain_are_disabled_with_the_reason(explorer):
    explorer.task.value = "pydocs"
    row = explorer.rows["blurpool"]
    assert row.checkbox.disabled and "for vision models" in row.badges.value
    assert not explorer.rows["rotary_embeddings"].checkbox.disabled
    assert explorer.model.options == ("gpt-nano", "gpt-micro", "gpt-mini", "gpt-small",
                                      "hf:gpt2-nano", "hf:gpt2-micro", "hf:gpt2-mini", "hf:gpt2-small")
    assert explorer.request.target == TASKS["pydocs"].target_value == 3.30
    with pytest.raises(ValueError, match="cannot be used here"):
        explorer.toggle("blurpool")


def test_a_bad_duration_is_reported_not_run(explorer):
    explorer.duration.value = "3 parsecs"
    assert "duration" in explorer.conflicts.value and explorer.run_button.disabled


# -- running ---------------------------------------------------------------------------------
@needs_fmnist
def test_run_button_trains_off_thread_and_updates_plot_and_board(explorer):
    explorer.toggle("label_smoothing", False)
    explorer.run_button.click()
    run = explorer.current
    assert run is not None and explorer.stop_button.disabled is False
    record = explorer.wait(timeout=120)
    assert record.status == "completed" and record.steps and record.evals
    assert _points(explorer.figure, record.run_id) > 0
    assert [r.run_id for r in explorer.board.records] == [record.run_id]
    assert record.name in explorer.board.table_html()
    assert not explorer.run_button.disabled and explorer.stop_button.disabled
    assert "completed" in explorer.status.value
    assert json.loads((explorer.run_dir / record.name / "record.json").read_text())["status"] == "completed"


@needs_fmnist
def test_stop_during_a_run_keeps_a_complete_record_and_checkpoint(explorer):
    explorer.duration.value = "5000ba"
    explorer.run()
    deadline = time.time() + 120
    while explorer.current.trainer.state.timestamp.batch < 3:
        assert time.time() < deadline and explorer.running
        time.sleep(0.05)
    explorer.stop_button.click()
    record = explorer.wait(timeout=120)
    assert record.status == "stopped" and record.stop_reason == "stopped from the explorer"
    on_disk = RunRecord.load(explorer.run_dir / record.name)
    assert on_disk.status == "stopped" and on_disk.evals and 3 <= on_disk.evals[-1]["batch"] < 5000
    assert (explorer.run_dir / record.name / "checkpoints" / "latest.ckpt").exists()


@needs_fmnist
def test_copy_as_code_produces_code_and_a_recipe_file_that_run(explorer, tmp_path, monkeypatch):
    explorer.set_param("label_smoothing", "smoothing", 0.2)
    explorer.code_button.click()
    code, recipe_yaml = explorer.code.value, explorer.recipe_file.value
    assert "smoothing': 0.2" in code and explorer.code_tabs.layout.display == "flex"
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(code, "copied.py", "exec"), namespace)
    record = namespace["record"]
    assert record.status == "completed"
    assert {m["name"]: m["params"] for m in record.methods}["label_smoothing"]["smoothing"] == 0.2

    path = tmp_path / "mine.yaml"
    path.write_text(recipe_yaml)
    recipe = Recipe.from_file(path)
    assert recipe.methods["label_smoothing"] == {"smoothing": 0.2} and recipe.duration == "12ba"
    from speedkit.tasks import make_trainer

    trainer = make_trainer("fashion-mnist", str(path), run_dir=tmp_path / "from-file", **SMALL)
    assert [a.name for a in trainer.state.methods] == [a.name for a in build_methods(recipe.methods)]


def test_recipe_files_with_unknown_fields_are_refused(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\ntask: fashion-mnist\nspeed: ludicrous\n")
    with pytest.raises(ValueError, match=r"unknown fields \['speed'\]"):
        Recipe.from_file(path)


@needs_fmnist
def test_headless_run_all_uses_no_figure_widgets(tmp_path):
    explorer = MethodExplorer(run_dir=tmp_path, live=False, update_interval=0.05)
    records = explorer.run_all([{"recipe": "baseline"}, {"recipe": "mild", "methods": {"channels_last": {}}}],
                               duration="8ba", **SMALL)
    assert [r.config["recipe"] for r in records] == ["baseline", "mild-custom"]
    assert all(r.status == "completed" for r in records)
    assert not isinstance(explorer.figure, go.FigureWidget)
    curves, scatter = explorer.figures()[:2]
    drawn = {t.legendgroup for t in curves.data}
    assert drawn == {r.run_id for r in records}
    assert len(scatter.data[0].x) == 2
    with pytest.raises(ValueError, match="unknown configuration key"):
        explorer.run_all([{"recipe": "mild", "epochs": 3}])


# -- background runs ------------------------------------------------------------------------
class _FailingTrainer:
    run_name = "failing"

    def __init__(self):
        self.record = RunRecord(name="failing")

    def fit(self):
        raise RuntimeError("boom")

    def stop(self, reason):
        pass


def test_background_run_reraises_training_errors_and_survives_callback_errors():
    reports = []

    def broken_progress(run):
        reports.append(run)
        raise ValueError("a widget went away")

    run = BackgroundRun(_FailingTrainer(), on_progress=broken_progress, interval=0.01).start()
    with pytest.raises(RuntimeError, match="boom"):
        run.wait(timeout=10)
    assert reports and "a widget went away" in run.callback_errors[0]


# -- plots and board, from records ----------------------------------------------------------
def _record(name, recipe, times_metrics, run_id=None, **config):
    record = RunRecord(name=name, status="completed", target={"metric": "eval/accuracy", "value": 0.9},
                       config={"recipe": recipe, "task": "fashion-mnist", **config})
    if run_id:
        record.run_id = run_id
    for i, (t, m) in enumerate(times_metrics):
        record.add_eval({"batch": i, "sample": 100 * i, "wall_s": t}, {"eval/accuracy": m})
        record.add_step({"batch": i, "sample": 100 * i, "wall_s": t}, {"loss": 1.0 / (i + 1), "lr": 0.1})
    record.final_metrics = {"eval/accuracy": times_metrics[-1][1]}
    return record


def test_thin_keeps_few_points_and_the_last():
    xs = list(range(10_000))
    tx, ty = plots.thin(xs, xs, 400)
    assert len(tx) <= 400 and tx[-1] == 9_999 and tx[0] == 0 and tx == ty
    assert plots.thin([1, 2], [3, 4], 400) == ([1, 2], [3, 4])


def test_live_figure_updates_in_place():
    fig = go.FigureWidget(plots.empty_figure("eval/accuracy"))
    record = _record("r", "mild", [(1.0, 0.5)])
    plots.add_run(fig, record, "eval/accuracy")
    record.add_eval({"batch": 5, "sample": 500, "wall_s": 2.0}, {"eval/accuracy": 0.7})
    assert plots.update_run(fig, record, "eval/accuracy")
    metric_trace = next(t for t in fig.data if t.meta == f"{record.run_id}-1")
    assert list(metric_trace.y) == [0.5, 0.7]
    plots.remove_run(fig, record.run_id)
    assert not fig.data and not plots.update_run(fig, record, "eval/accuracy")


def test_board_speedups_pareto_and_clicks():
    baseline = _record("base", "baseline", [(10.0, 0.85), (20.0, 0.91)])
    fast = _record("fast", "hot", [(4.0, 0.905), (5.0, 0.92)])
    slow_good = _record("slow", "medium", [(8.0, 0.89), (15.0, 0.95)])
    never = _record("never", "mild", [(3.0, 0.7)])
    selected = []
    board = RunBoard([baseline, fast, slow_good, never], on_select=selected.append)
    rows = {r["name"]: r for r in board.rows()}
    assert rows["fast"]["speedup"] == pytest.approx(20.0 / 4.0)
    assert rows["never"]["speedup"] is None and rows["base"]["speedup"] == 1.0
    assert "not reached" in board.table_html()
    scatter = board.scatter_figure()
    frontier = scatter.data[1]
    assert list(frontier.x) == [4.0, 15.0]  # fast (quickest) and slow (best metric); baseline is dominated
    board.select(1)
    assert selected == [fast]


def test_the_board_times_every_run_at_the_baselines_target_whatever_target_a_run_was_made_with():
    """The explorer's target can change between runs, and a folder loaded onto the board holds runs made with
    others: a run made to 0.95 is timed at the baseline's 0.9 from its curve, so its speed-up is 20 / 4, not the
    baseline's time to 0.9 over its time to 0.95."""
    baseline = _record("base", "baseline", [(10.0, 0.85), (20.0, 0.91)])
    stricter = _record("strict", "hot", [(4.0, 0.905), (8.0, 0.96)])
    stricter.target = {"metric": "eval/accuracy", "value": 0.95}
    assert stricter.time_to_target == 8.0
    board = RunBoard([baseline, stricter])
    rows = {r["name"]: r for r in board.rows()}
    assert rows["strict"]["time_to_target_s"] == 4.0 and rows["strict"]["speedup"] == pytest.approx(5.0)
    assert list(board.scatter_figure().data[0].x) == [20.0, 4.0]
    assert "time to eval/accuracy 0.9<" in board.table_html()
    # a run that logs another metric is not timed at all, rather than at a level of its own
    other = RunRecord(name="lm", status="completed", target={"metric": "eval/loss", "value": 3.3},
                      config={"recipe": "hot", "task": "pydocs"})
    other.add_eval({"batch": 1, "wall_s": 1.0}, {"eval/loss": 3.0})
    assert other.time_to_target == 1.0 and compare_table([baseline, other])[1]["speedup"] is None


def test_the_board_gives_no_speed_up_over_a_baseline_made_under_other_settings_and_says_which():
    """The explorer's data fraction (or device) can change between runs: a sliver's time is not set beside the
    whole set's."""
    baseline = _record("base", "baseline", [(10.0, 0.85), (20.0, 0.91)], data_fraction=None)
    sliver = _record("sliver", "hot", [(1.0, 0.95)], data_fraction=0.1)
    same = _record("same", "hot", [(5.0, 0.95)], data_fraction=None)
    rows = compare_table([baseline, sliver, same])
    assert rows[1]["speedup"] is None and rows[1]["other_settings"] == ["data_fraction 0.1, the baseline's all"]
    assert rows[2]["speedup"] == pytest.approx(4.0) and rows[2]["other_settings"] == []
    assert "other settings: data_fraction 0.1, the baseline&#x27;s all" in RunBoard([baseline, sliver]).table_html()


def test_the_board_shows_its_tasks_runs_and_the_others_come_back_when_the_explorer_switches_back():
    baseline = _record("base", "baseline", [(20.0, 0.91)])
    fast = _record("fast", "hot", [(4.0, 0.91)])
    language = RunRecord(name="lm", status="completed", target={"metric": "eval/loss", "value": 3.3},
                         config={"recipe": "hot", "task": "pydocs"})
    language.add_eval({"batch": 1, "wall_s": 1.0}, {"eval/loss": 3.0})
    board = RunBoard([baseline, fast], task="fashion-mnist")
    board.task = "pydocs"
    board.add(language)
    assert [r["name"] for r in board.rows()] == ["lm"] and board.metric == "eval/loss"
    board.task = "fashion-mnist"
    assert [r["name"] for r in board.rows()] == ["base", "fast"] and board.rows()[1]["speedup"] == 5.0


def test_a_methods_measured_evidence_times_trials_of_searches_with_other_targets_at_one_target():
    from speedkit.ui.evidence import method_evidence

    def trial(name, methods, target, evals):
        record = _record(name, "trial", evals, tune={"phase": "search"})
        record.target = {"metric": "eval/accuracy", "value": target}
        record.methods = [{"name": m, "params": {}} for m in methods]
        return record

    with_ema = trial("a", ["ema"], 0.9, [(5.0, 0.91)])
    without = trial("b", [], 0.95, [(3.0, 0.91), (9.0, 0.96)])  # another search's, to 0.95: 9s there, 3s to 0.9
    evidence = method_evidence([with_ema, without], "ema", "fashion-mnist")
    assert evidence["with"]["median_time_s"] == 5.0 and evidence["without"]["median_time_s"] == 3.0
    # a search on a sliver of the data is not mixed with the latest one, on all of it
    sliver = trial("c", [], 0.9, [(0.5, 0.91)])
    sliver.config["data_fraction"], with_ema.config["data_fraction"], without.config["data_fraction"] = 0.1, None, None
    evidence = method_evidence([sliver, with_ema, without], "ema", "fashion-mnist")
    assert evidence["without"]["runs"] == 1 and evidence["without"]["median_time_s"] == 3.0


def test_a_leave_one_out_on_the_board_times_its_ablations_and_baseline_at_the_full_runs_target():
    """Ablations made later with another target (``speedkit bench --reuse --target ... --leave-one-out`` leaves the
    full run's record at its own) are timed at the full run's target, as is the baseline the shares split."""
    import math

    def made_to(name, recipe, evals, target, **config):
        record = _record(name, recipe, evals, **config)
        record.target = {"metric": "eval/accuracy", "value": target}
        return record

    baseline = made_to("base", "baseline", [(40.0, 0.91), (60.0, 0.96)], 0.95)
    full = made_to("full", "hot", [(10.0, 0.92)], 0.9)
    without = made_to("no-ls", "hot", [(15.0, 0.91), (30.0, 0.96)], 0.95,
                      ablation={"of": "full", "left_out": "label_smoothing", "against": "baseline"})
    part = leave_one_out([baseline, full, without])["full"]["label_smoothing"]
    assert part["slowdown"] == pytest.approx(1.5) and part["share"] == pytest.approx(math.log(1.5) / math.log(4.0))


def test_leave_one_out_shares_and_pairing():
    baseline = _record("base", "baseline", [(40.0, 0.92)])
    full = _record("full", "hot", [(10.0, 0.92)])
    without_a = _record("no-a", "hot", [(20.0, 0.92)], ablation={"of": "full", "left_out": "a"})
    without_b = _record("no-b", "hot", [(9.0, 0.92)], ablation={"of": "full", "left_out": "b"})
    without_c = _record("no-c", "hot", [(5.0, 0.5)], ablation={"of": "full", "left_out": "c"})
    table = leave_one_out([baseline, full, without_a, without_b, without_c])["full"]
    assert table["a"]["slowdown"] == pytest.approx(2.0) and table["a"]["share"] == pytest.approx(0.5)
    assert not table["b"]["pays_off"] and table["c"]["slowdown"] == float("inf")
    assert table["c"]["share"] is None and table["c"]["pays_off"]  # needed, but no made-up share
    assert RunBoard([baseline, full, without_a, without_b, without_c]).contribution_figure() is not None
    # with several baselines the shares split the speed-up over the one named, else over the fastest
    plain_bf16 = _record("bf16", "plain-bf16", [(20.0, 0.92)])
    records = [baseline, plain_bf16, full, without_a, without_b, without_c]
    assert leave_one_out(records)["full"]["a"]["share"] == pytest.approx(1.0)  # log 2 / log(20/10)
    assert leave_one_out(records, baseline="baseline")["full"]["a"]["share"] == pytest.approx(0.5)
    assert paired_speedups([10.0, None, 30.0], [5.0, 5.0, None]) == [2.0, None, None]
    with pytest.raises(ValueError, match="same seeds"):
        paired_speedups([1.0], [1.0, 2.0])
    assert pareto_front([(1.0, 0.5), (None, 0.99), (2.0, 0.4)]) == [0]
    assert compare_table([full], baseline=baseline)[0]["speedup"] == pytest.approx(4.0)


def test_a_configurations_problems_and_code():
    problems = " ".join(request_problems({"recipe": "mild", "methods": {"qk_norm": {}}, "model": "gpt-nano"}))
    assert "does not fit task" in problems and "for language models" in problems
    assert request_problems({"recipe": "mild"}) == [] and request_problems(RunRequest(recipe="mild")) == []
    assert "duration" in request_problems({"duration": "3 parsecs"})[0]  # the request's own check
    assert "does not set ['batch_size']" in request_problems(RunRequest(recipe="mild", batch_size=8))[0]
    code = request_code(RunRequest(recipe="hot", duration="1ep", seed=2))
    assert "make_trainer(" in code and "duration='1ep'" in code and "seed=2" in code
    call = ast.parse(code).body[1].value  # trainer = make_trainer(...)
    assert [ast.literal_eval(a) for a in call.args] == ["fashion-mnist", "hot"]
    assert {k.arg: ast.literal_eval(k.value) for k in call.keywords}["duration"] == "1ep"
    assert explorer_request({"seed": 1}).recipe == "mild"  # a configuration without a preset opens as the explorer does


def test_loading_a_configuration_of_the_same_task_keeps_the_curves(explorer):
    record = _record("earlier", "mild", [(1.0, 0.5)])
    explorer.overlay(record)
    explorer.load_config({"recipe": "hot"})
    assert _points(explorer.figure, record.run_id) > 0
    explorer.set_task("pydocs")
    assert not explorer.figure.data and "bpb" in explorer.figure.layout.annotations[1].text


def test_rows_show_badges_from_the_card(explorer):
    badges = explorer.rows["mixup"].badges.value
    card = explorer.rows["mixup"].card
    assert "vision" in badges and "role: label_mixing" in badges and "effect" in badges
    assert card.effect.split()[0] in badges  # the expected effect is the badge's tooltip


def test_a_changed_recipe_does_not_claim_the_presets_measurements():
    assert run_recipe(RunRequest(recipe="mild")).reached == TASKS["fashion-mnist"].recipes["mild"].reached
    assert run_recipe(RunRequest(recipe="mild", duration="1ep")).reached is None
