"""speedkit tune: the measured search for the fastest recipe.

Most tests plant a known answer through ``runner=`` (tests/support/tune_fakes.py: label_smoothing halves the
time to target, ema doubles it) so the search's logic is checked in seconds; one test runs the real
trainer on a sliver of Fashion-MNIST. Kills and extra workers are real processes.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prerequisites import import_or_missing  # noqa: E402

optuna = import_or_missing("optuna")

from speedkit.experiments.tune import (TuneConfig, TuneInputError, TuneSettings, parse_budget, penalized,  # noqa: E402
                                       tune)
from speedkit.experiments.tune.space import SearchSpace, recipe_params, suggest_recipe  # noqa: E402
from speedkit.record.runs import RunRecord  # noqa: E402
from speedkit.tasks import TASKS, Recipe, RunRequest, get_recipe  # noqa: E402

TESTS = Path(__file__).resolve().parents[1] / "support"
FAKE = "tune_fakes:fake_run"
SMALL = dict(data_fraction=0.02, eval_fraction=0.05)
QUIET = dict(log=lambda *_: None)


@pytest.fixture
def fake_env(tmp_path, monkeypatch):
    """Worker processes import the fake runner from tests/; every fake run is logged to a file."""
    log = tmp_path / "runs.log"
    monkeypatch.setenv("TUNE_FAKE_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(TESTS))
    return log


def _search_trials(storage: str, name: str = "tune", states=None):
    try:
        study = optuna.load_study(study_name=name, storage=_storage(storage))
    except KeyError:  # not created yet
        return []
    return study.get_trials(deepcopy=False, states=states)


def _storage(path: str):
    from speedkit.experiments.tune.storage import open_storage

    return open_storage(path)


def candidates(confirmation: dict) -> list[dict]:
    """The confirmation's entries in the order they ran (baselines first), each with its candidate key."""
    return [{"key": key, **row} for key, row in {**confirmation["baselines"], **confirmation["recipes"]}.items()]


# -- the objective ---------------------------------------------------------------------------------------
def test_penalty_ranks_every_miss_behind_every_hit_and_misses_by_shortfall():
    hit = penalized("eval/accuracy", 0.9, limit_s=10, time_to_target=9.9, value=0.95)
    near = penalized("eval/accuracy", 0.9, limit_s=10, time_to_target=None, value=0.85)
    far = penalized("eval/accuracy", 0.9, limit_s=10, time_to_target=None, value=0.5)
    assert hit == 9.9 < near < far
    # lower-is-better metrics: a bpb above the target is a shortfall
    assert penalized("eval/bpb", 2.0, 10, None, 2.5) > penalized("eval/bpb", 2.0, 10, None, 2.1) > 10


def test_budget_strings():
    assert parse_budget("30m") == 1800 and parse_budget("90s") == 90 and parse_budget("1.5h") == 5400
    assert parse_budget(12) == 12
    with pytest.raises(TuneInputError, match="budget"):
        parse_budget("soon")


# -- the space -------------------------------------------------------------------------------------------
def test_conflicting_methods_are_never_proposed_together():
    """mixup and cutmix hold the same role: in 200 random draws they are never both on."""
    base = Recipe(name="b", task="fashion-mnist", domain="vision", model="resnet8", duration="2ep", batch_size=64,
                  optimizer={"name": "sgd", "lr": 0.1})
    space = SearchSpace(methods=("mixup", "cutmix", "label_smoothing"))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(200):
        trial = study.ask()
        methods = set(suggest_recipe(trial, base, space, "t").methods)
        assert not {"mixup", "cutmix"} <= methods
        seen.add(frozenset(methods))
        study.tell(trial, 1.0)
    assert frozenset({"cutmix", "label_smoothing"}) in seen and frozenset({"mixup"}) in seen  # both still tried


def test_a_preset_maps_back_onto_its_point_of_the_space():
    from speedkit.experiments.tune.space import full_space

    base, mild = get_recipe("fashion-mnist", "baseline"), get_recipe("fashion-mnist", "mild")
    space = full_space(base, [*mild.methods, "ema"], "cpu")
    params = recipe_params(mild.with_changes(precision="bf16"), base, space)
    study = optuna.create_study()
    study.enqueue_trial(params)
    recipe = suggest_recipe(study.ask(), base, space, "again")
    assert _filled(recipe.methods) == _filled(mild.methods) and recipe.batch_size == mild.batch_size
    assert recipe.duration == mild.duration and recipe.schedule == mild.schedule
    assert recipe_params(mild, base, full_space(base, ["ema"], "cpu")) is None  # its methods are not in that space


def test_card_ranges_are_narrowed_to_what_acts_on_the_model_and_trials_stay_inside():
    import torch

    import speedkit.functional as sf
    from speedkit.experiments.tune.space import fit_hparams_to_model, full_space, suggest_hparams
    from speedkit.models import get_model
    from speedkit.tasks import get_recipe

    base = get_recipe("fashion-mnist", "plain-bf16").with_changes(loader="memory")
    methods = ["squeeze_excite", "weight_standardization", "label_smoothing", "channels_last"]
    limits = fit_hparams_to_model("fashion-mnist", base, methods, "cpu")
    convs = [m for m in get_model("resnet8").modules() if isinstance(m, torch.nn.Conv2d)]
    widest = max(c.out_channels for c in convs)
    assert limits["squeeze_excite.min_channels"] == {"low": 1, "high": widest}  # the card goes up to 4096
    assert limits["weight_standardization.n_last_layers_ignore"] == {"low": 0, "high": len(convs) - 1}  # card: 100
    # label smoothing is no surgery; channels_last's card has nothing to narrow
    assert not any(key.split(".")[0] in ("label_smoothing", "channels_last") for key in limits)
    sf.apply_squeeze_excite(get_model("resnet8"), min_channels=widest)  # the edge still acts ...
    with pytest.raises(ValueError, match="found no Conv2d"):
        sf.apply_squeeze_excite(get_model("resnet8"), min_channels=widest + 1)  # ... one past it does not

    space = full_space(base, ["squeeze_excite"], "cpu", hparam_limits=limits)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    drawn = []
    for _ in range(40):
        trial = study.ask()
        drawn.append(suggest_hparams(trial, "squeeze_excite", space.hparam_limits)["min_channels"])
        study.tell(trial, 1.0)
    assert all(1 <= d <= widest for d in drawn) and len(set(drawn)) > 10


def _filled(methods: dict) -> dict:
    """Methods with every searched parameter at the card's default where not given (what they run with)."""
    from speedkit.methods import REGISTRY

    return {name: {**{hp.name: hp.default for hp in REGISTRY[name].CARD.hparams if hp.name != "allow_empty"},
                   **params} for name, params in methods.items()}


# -- bad input -------------------------------------------------------------------------------------------
def test_unknown_method_is_named_with_the_known_ones(tmp_path):
    with pytest.raises(TuneInputError) as e:
        tune(TuneSettings("fashion-mnist", searched_methods=["label_smoothing", "mixupp"], out_dir=tmp_path,
                          **SMALL), **QUIET)
    assert "'mixupp'" in str(e.value) and "did you mean 'mixup'" in str(e.value) and "cutmix" in str(e.value)


def test_empty_search_space_says_why(tmp_path):
    with pytest.raises(TuneInputError) as e:
        tune(TuneSettings("fashion-mnist", searched_methods=["alibi", "qk_norm"], out_dir=tmp_path, **SMALL), **QUIET)
    assert "no method left to search" in str(e.value) and "alibi: a language method" in str(e.value)


def test_target_metric_no_evaluator_logs(tmp_path):
    with pytest.raises(TuneInputError) as e:
        tune(TuneSettings("fashion-mnist", target="eval/f1=0.5", searched_methods=["ema"], out_dir=tmp_path,
                          **SMALL), **QUIET)
    assert "'eval/f1'" in str(e.value) and "eval/accuracy" in str(e.value)


def test_methods_that_find_nothing_in_the_model_are_left_out_with_the_reason(tmp_path, fake_env):
    result = tune(TuneSettings("fashion-mnist", searched_methods=["label_smoothing", "low_precision_layernorm"],
                               out_dir=tmp_path,
                  runner=FAKE, budget=30, max_trials=2, max_baseline_trials=1, seeds_to_confirm=1, **SMALL), **QUIET)
    assert "found no" in result.summary["left_out"]["low_precision_layernorm"]
    assert result.summary["methods_searched"] == ["label_smoothing"]


def test_a_method_that_finds_nothing_once_training_starts_is_dropped_from_the_search(tmp_path, fake_env):
    result = tune(TuneSettings("fashion-mnist", searched_methods=["label_smoothing", "gyro_dropout"],
                               out_dir=tmp_path, runner=FAKE,
                  budget=60, trial_limit=12, max_trials=14, max_baseline_trials=1, seeds_to_confirm=1, **SMALL), **QUIET)
    searched = [t for t in result.summary["trials"] if t["phase"] == "search"]
    tried = [t for t in searched if t["params"].get("use:gyro_dropout")]
    # refused once: never again
    assert len(tried) == 1, [(t["phase"], t["number"], t["move"], t["infeasible"]) for t in tried]
    assert "NothingToChangeError" in tried[0]["infeasible"]
    same_phase = [t for t in searched if t["phase"] == tried[0]["phase"]]
    assert len(same_phase) > tried[0]["number"] + 3  # it went on without it
    assert "gyro_dropout" in result.summary["left_out"] and "gyro_dropout" not in result.recipe.methods


# -- the search ------------------------------------------------------------------------------------------
def test_finds_the_planted_best_and_writes_a_loadable_recipe(tmp_path, fake_env):
    result = tune(TuneSettings("fashion-mnist", searched_methods=["ema", "label_smoothing", "mixup", "cutmix"],
                               out_dir=tmp_path,
                  runner=FAKE, budget=60, trial_limit=12, max_trials=24, max_baseline_trials=9,
                  seeds_to_confirm=2, tune_hparams=False, leave_one_out=True, **SMALL), **QUIET)
    assert result.recipe is not None
    assert "label_smoothing" in result.recipe.methods and "ema" not in result.recipe.methods
    assert result.speedup is not None and result.speedup > 1.5  # planted: 2x from label smoothing
    loaded = Recipe.from_file(result.recipe_path)  # what `speedkit train --recipe` reads
    assert loaded.methods == result.recipe.methods and loaded.reached["seeds_reached"] == "2/2"
    # the tuned baseline it was measured against, beside it, to run the comparison again
    baseline = Recipe.from_file(result.recipe_path.with_name("baseline.yaml"))
    baseline_row = candidates(result.summary["confirmation"])[0]
    assert baseline.name == "tune-baseline" and baseline.methods == baseline_row["recipe"]["methods"]
    assert baseline.reached["time_to_target_s"] == baseline_row["median_time_to_target_s"]
    assert "label_smoothing" not in baseline.methods
    assert f"--recipe {result.recipe_path.with_name('baseline.yaml')}`" in result.report_path.read_text()
    rows = {c["role"]: c for c in candidates(result.summary["confirmation"])}
    assert loaded.reached["time_to_target_s"] == rows["winner"]["median_time_to_target_s"]
    # the tuned baseline trains the shortest budget that reached the target on seed 0 (all of them do, here), so
    # the base as given is confirmed beside it
    assert list(rows) == ["baseline", "baseline as given", "winner", "runner-up"]
    assert Recipe(**rows["baseline"]["recipe"]).duration == baseline.duration != Recipe(**rows["baseline as given"][
        "recipe"]).duration
    # no candidate takes a baseline's name on any task (pydocs has "tuned"): runs of that name count as baseline runs
    every_baseline = {name for task in TASKS.values() for name in task.baselines}
    names = [c["recipe"]["name"] for c in candidates(result.summary["confirmation"])[1:]] + [loaded.name]
    assert not every_baseline & set(names), names
    # successive halving stopped trials that fell behind, once the search had found where the target lies
    from speedkit.experiments.tune.search import PRUNER_STARTUP_TRIALS

    search = [t for t in result.summary["trials"] if t["phase"] == "search"]
    pruned = [t["number"] for t in search if t["stop_reason"] == "pruned"]
    assert pruned and min(pruned) >= PRUNER_STARTUP_TRIALS
    # the winner's leave-one-out, as the benchmark's (ablation.py): each part of its difference from the strongest
    # baseline given that baseline's value; without label smoothing it takes about twice as long (planted)
    from speedkit.experiments.ablation import ablation_changes, as_run_on

    confirmation = result.summary["confirmation"]
    table, loo = confirmation["leave_one_out"], confirmation["leave_one_out"]["parts"]
    strongest = confirmation["baselines"][confirmation["strongest_baseline"]]["recipe"]
    winner, reference = (as_run_on(Recipe(**r), "cpu") for r in (rows["winner"]["recipe"], strongest))
    assert set(loo) == set(ablation_changes(winner, reference)) and table["against"] == strongest["name"]
    assert set(loo) - set(winner.methods)  # its budget, rate ... too, not its methods alone
    assert "label_smoothing" in loo and loo["label_smoothing"]["slowdown"] > 1.5
    # every run is a RunRecord in one folder (re-scorable, and the board's leave-one-out reads it too)
    from speedkit.experiments.compare import leave_one_out
    from speedkit.record.runs import load_records

    records = load_records(tmp_path / "runs")
    assert len(records) == len([t for t in result.summary["trials"] if t["record"]]) + len(rows) * 2 + len(loo)
    [table] = leave_one_out(records).values()
    assert table["label_smoothing"]["slowdown"] == pytest.approx(loo["label_smoothing"]["slowdown"])
    report = result.report_path.read_text()
    # the confirmation table marks the baseline measured against; the winner's own row needs no mark
    assert "| baseline (reference) |" in report and "| winner |" in report and "(winner)" not in report
    assert "leave-one-out" in report and result.html_path.exists()


def test_respects_the_wall_clock_budget(tmp_path, fake_env, monkeypatch):
    monkeypatch.setenv("TUNE_FAKE_PACE", "0.05")  # each fake run takes 0.1-0.6 s of real time
    started = time.monotonic()
    result = tune(TuneSettings("fashion-mnist", searched_methods=["ema", "label_smoothing"], out_dir=tmp_path,
                               runner=FAKE,
                  budget=8, trial_limit=12, seeds_to_confirm=1, **SMALL), **QUIET)
    elapsed = time.monotonic() - started
    assert len(result.summary["trials"]) >= 6  # it used the budget ...
    assert result.summary["spent_s"] <= 8 + 1.5, result.summary["spent_s"]  # ... and kept to it (one run's slack)
    assert elapsed < 8 + 8  # set-up (data, probes) comes on top of the search's budget


def test_resumes_after_a_kill_without_rerunning_finished_trials(tmp_path, fake_env):
    out, storage = tmp_path / "out", str(tmp_path / "out" / "study.journal")
    script = (f"from speedkit.experiments.tune import TuneSettings, tune; tune(TuneSettings('fashion-mnist', searched_methods=['ema', 'label_smoothing'], "
              f"out_dir={str(out)!r}, runner={FAKE!r}, budget=300, trial_limit=12, max_trials=12, "
              f"max_baseline_trials=2, seeds_to_confirm=1, data_fraction=0.02, eval_fraction=0.05))")
    env = {**os.environ, "TUNE_FAKE_PACE": "0.05"}  # 0.1-0.6 s per fake run: time to kill one mid-run
    child = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if Path(storage).exists() and len(_search_trials(storage, states=(
                    optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))) >= 2:
                break
            time.sleep(0.25)  # polling shares the one core with the search
        time.sleep(0.1)  # most likely mid-way through the next trial
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
    finished_before = {t.number: t.params for t in _search_trials(storage) if t.state.is_finished()}
    assert len(finished_before) >= 2
    tune(TuneSettings("fashion-mnist", searched_methods=["ema", "label_smoothing"], out_dir=out, runner=FAKE,
                      budget=300,
         trial_limit=12, max_trials=12, max_baseline_trials=2, seeds_to_confirm=1, **SMALL), **QUIET)
    trials = _search_trials(storage)
    for number, params in finished_before.items():  # kept as they were
        assert trials[number].params == params and trials[number].state.is_finished()
    starts = [line.split()[1] for line in fake_env.read_text().splitlines() if line.startswith("start")]
    rerun = {name for name in starts if starts.count(name) > 1}
    assert not rerun, f"finished trials ran again: {rerun}"
    states = [t.state for t in trials]
    assert optuna.trial.TrialState.RUNNING not in states  # the cut-short trial is marked failed ...
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL and t.params]  # killed after it drew
    assert all(any(t.user_attrs.get("retry_of") == f.number for t in trials) for f in failed)  # ... and re-queued
    assert (out / "recipe.yaml").exists()


def test_a_baseline_plan_killed_mid_run_goes_on_from_the_runs_that_finished(tmp_path, fake_env):
    """The baseline plan's runs are RunRecords the study lists as they finish: killed during its second run, the
    same command runs that one again under its name and none that finished, then goes on with the plan."""
    from speedkit.experiments.tune.storage import BASELINE_RUNS

    out, storage = tmp_path / "out", str(tmp_path / "out" / "study.journal")
    settings = (f"'fashion-mnist', searched_methods=['label_smoothing'], out_dir={str(out)!r}, runner={FAKE!r}, "
                f"budget=300, trial_limit=12, max_trials=1, max_baseline_trials=3, seeds_to_confirm=1, "
                f"data_fraction=0.02, eval_fraction=0.05")
    script = f"from speedkit.experiments.tune import TuneSettings, tune; tune(TuneSettings({settings}))"
    fake_env.write_text("")
    child = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "TUNE_FAKE_PACE": "0.2"},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def listed() -> list:
        try:
            study = optuna.load_study(study_name="tune", storage=_storage(storage)) if Path(storage).exists() else None
        except KeyError:  # not created yet
            study = None
        return study.user_attrs.get(BASELINE_RUNS, []) if study else []

    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "start tune-baseline-01" not in fake_env.read_text():
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)  # during the second run (each takes about a second)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
    before = [entry["name"] for entry in listed()]
    assert before == ["tune-baseline-00"]
    tune(TuneSettings("fashion-mnist", searched_methods=["label_smoothing"], out_dir=out, runner=FAKE, budget=300,
                      trial_limit=12, max_trials=1, max_baseline_trials=3, seeds_to_confirm=1, **SMALL), **QUIET)
    starts = [line.split()[1] for line in fake_env.read_text().splitlines() if line.startswith("start")]
    plan = [name for name in starts if name.startswith("tune-baseline-")]
    assert plan == ["tune-baseline-00", "tune-baseline-01", "tune-baseline-01", "tune-baseline-02"], plan
    assert [t["number"] for t in json.loads((out / "summary.json").read_text())["trials"]
            if t["phase"] == "baseline"] == [0, 1, 2]


def test_a_queued_trial_cut_short_before_it_drew_its_settings_is_queued_again(tmp_path):
    """A dead worker's queued trial (a repeat on another seed) is run again with the settings it was queued with,
    even where the kill came before it drew them; a sampler's trial killed that early has nothing to repeat."""
    import socket

    from speedkit.experiments.tune.storage import fail_dead_trials, open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(str(tmp_path / "study.journal"))
    study = optuna.create_study(study_name="tune", storage=storage)
    study.enqueue_trial({"lr": 0.2}, user_attrs={"seed": 3, "repeat_of": 0})
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for _ in range(2):  # the queued trial, then a sampler's
        study.ask().set_user_attr("worker", f"{socket.gethostname()}:{dead.pid}")
    assert fail_dead_trials(study, storage) == [0, 1]
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [(t.system_attrs["fixed_params"], t.user_attrs) for t in waiting] == [
        ({"lr": 0.2}, {"seed": 3, "repeat_of": 0, "retry_of": 0})]


def test_a_trial_killed_before_it_was_marked_with_its_worker_is_failed_once_no_process_is_starting_one(tmp_path):
    """A search killed after Optuna made its trial but before the trial named its worker left it RUNNING with no
    owner, and a resume waited on it for ever. Live workers mark their trial before they let go of the start
    lock, so an unmarked trial found while that lock is free is a dead process's; while another process holds
    the lock (it may be making one now), it is left alone."""
    from speedkit.experiments.tune.storage import START_LOCK, FolderLock, fail_dead_trials, open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(str(tmp_path / "study.journal"))
    study = optuna.create_study(study_name="tune", storage=storage)
    study.enqueue_trial({"lr": 0.2})
    study.ask()  # made, never marked: its process died at once
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; "
                               f"fd = os.open({str(tmp_path / START_LOCK)!r}, os.O_RDWR | os.O_CREAT); "
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert fail_dead_trials(study, storage, tmp_path) == []  # another process is starting a trial
    finally:
        holder.kill()
        holder.wait()
    assert fail_dead_trials(study, storage) == []  # without the search's folder, an unmarked trial is not judged
    assert fail_dead_trials(study, storage, tmp_path) == [0]
    assert [t.system_attrs["fixed_params"] for t in study.get_trials(states=(optuna.trial.TrialState.WAITING,))] == [
        {"lr": 0.2}]
    assert FolderLock(tmp_path, START_LOCK).try_acquire()  # fail_dead_trials let go of the lock it took


def test_a_resumed_search_counts_the_wall_clock_its_earlier_trials_spanned(tmp_path):
    """Two workers' overlapping trials count once, and a confirmation run alone counts in full: the time a
    continued search starts from is the clock's, not the trials' summed time over the workers."""
    from datetime import datetime, timedelta

    from speedkit.experiments.tune.storage import BASELINE_RUNS, spent_before_s, update_plan

    storage_path = str(tmp_path / "study.journal")
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(storage_path))
    start = datetime(2026, 12, 3, 6, 0, 0)

    def ran(study_name: str, *spans):
        study = optuna.create_study(study_name=study_name, storage=storage, load_if_exists=True)
        for begin, end in spans:
            study.add_trial(optuna.trial.FrozenTrial(
                number=0, trial_id=0, state=optuna.trial.TrialState.COMPLETE, value=1.0, params={}, distributions={},
                user_attrs={}, system_attrs={}, intermediate_values={},
                datetime_start=start + timedelta(seconds=begin), datetime_complete=start + timedelta(seconds=end)))

    def spans(*seconds):
        return [{"run": f"r{i}", "span": [(start + timedelta(seconds=s)).timestamp() for s in pair]}
                for i, pair in enumerate(seconds)]

    ran("tune", (0, 10), (12, 30), (13, 25), (26, 40))  # a trial beside the baseline plan, then two workers at once
    study = optuna.load_study(study_name="tune", storage=storage)
    study.set_user_attr(BASELINE_RUNS, spans((0, 12)))  # the baseline plan's runs are RunRecords, listed by span
    # one worker confirms while the other waits: the confirmation's runs are spans of the plan, not trials
    update_plan(study, measured=spans((40, 70)))
    ran("other", (100, 500))  # another study in the same storage is not this search's
    assert spent_before_s(storage_path, "tune") == pytest.approx(70)


def test_two_worker_processes_share_one_study(tmp_path, fake_env, monkeypatch):
    (tmp_path / "arrived").mkdir()
    monkeypatch.setenv("TUNE_FAKE_RENDEZVOUS", f"{tmp_path / 'arrived'}:2")  # both processes in before any run ends
    monkeypatch.setenv("TUNE_FAKE_PACE", "0.1")
    result = tune(TuneSettings("fashion-mnist", searched_methods=["ema", "label_smoothing"], out_dir=tmp_path,
                               runner=FAKE, budget=60,
                  trial_limit=12, max_trials=6, max_baseline_trials=2, seeds_to_confirm=1, n_workers=2, **SMALL), **QUIET)
    # one process runs the baseline plan (its next run depends on the last), the other searches meanwhile
    workers = {t.user_attrs.get("worker") for t in _search_trials(result.storage)}
    assert len(workers) == 2, workers
    assert len([t for t in result.summary["trials"] if t["phase"] == "baseline"]) == 2
    search = [t for t in _search_trials(result.storage) if t.state.is_finished()]
    assert 6 <= len(search) <= 7  # each process checks the count before it starts a trial
    pids = {line.split()[2] for line in fake_env.read_text().splitlines()}
    assert len(pids) == 2
    names = [line.split()[1] for line in fake_env.read_text().splitlines() if line.startswith("start")]
    assert len(names) == len(set(names))  # no trial ran twice
    # two workers spend two seconds of runs in each second of the clock: the time's shares are of those
    time_spent = result.summary["time"]
    assert time_spent["workers"] == 2 and time_spent["worker_s"] == pytest.approx(2 * time_spent["spent_s"], abs=0.2)
    assert sum(time_spent["seconds"].values()) == pytest.approx(time_spent["worker_s"], abs=0.5)
    assert sum(time_spent["seconds"].values()) > 1.2 * time_spent["spent_s"]  # runs overlapped: more than the clock
    assert f"on 2 workers: {time_spent['worker_s']:.0f} worker-seconds" in result.report_path.read_text()
    from speedkit.ui.tune_panel import time_line  # the explorer's Tune panel says the same

    assert time_line(time_spent).startswith(f"{time_spent['spent_s']:.0f}s on 2 workers")


def test_every_trial_trains_on_all_the_data(tmp_path, fake_env):
    result = tune(TuneSettings("fashion-mnist", searched_methods=["ema", "label_smoothing"], out_dir=tmp_path,
                               runner=FAKE, budget=30,
                  trial_limit=12, max_trials=3, max_baseline_trials=1, seeds_to_confirm=1, **SMALL), **QUIET)
    assert {t["phase"] for t in result.summary["trials"]} == {"baseline", "search"}
    assert "screen" not in result.summary


def test_tune_takes_its_settings_as_one_object_and_names_it_when_given_keywords(tmp_path):
    with pytest.raises(TypeError, match=r"tune\(\) takes one TuneSettings .*got \['budget=', 'out_dir='\]"):
        tune(budget="1m", out_dir=tmp_path)
    with pytest.raises(TypeError, match="takes one TuneSettings .*got str"):
        tune("fashion-mnist")
    with pytest.raises(TypeError, match="screen_fraction"):  # the screen ranked budgets wrongly; it is gone
        TuneSettings("fashion-mnist", screen_fraction=0.5)
    settings = TuneSettings("fashion-mnist", device="cpu", data_fraction=0.5, eval_interval="0.5ep", run_dir="r")
    request = settings.run  # the search's runs are described once, by the RunRequest each of them starts from
    assert (request.task, request.device, request.data_fraction, request.eval_interval, request.run_dir) == (
        "fashion-mnist", "cpu", 0.5, "0.5ep", "r")
    assert not any(hasattr(settings, name) for name in ("task", "device", "data_fraction", "eval_interval", "run_dir"))
    assert settings.replace(device="auto", budget="1m").run == request.replace(device="auto")
    settings = TuneSettings(run=RunRequest("fashion-mnist", device="cpu"), searched_methods=["ema"])
    assert settings.searched_methods == ["ema"]
    with pytest.raises(TypeError, match="searched_methods=, not methods="):  # methods means a recipe's, everywhere
        TuneSettings("fashion-mnist", methods=["ema"])
    # what each trial sets itself is refused in run, naming the setting that means it, not ignored or obeyed
    for field, value, fix in (("methods", ["ema"], "searched_methods="), ("duration", "2ep", "duration_scale_range="),
                              ("recipe", "hot", "base="), ("seed", 3, "seeds_to_confirm=")):
        with pytest.raises(TypeError, match=rf"run\.{field} is set by each trial.*{fix}"):
            TuneSettings(run=RunRequest("fashion-mnist", **{field: value}))
    # duration_scale is one factor on a budget (a bench profile's, a trial's); the search draws it from a range
    assert TuneSettings(duration_scale_range=(0.2, 1.0)).duration_scale_range == (0.2, 1.0)
    with pytest.raises(TypeError, match=r"unknown settings \['duration_scale'\]"):
        TuneSettings(duration_scale=(0.2, 1.0))
    with pytest.raises(ValueError, match="data_fraction must be in"):  # checked by the one run description
        tune(TuneSettings("fashion-mnist", data_fraction=1.5, out_dir=tmp_path), **QUIET)


# -- the real trainer ------------------------------------------------------------------------------------
def test_a_trial_towards_another_metric_is_not_stopped_by_the_tasks_own(tmp_path):
    """A run request's target is a value of the task's metric (accuracy here): a trial towards eval/loss=1e-4
    runs until the loss gets there (never, in six batches), not until the accuracy passes 1e-4 at its first
    evaluation; one towards a loss it reaches stops there."""
    from speedkit.experiments.tune.objective import TrialContext, train_trial

    def trial(target: float):
        recipe = get_recipe("fashion-mnist", "mild").with_changes(duration="6ba", batch_size=32)
        run = RunRequest("fashion-mnist", recipe, device="cpu", data_fraction=0.02, eval_fraction=0.02,
                         eval_interval="2ba", run_dir=str(tmp_path), run_name=f"loss-{target}")
        context = TrialContext(run=run, metric="eval/loss", target=target, limit_s=600.0, stop_after_s=600.0)
        return train_trial(context)

    missed = trial(1e-4)
    assert len(missed.evals) == 3 and missed.time_to("eval/loss", 1e-4) is None
    reached = trial(1e4)
    assert len(reached.evals) == 1 and reached.time_to("eval/loss", 1e4) is not None
    # its record's target is the search's, so the run board times it there, not at the task's accuracy
    assert RunRecord.load(reached.path).target == {"metric": "eval/loss", "value": 1e4}
    assert reached.time_to_target is not None and missed.time_to_target is None


def test_real_trainer_search_on_a_sliver_of_fashion_mnist(tmp_path):
    """Real runs through make_trainer (from the mild preset, so a few seconds reach the target)."""
    result = tune(TuneSettings("fashion-mnist", target=0.4, base="mild", searched_methods=["label_smoothing", "ema"],
                               out_dir=tmp_path,
                  budget=90, trial_limit=4, max_trials=2, max_baseline_trials=1, seeds_to_confirm=1,
                  eval_interval="0.5ep", data_fraction=0.05, eval_fraction=0.05), log=lambda *_: None)
    summary = result.summary
    finished = [t for t in summary["trials"] if t["record"]]
    assert finished, summary["trials"]

    for trial in finished:  # each trial is a real run, its record re-scorable from disk
        record = RunRecord.load(trial["record"])
        assert record.evals and record.config["tune"]["phase"] == trial["phase"]
        assert record.time_to("eval/accuracy", 0.4) == trial["time_to_target_s"]
        assert record.config["data_fraction"] == pytest.approx(0.05)
        assert record.status in ("target_reached", "stopped", "completed")
    # each run says how much of its budget it trained (the confirmation's reserve scales a baseline by it)
    baselines = [t for t in summary["trials"] if t["phase"] == "baseline"]
    assert baselines and all(0 < t["budget_done"] <= 1 for t in baselines)
    confirmation = summary["confirmation"]
    # a second seed of a recipe (repeat_of) is the same candidate
    reached = [t for t in finished if t["phase"] == "search" and t["time_to_target_s"] is not None
               and t["repeat_of"] is None]
    assert len(candidates(confirmation)) == 1 + min(2, len(reached))  # the tuned baseline, and what reached
    if result.recipe is not None:
        assert Recipe.from_file(result.recipe_path).reached["metric"] == "eval/accuracy"
    json.loads((tmp_path / "summary.json").read_text())


# -- the command line ------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--methods", "label_smoothing,mixupp"], "unknown method 'mixupp' (did you mean 'mixup'?)"),
    (["--methods", "alibi"], "no method left to search (alibi: a language method"),
    (["--target", "eval/f1=0.5", "--methods", "ema"], "'eval/f1' is not logged by any evaluator"),
    (["--budget", "tomorrow", "--methods", "ema"], "budget must be a wall-clock time"),
    (["--baseline-share", "1.5", "--methods", "ema"], "baseline_share is the part of the budget"),
])
def test_cli_refuses_bad_input_with_a_clear_message(tmp_path, capsys, args, message):
    from speedkit.cli.main import main

    code = main(["tune", "--out", str(tmp_path), "--data-fraction", "0.02", "--eval-fraction", "0.05", *args])
    assert code == 2
    assert message in capsys.readouterr().err


def test_cli_tune_writes_recipe_and_report(tmp_path, capsys, fake_env):
    from speedkit.cli.main import main

    code = main(["tune", "--task", "fashion-mnist", "--methods", "ema,label_smoothing", "--budget", "60s",
                 "--trial-limit", "12", "--max-trials", "8", "--max-baseline-trials", "2", "--seeds", "1",
                 "--data-fraction", "0.02", "--eval-fraction", "0.05", "--out", str(tmp_path), "--runner", FAKE])
    out = capsys.readouterr().out
    assert code == 0 and "speed-up over the faster baseline" in out
    assert Recipe.from_file(tmp_path / "recipe.yaml").reached["seeds_reached"] == "1/1"
    assert (tmp_path / "report.md").exists() and f"report: {tmp_path / 'report.md'}" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["target"]["value"] == 0.92
    assert summary["base"]["name"] == "plain-bf16"  # the task's strongest baseline, unless --base names another
    # no --leave-one-out: no table of it, not an empty one under the winner
    assert summary["confirmation"]["leave_one_out"] == {}
    assert "leave-one-out" not in (tmp_path / "report.md").read_text()
    prior = json.loads((tmp_path / "tune_config.json").read_text())["move_prior"]  # the benchmark's leave-one-out
    assert prior["muon"] is None and prior["label_smoothing"] > 1
    config = TuneConfig.load(tmp_path / "tune_config.json")  # what a worker process reads: the settings, concrete
    assert config.settings.searched_methods == ["ema", "label_smoothing"] and config.run_settings() == summary["settings"]
    assert config.settings.storage == str((tmp_path / "study.journal").resolve()) and config.budget_s == 60
    (tmp_path / "old.json").write_text(json.dumps({"task": "fashion-mnist", "settings": {"device": "auto"}}))
    with pytest.raises(TuneInputError, match="run the same `speedkit tune` command again"):
        TuneConfig.load(tmp_path / "old.json")  # a config an older speedkit wrote names the fix
    with pytest.raises(SystemExit):  # the screen is gone, and its flag with it
        main(["tune", "--screen-fraction", "0.25", "--out", str(tmp_path / "screened")])


def test_cli_tune_searches_a_folder_of_your_own_images(tmp_path, capsys, fake_env):
    """``speedkit tune --task image-folder --data DIR`` searches on that folder's task, as train and bench do."""
    import numpy as np
    from PIL import Image

    from speedkit.cli.main import main

    rng = np.random.default_rng(0)
    for label in ("cats", "dogs"):
        (tmp_path / "images" / label).mkdir(parents=True)
        for i in range(12):
            Image.fromarray(rng.integers(0, 255, (16, 16), dtype=np.uint8)).save(tmp_path / "images" / label / f"{i}.png")
    args = ["tune", "--task", "image-folder", "--methods", "ema,label_smoothing", "--budget", "60s", "--seeds", "1",
            "--trial-limit", "12", "--max-trials", "4", "--max-baseline-trials", "1", "--image-size", "16",
            "--out", str(tmp_path / "out"), "--runner", FAKE]
    assert main(args) == 2 and "give the folder (--data DIR" in capsys.readouterr().err
    assert main([*args, "--data", str(tmp_path / "images")]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["task"] == "image-folder" and summary["confirmation"]["seeds"]
    assert TASKS["image-folder"].summary == f"2-class images from {tmp_path / 'images'}, 16x16, 1 channel(s)"
    # the folder's baseline evaluates every epoch; the search times every run every quarter epoch, as it ships
    assert get_recipe("image-folder", "plain-bf16").eval_interval == "1ep"
    assert json.loads((tmp_path / "out" / "tune_config.json").read_text())["settings"]["run"]["eval_interval"] == "0.25ep"
    report = (tmp_path / "out" / "report.md").read_text()  # the command it gives names the folder again
    assert (f"`speedkit train --task image-folder --data {(tmp_path / 'images').resolve()} --image-size 16 "
            f"--stop-at-target --recipe") in report
    # "image-folder" names every folder: the study is not continued on another one
    shutil.copytree(tmp_path / "images", tmp_path / "others")
    capsys.readouterr()
    assert main([*args, "--data", str(tmp_path / "others")]) == 2
    assert "was started with other settings (data differ" in capsys.readouterr().err


def test_the_winner_file_says_auto_where_the_search_chose_what_auto_picks_here(monkeypatch):
    from speedkit.core import devices
    from speedkit.experiments.report import portable_precision

    monkeypatch.setattr(devices, "cpu_bf16_speedup", lambda threads=None: 1.8)  # bf16 measured fast here
    assert portable_precision("bf16", "cpu") == "auto"  # so another machine picks its own fast one
    assert portable_precision("fp32", "cpu") == "fp32"  # the search chose against auto: kept
    monkeypatch.setattr(devices, "cpu_bf16_speedup", lambda threads=None: 0.4)  # bf16 emulated here
    assert portable_precision("fp32", "cpu") == "auto"
    assert portable_precision("bf16", "cpu") == "bf16"


def test_continuing_a_study_with_other_settings_is_refused(tmp_path, fake_env):
    args = dict(searched_methods=["ema", "label_smoothing"], out_dir=tmp_path, runner=FAKE, budget=30, trial_limit=12,
                max_trials=2, max_baseline_trials=1, seeds_to_confirm=1, **SMALL)
    tune(TuneSettings("fashion-mnist", **args), **QUIET)
    study = optuna.load_study(study_name="tune", storage=_storage(str((tmp_path / "study.journal").resolve())))
    # what a rerun compares: a study whose identity differs in any of these is refused, not continued
    assert sorted(study.user_attrs["identity"]) == ["base", "limit_s", "metric", "settings", "space", "target", "task"]
    assert sorted(study.user_attrs["identity"]["settings"]) == ["data_fraction", "device", "eval_fraction",
                                                                "eval_interval"]
    with pytest.raises(TuneInputError) as e:
        tune(TuneSettings("fashion-mnist", target=0.8, **args), **QUIET)
    assert "target: was 0.92, now 0.8" in str(e.value) and "another study_name" in str(e.value)


# -- the explorer ----------------------------------------------------------------------------------------
def test_explorer_tunes_headless_shows_trials_and_loads_the_winner(tmp_path, fake_env):
    import_or_missing("ipywidgets")
    from speedkit.ui.explorer import MethodExplorer

    explorer = MethodExplorer("fashion-mnist", "mild", live=False, run_dir=tmp_path / "runs", data_fraction=0.02,
                              eval_fraction=0.05)
    result = explorer.tune(budget=60, searched_methods=["ema", "label_smoothing"], runner=FAKE, trial_limit=12,
                           max_trials=8, max_baseline_trials=2, seeds_to_confirm=1, out_dir=str(tmp_path / "tune"))
    assert result.recipe is not None
    tuned = [r.config["tune"] for r in explorer.board.records if r.config.get("tune")]
    assert len({t["trial"] for t in tuned if t["phase"] == "search"}) >= 8  # every trial that trained is on the board
    # and so are the baseline plan's runs and the confirmation's, which are no trials
    baseline_runs = [t for t in tuned if t["phase"] == "baseline"]
    assert len(baseline_runs) == len([t for t in result.summary["trials"] if t["phase"] == "baseline"]) >= 1
    confirmation = result.summary["confirmation"]
    assert len([t for t in tuned if t["phase"] == "confirm"]) == len(candidates(confirmation)) * len(
        confirmation["seeds"])
    # "Use this recipe": the winner is the explorer's recipe now, its methods ticked in the grid
    assert explorer.preset.value == str(result.recipe_path)
    assert {n for n, row in explorer.rows.items() if row.enabled} == set(result.recipe.methods)
    assert explorer.recipe().optimizer == result.recipe.optimizer
    # each row says what the records measured about its method, beside the card's claim
    import re

    assert re.search(r"tune trials(: with it|, all with it:) median", explorer.rows["label_smoothing"].measured.value)
    assert "not measured here" in explorer.rows["mixup"].measured.value
    # the panel says where the search's time went, and where its best trial came from
    assert "baseline plan" in explorer.tune_panel.status.value and "confirmation" in explorer.tune_panel.status.value
    assert "proposed as" in explorer.tune_panel.best.value
    # and it names the recipe the search ranks first (by its worst seed), not the luckiest single trial
    from speedkit.experiments.tune.search import standings

    study = optuna.load_study(study_name="tune", storage=_storage(str(tmp_path / "tune" / "study.journal")))
    assert f"(tune #{standings(study)[0].first.number})" in explorer.tune_panel.best.value


def test_stop_ends_the_search_mid_trial_and_a_rerun_continues(tmp_path, fake_env, monkeypatch):
    import_or_missing("ipywidgets")
    from speedkit.ui.explorer import MethodExplorer

    monkeypatch.setenv("TUNE_FAKE_PACE", "0.2")
    explorer = MethodExplorer("fashion-mnist", "mild", live=False, run_dir=tmp_path / "runs", data_fraction=0.02,
                              eval_fraction=0.05)
    panel = explorer.tune_panel
    args = dict(budget=120, searched_methods=["ema", "label_smoothing"], runner=FAKE, trial_limit=12, max_trials=30,
                max_baseline_trials=1, seeds_to_confirm=1, out_dir=str(tmp_path / "tune"))
    thread = panel.start(**args)
    deadline = time.monotonic() + 60
    while panel.trials < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    panel.stop()  # a Stop click
    thread.join(30)
    assert not thread.is_alive() and panel.error is None
    trials = _search_trials(str(tmp_path / "tune" / "study.journal"))
    assert len([t for t in trials if t.state.is_finished()]) < 30  # it did stop
    cut = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    queued = [t for t in trials if t.state == optuna.trial.TrialState.WAITING]
    assert len(cut) <= 1 and len(queued) >= len(cut)  # a trial cut short is queued to run again
    finished = {t.number for t in trials if t.state.is_finished() and t.state != optuna.trial.TrialState.FAIL}
    result = panel.start(wait=True, **{**args, "max_trials": len(finished) + 2})
    again = _search_trials(str(tmp_path / "tune" / "study.journal"))
    assert {t.number for t in again if t.state.is_finished()} >= finished and result.summary["trials"]


def test_ctrl_c_stops_the_cli_cleanly_and_the_same_command_continues(tmp_path, fake_env):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "speedkit", "tune", "--methods", "ema,label_smoothing", "--budget", "300",
               "--trial-limit", "12", "--max-trials", "8", "--max-baseline-trials", "1", "--seeds", "1",
               "--data-fraction", "0.02", "--eval-fraction", "0.05", "--out", str(out), "--runner", FAKE]
    env = {**os.environ, "TUNE_FAKE_PACE": "0.05"}
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    storage = str(out / "study.journal")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(_search_trials(storage, states=(
            optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))) < 2:
        time.sleep(0.25)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 130, err[-2000:]
    assert "stopped; finished trials are kept" in err
    before = {t.number for t in _search_trials(storage) if t.state.is_finished()}
    from speedkit.cli.main import main

    assert main(command[3:]) == 0  # the same command, in this process, continues the search
    after = _search_trials(storage)
    assert before <= {t.number for t in after if t.state.is_finished()}
    assert optuna.trial.TrialState.RUNNING not in {t.state for t in after}


@pytest.mark.parametrize("arguments, message", [
    ({"n_workers": 0}, "n_workers must be at least 1"),
    ({"max_trials": 0}, "max_trials must be at least 1"),
    ({"pruner": "random"}, "pruner must be one of halving, hyperband, median, none"),
    ({"baseline_share": 1.5}, "baseline_share is the part of the budget"),
    ({"target": "eval/accuracy=high"}, "target value must be a number"),
    ({"n_workers": 2, "runner": lambda context: None}, "runner must be importable"),
])
def test_other_arguments_are_refused_by_name(tmp_path, arguments, message):
    with pytest.raises(TuneInputError, match=message):
        tune(TuneSettings("fashion-mnist", searched_methods=["ema"], out_dir=tmp_path,
                          **{**SMALL, **arguments}), **QUIET)


def test_a_sqlite_storage_holds_the_search_and_a_rerun_continues_it(tmp_path, fake_env):
    args = dict(searched_methods=["ema", "label_smoothing"], out_dir=tmp_path / "out", storage=tmp_path / "search.db",
                runner=FAKE, budget=60, trial_limit=12, max_baseline_trials=1, seeds_to_confirm=1, **SMALL)
    first = tune(TuneSettings("fashion-mnist", max_trials=3, **args), **QUIET)
    assert first.storage.startswith("sqlite:///") and (tmp_path / "search.db").exists()
    tune(TuneSettings("fashion-mnist", max_trials=5, **args), **QUIET)
    trials = optuna.load_study(study_name="tune", storage=first.storage).get_trials(deepcopy=False)
    assert len([t for t in trials if t.state.is_finished()]) == 5  # 3 kept, 2 more
    starts = [line.split()[1] for line in fake_env.read_text().splitlines() if line.startswith("start")]
    assert len(starts) == len(set(starts))  # nothing ran twice


def test_the_search_samples_no_flip_where_a_flip_changes_the_labels():
    from speedkit.experiments.tune.space import candidate_methods, full_space
    from speedkit.tasks import get_recipe

    candidates, left_out = candidate_methods("vision", None, "cpu", flips_keep_labels=False)
    assert {"alternating_flip", "test_time_augmentation"} <= left_out.keys()
    assert "a horizontal flip changes this task's labels" in left_out["alternating_flip"]
    assert not {"alternating_flip", "test_time_augmentation"} & set(candidates) and "label_smoothing" in candidates
    assert "alternating_flip" in candidate_methods("vision", None, "cpu")[0]
    base = get_recipe("fashion-mnist", "baseline")
    assert full_space(base, [], "cpu", flips_keep_labels=False).flips == ()
    assert full_space(base, [], "cpu").flips == ("random", "alternating", "none")


def test_a_winner_that_misses_a_fresh_seed_gets_a_longer_budget_until_it_reaches_on_every_seed(tmp_path, fake_env):
    """Two trials (the hot and medium presets): only medium reaches the target on seed 0, and on seed 2 every
    recipe needs 30% longer (planted), so the confirmed winner is medium with a longer budget, and the shipped
    file says so."""
    result = tune(TuneSettings("fashion-mnist", searched_methods=["label_smoothing", "ema"], out_dir=tmp_path,
                  runner="tune_fakes:budgeted_run", budget=120, trial_limit=12, max_trials=2, max_baseline_trials=2,
                  seeds_to_confirm=2, tune_hparams=False, **SMALL), **QUIET)
    confirmation = result.summary["confirmation"]
    rows = {row["key"]: row for row in candidates(confirmation)}
    picked = next(row for row in rows.values() if row["role"] == "winner")
    assert picked["reached"] == 1, picked  # reached on seed 1, missed on the slow seed 2
    longer = [row for row in rows.values() if row["role"] == "winner, longer"]
    assert longer and all(row["key"].startswith(picked["key"] + "@x") for row in longer)
    winner = rows[confirmation["best_recipe"]]
    assert winner in longer and winner["reached"] == 2
    assert [row["reached"] for row in longer][-1] == 2 and all(r["reached"] < 2 for r in longer[:-1])
    from speedkit.core.time import Time

    shipped = Recipe.from_file(result.recipe_path)
    assert Time.from_string(shipped.duration).value > Time.from_string(picked["recipe"]["duration"]).value
    assert shipped.reached["seeds_reached"] == "2/2"
    time_spent = result.summary["time"]
    assert time_spent["runs"]["search: reached"] == 1 and time_spent["runs"]["search: missed"] == 1
    assert time_spent["runs"]["confirmation"] == 2 * (2 + len(longer))  # baseline, medium and each longer budget
    assert sum(time_spent["seconds"].values()) == pytest.approx(time_spent["spent_s"], abs=0.5)
    assert "Where the time went" in result.report_path.read_text()


def test_the_baseline_is_tuned_by_the_benchmarks_baseline_plan(tmp_path, fake_env):
    """The baseline is tuned as `speedkit bench --sweep --find-budgets` tunes one (baseline_plan.py), on the same
    grid: its rate as given, halved and doubled with its own schedule, then with a linear decay after the same
    warmup, then its budget walked down in tenths while it still reaches the target. Planted (budgeted_run): lr 0.1
    is best, the decay makes no difference (the first tried is kept), and a run reaches the target only with at
    least 7 tenths of its 8 epochs."""
    from speedkit.experiments.report import proposal

    result = tune(TuneSettings("fashion-mnist", searched_methods=["label_smoothing"], out_dir=tmp_path,
                  runner="tune_fakes:budgeted_run", budget=60, trial_limit=12, max_trials=1, seeds_to_confirm=1,
                  tune_hparams=False, **SMALL), **QUIET)
    baselines = [t for t in result.summary["trials"] if t["phase"] == "baseline"]
    ran = [(t["params"]["lr"], t["params"]["schedule"]["name"], t["params"]["duration"]) for t in baselines]
    assert ran == [(rate, decay, "8ep") for decay in ("cosine", "linear_to_zero") for rate in (0.1, 0.05, 0.2)] + \
        [(0.1, "cosine", budget) for budget in ("7.2ep", "6.4ep", "5.6ep", "4.8ep")]
    assert baselines[3]["params"]["schedule"] == {"name": "linear_to_zero", "warmup": "0.1dur"}  # the same warmup
    # each is a RunRecord in the run folder, as a benchmark's plan run is; the study lists it, Optuna ran none
    assert all(RunRecord.load(t["record"]).config["tune"]["phase"] == "baseline" for t in baselines)
    assert not optuna.get_all_study_summaries(_storage(result.storage))[0].study_name.endswith("-baseline")
    origins = [proposal(t) for t in baselines]
    assert origins == ["start: baseline", *["baseline plan: learning rate and schedule"] * 5,
                       *["baseline plan: budget"] * 4]
    tuned, given = candidates(result.summary["confirmation"])[:2]
    assert tuned["role"] == "baseline" and tuned["recipe"]["duration"] == "5.6ep"  # 7 tenths of 8 epochs
    assert given["role"] == "baseline as given"
    assert result.summary["baseline_plan"] == {"runs": 10, "finished": True}
    assert "The baseline plan stopped" not in result.report_path.read_text()


@pytest.mark.parametrize("cut, runs, left, stopped_by", [
    ({"max_baseline_trials": 6}, 6, "its budget walk", "max_baseline_trials=6"),
    ({"max_baseline_trials": 8}, 8, "the rest of its budget walk", "max_baseline_trials=8"),
    ({"max_baseline_trials": 3}, 3, "the rest of its rate and schedule sweep", "max_baseline_trials=3"),
    ({"baseline_share": 1e-6}, 1, "the rest of its rate and schedule sweep", "its share of the budget (0%, 0s)"),
], ids=["before-the-walk", "mid-walk", "mid-sweep", "by-its-share"])
def test_a_baseline_plan_cut_short_is_said_beside_the_speedup_with_how_to_give_it_room(tmp_path, fake_env, monkeypatch,
                                                                                       cut, runs, left, stopped_by):
    """A plan stopped before its end (by max_baseline_trials, or by its share of the budget, which a sweep of long
    runs can fill) leaves a baseline less tuned than the plan would have: the search says so as it stops, and the
    summary and the report say what was left out, beside the speed-up, with the flag that continues it."""
    logged = []
    settings = TuneSettings("fashion-mnist", searched_methods=["label_smoothing"], out_dir=tmp_path,
                            runner="tune_fakes:budgeted_run", budget=60, trial_limit=12, max_trials=1,
                            seeds_to_confirm=1, tune_hparams=False, **cut, **SMALL)
    result = tune(settings, log=logged.append)
    assert result.summary["baseline_plan"] == {"runs": runs, "finished": False, "left": left, "stopped_by": stopped_by}
    assert any(line.startswith(f"speedkit tune: the baseline plan stopped after {runs} runs") for line in logged)
    report = " ".join(result.report_path.read_text().split())
    assert f"The baseline plan stopped after {runs} runs, at {stopped_by}, before {left}" in report
    assert "`--baseline-share` continues the plan" in report
    if "baseline_share" in cut:  # as the report says: the same search with a larger share goes on with the plan,
        # even where the search has spent its budget: the plan's runs are not cut at its end (a walk's run cut there
        # would read as a budget that misses, and the plan would keep a longer one)
        monkeypatch.setattr(TuneConfig, "spent_s", lambda config: config.budget_s)
        result = tune(settings.replace(baseline_share=0.9), **QUIET)
        assert result.summary["baseline_plan"] == {"runs": 10, "finished": True}
        assert "The baseline plan stopped" not in result.report_path.read_text()
        tuned = candidates(result.summary["confirmation"])[0]  # confirmed again: the baseline the plan tuned
        assert tuned["role"] == "baseline" and tuned["recipe"]["duration"] == "5.6ep" and tuned["reached"] == 1
        # the others' confirmation runs were made by the first call: the report says the pairs span two sittings
        sessions = list(result.summary["confirmation"]["sessions"].values())
        assert sessions == [["baseline as given"], ["baseline"]]  # the base as given was the plan's first run
        assert "These runs come from 2 sittings of the search" in result.report_path.read_text()
    else:
        assert len(result.summary["confirmation"]["sessions"]) == 1
        assert "sittings of the search" not in result.report_path.read_text()


def test_a_lead_on_the_search_seed_runs_again_on_another_before_it_leads_the_search(tmp_path, fake_env):
    """mixup looks 2.5x faster on seed 0 and is 2x slower on every other seed (planted); label smoothing halves
    the time on every seed. The search runs its best recipe so far on a second seed before any move starts
    from it, ranks each recipe by its worst seed, and so confirms label smoothing, not mixup."""
    from speedkit.experiments.tune.search import REPEAT_SEED

    result = tune(TuneSettings("fashion-mnist", searched_methods=["mixup", "label_smoothing"], out_dir=tmp_path,
                  runner="tune_fakes:lucky_seed_run", budget=120, trial_limit=12, max_trials=8, max_baseline_trials=1,
                  seeds_to_confirm=1, tune_hparams=False, pruner="none", **SMALL), **QUIET)
    search = [t for t in result.summary["trials"] if t["phase"] == "search"]
    repeats = [t for t in search if t["repeat_of"] is not None]
    by_number = {t["number"]: t for t in search}
    assert repeats and all(t["seed"] == REPEAT_SEED and by_number[t["repeat_of"]]["seed"] == 0 for t in repeats)
    lucky = [t for t in search if t["seed"] == 0 and "+mixup" in t["change"] and t["time_to_target_s"] is not None]
    assert lucky and min(t["time_to_target_s"] for t in lucky) < min(
        t["time_to_target_s"] for t in search if "+mixup" not in t["change"] and t["time_to_target_s"])
    # every move comes from a recipe that held its lead on a second seed: never from the lucky one
    lucky_numbers = {t["number"] for t in lucky}
    assert not [t for t in search if t["move"] and any(f"(from #{n})" in t["move"] for n in lucky_numbers)]
    winner = next(c for c in candidates(result.summary["confirmation"]) if c["role"] == "winner")
    assert "label_smoothing" in winner["recipe"]["methods"] and "mixup" not in winner["recipe"]["methods"]
    # the report ranks recipes as the search does: the lucky one shows both its seeds' times
    rows = [line for line in result.report_path.read_text().splitlines() if line.startswith("| search | ")]
    lucky_rows = [row for row in rows if any(row.startswith(f"| search | {n} |") for n in lucky_numbers)]
    assert lucky_rows and all(" / " in row for row in lucky_rows)


def test_the_speedup_is_measured_against_the_base_as_given_where_it_beats_the_tuned_baseline(tmp_path, fake_env):
    """The baseline plan ranks on seed 0: a learning rate that is lucky there becomes the tuned baseline.
    The confirmation runs the base as given beside it, and measures against whichever is faster on its seeds."""
    import yaml

    result = tune(TuneSettings("fashion-mnist", searched_methods=["label_smoothing"], out_dir=tmp_path,
                               runner="tune_fakes:lucky_lr_run",
                  budget=120, trial_limit=12, max_trials=4, max_baseline_trials=2, seeds_to_confirm=2,
                  tune_hparams=False, pruner="none", **SMALL), **QUIET)
    confirmation = result.summary["confirmation"]
    rows = {c["role"]: c for c in candidates(confirmation)}
    tuned, given = rows["baseline"], rows["baseline as given"]
    assert tuned["recipe"]["optimizer"]["lr"] != pytest.approx(0.1) and given["recipe"]["optimizer"]["lr"] == 0.1
    # the lucky learning rate is slower on seeds 1 and 2
    assert given["median_time_to_target_s"] < tuned["median_time_to_target_s"]
    assert confirmation["strongest_baseline"] == given["key"]
    winner = confirmation["recipes"][confirmation["best_recipe"]]
    assert winner["speedup"] == pytest.approx([b / w for b, w in zip(given["time_to_target_s"],
                                                                       winner["time_to_target_s"])])
    shipped = yaml.safe_load((tmp_path / "baseline.yaml").read_text())
    assert shipped["optimizer"]["lr"] == 0.1 and shipped["reached"]
    report = result.report_path.read_text()
    assert "| baseline as given (reference) |" in report and "Speed-up over the baseline as given" in report


def test_standings_rank_each_recipe_by_its_worst_seed_and_a_pruned_second_seed_as_a_miss():
    from speedkit.experiments.tune.search import REPEAT_SEED, standings

    base = get_recipe("fashion-mnist", "plain-bf16")
    lucky, steady = base.with_changes(methods={"mixup": {}}), base.with_changes(methods={"label_smoothing": {}})
    study = optuna.create_study()

    def add(recipe, value, state="COMPLETE", **attrs):
        reached = None if state == "PRUNED" else value
        study.add_trial(optuna.trial.create_trial(
            state=getattr(optuna.trial.TrialState, state), value=value if state == "COMPLETE" else None,
            user_attrs={"recipe": recipe.to_dict(), "time_to_target_s": reached, **attrs}))

    add(lucky, 5.0)  # trial 0: the fastest on its one seed...
    add(steady, 8.0)
    assert [s.first.number for s in standings(study)] == [0, 1] and standings(study)[0].needs_repeat(study.trials)
    add(steady, 9.0, repeat_of=1, seed=REPEAT_SEED)
    add(lucky, None, "PRUNED", repeat_of=0, seed=REPEAT_SEED)  # ...stopped behind the others on its second
    ranking = standings(study)
    assert [(s.first.number, s.seeds, s.score) for s in ranking] == [(1, 2, 9.0), (0, 2, float("inf"))]
    assert ranking[0].reached and not ranking[1].reached and not ranking[0].needs_repeat(study.trials)


def test_the_confirmation_keeps_back_a_baselines_whole_budget():
    """The baseline reached the target at 80% of its budget on the search's seed; on a confirmation seed where it
    misses it trains to the end, so the reserve holds its whole budget (counting the seed-0 run, the search on
    the held-out Perl docs overran its 20 minutes by two). A search trial is counted as it ran, and so is a
    baseline that reached the target with most of its budget to spare."""
    from types import SimpleNamespace

    from speedkit.experiments.baseline_plan import Outcome
    from speedkit.experiments.tune.search import BASE_START, BaselineRun, baseline_plan, confirm_reserve_s

    config = SimpleNamespace(budget_s=1000.0, limit_s=200.0, metric="eval/accuracy",
                             base_recipe=lambda: get_recipe("fashion-mnist", "baseline"),
                             settings=SimpleNamespace(seeds_to_confirm=3, leave_one_out=False, lr_factor=10.0,
                                                      duration_scale_range=(0.1, 1.0)))
    search = optuna.create_study()
    search.add_trial(optuna.trial.create_trial(value=10.0, user_attrs={
        "wall_s": 20.0, "budget_done": 0.8, "time_to_target_s": 10.0}))

    def baselines(done):  # the plan's first run, the base as given
        point = baseline_plan(config).grid()[0]
        return [BaselineRun(0, point, Outcome(point, 40, 0.9, 80.0), {
            "wall_s": 100.0, "budget_done": done, "time_to_target_s": 80.0, "start_from": BASE_START,
            "failed": None})]
    assert confirm_reserve_s(config, search, baselines(0.8)) == pytest.approx(3 * (100 / 0.8 + 20))
    assert confirm_reserve_s(config, search, baselines(1 / 3)) == pytest.approx(3 * (100 + 20))


def test_a_folder_task_is_searched_by_two_worker_processes(tmp_path, fake_env, monkeypatch):
    """``speedkit tune --task image-folder --data DIR --workers 2``: the second process builds the folder's task
    again from the config (its name, folder and options) and works on the same study."""
    import numpy as np
    from PIL import Image

    from speedkit.cli.main import main

    rng = np.random.default_rng(0)
    for label in ("cats", "dogs"):
        (tmp_path / "images" / label).mkdir(parents=True)
        for i in range(12):
            Image.fromarray(rng.integers(0, 255, (16, 16), dtype=np.uint8)).save(tmp_path / "images" / label / f"{i}.png")
    import tune_fakes

    (tmp_path / "arrived").mkdir()
    monkeypatch.setenv("TUNE_FAKE_RENDEZVOUS", f"{tmp_path / 'arrived'}:2")  # both processes in before any run ends
    monkeypatch.setattr(tune_fakes, "_met", False)  # this process may have met others in an earlier test
    monkeypatch.setenv("TUNE_FAKE_PACE", "0.1")
    out = tmp_path / "out"
    assert main(["tune", "--task", "image-folder", "--data", str(tmp_path / "images"), "--image-size", "16",
                 "--methods", "label_smoothing", "--budget", "60s", "--seeds", "1", "--trial-limit", "12",
                 "--max-trials", "4", "--max-baseline-trials", "1", "--workers", "2", "--out", str(out),
                 "--runner", FAKE]) == 0
    config = json.loads((out / "tune_config.json").read_text())
    assert config["task_source"] == {"task": "image-folder", "data": str((tmp_path / "images").resolve()),
                                     "options": {"image_size": 16}}
    storage = str(out / "study.journal")
    workers = {t.user_attrs.get("worker") for t in _search_trials(storage)}
    assert len(workers) == 2, (out / "worker-1.log").read_text()[-2000:]


def test_a_task_object_made_here_is_refused_for_worker_processes_with_the_fix(tmp_path):
    from speedkit.tasks import resolve_task

    with pytest.raises(TuneInputError, match=r"package.module:attr"):
        tune(TuneSettings(dataclasses_replace_name(resolve_task("fashion-mnist"), "my-task"), n_workers=2, out_dir=tmp_path,
             budget=10, **SMALL), **QUIET)


def dataclasses_replace_name(task, name: str):
    import dataclasses

    return dataclasses.replace(task, name=name)


def test_the_confirmation_is_planned_to_end_within_the_budget(tmp_path, fake_env, monkeypatch):
    """Runs of 1-2 s real time and a 12 s budget: three seeds of the baseline and the winner do not fit beside
    a search, so it confirms on fewer, says so, and the whole search keeps to its budget. (The baseline plan is
    held to one run, so that its grid does not decide how much of the 12 s the search has.)"""
    monkeypatch.setenv("TUNE_FAKE_PACE", "0.5")
    result = tune(TuneSettings("fashion-mnist", searched_methods=["label_smoothing", "ema"], out_dir=tmp_path,
                               runner=FAKE, budget=12, max_baseline_trials=1,
                  trial_limit=12, seeds_to_confirm=3, tune_hparams=False, **SMALL), **QUIET)
    confirmation = result.summary["confirmation"]
    assert 1 <= len(confirmation["seeds"]) < 3
    assert [c["role"] for c in candidates(confirmation)] == ["baseline", "winner"]  # no room for the runner-up
    assert result.summary["spent_s"] <= 12 + 2.5, result.summary["time"]  # one fake run's slack
    assert f"Confirmed on {len(confirmation['seeds'])} of the 3 seeds asked for" in result.report_path.read_text()


def test_a_baseline_that_never_reaches_the_target_is_named_with_the_target_it_does_reach():
    """A folder task's default target can lie out of its baseline's reach: the report says so, and the rerun."""
    from speedkit.experiments.report import baseline_shortfall

    def summary(metric, finals, reached=(), confirmed=0):
        trials = [{"phase": "baseline", "state": "complete", "final": f, "time_to_target_s": 9.0 if i in reached else None}
                  for i, f in enumerate(finals)]
        trials.append({"phase": "search", "state": "complete", "final": 0.1, "time_to_target_s": 3.0})
        return {"target": {"metric": metric, "value": 2.5}, "trials": trials,
                "confirmation": {"baselines": {"baseline:0": {"role": "baseline", "reached": confirmed}}}}

    message = baseline_shortfall(summary("eval/bpb", [3.9, 3.7185, 3.8]))
    assert "none of its 3 run(s)" in message and "--target 3.719" in message  # bits per byte: lower is better
    assert "--target 0.88" in baseline_shortfall(summary("eval/accuracy", [0.85, 0.88]))
    assert baseline_shortfall(summary("eval/bpb", [3.9, 2.4], reached={1})) is None
    assert baseline_shortfall(summary("eval/bpb", [3.9], confirmed=1)) is None  # reached on a confirmation seed


def test_the_search_and_the_benchmark_write_numbers_alike():
    """One report module: a trial that missed the target shows the same mark for its missing time as a benchmark
    row with no time, and numbers are rounded the same way in both."""
    from speedkit.experiments.report import leave_one_out_markdown, trials_table

    trial = {"phase": "search", "number": 4, "final": 0.91234, "time_to_target_s": None, "change": "+ema",
             "seed": 0}
    search_row = trials_table([(12.345, trial, [trial])])[-1]
    bench_row = leave_one_out_markdown({"of": "mild", "time_to_target_s": 10.0, "parts": {"ema": {
        "time_without_s": 12.0, "slowdown": None, "share": None, "pays_off": None, "final_metric": 0.91234}}})[-1]
    assert "| 12.35 | — | 0.9123 |" in search_row, search_row
    assert "| — | — | — | 0.9123 |" in bench_row, bench_row


def test_a_trials_run_is_the_searchs_run_request_with_its_recipe_seed_and_name():
    """A trial's context holds one RunRequest, the search's ``run`` with the trial's recipe, seed and name: any
    setting of that request (here the loader workers) reaches every trial, not only the four the search copied."""
    from speedkit.experiments.tune.objective import trial_request
    from speedkit.experiments.tune.search import trial_context

    settings = TuneSettings(run=RunRequest("fashion-mnist", device="cpu", num_workers=0, run_dir="runs",
                                           eval_interval="2ba"))
    config = TuneConfig(settings=settings, metric="eval/accuracy", target=0.9, base={}, space={}, budget_s=60.0,
                        limit_s=12.0, started_at=time.time(), spent_before_s=0.0)
    recipe = get_recipe("fashion-mnist", "mild")
    request = trial_request(trial_context(config, "search", recipe, 3, "tune-search-t7"))
    assert request == settings.run.replace(recipe=recipe, seed=3, run_name="tune-search-t7", target=0.9,
                                           stop_at_target=True, save_checkpoints=False, overwrite=True,
                                           progress_bar=False, extra_config=request.extra_config)
    assert request.extra_config["tune"] == {"study": "tune", "phase": "search", "trial": None, "target": 0.9}


def test_the_confirmation_is_runs_in_the_run_folder_and_a_continued_search_runs_only_what_is_missing(tmp_path,
                                                                                                    fake_env):
    """Confirmation runs are RunRecords in the run folder, found again by their candidate: the same command run
    again confirms from them without running any again; a run a kill cut short (its record there, but not yet
    listed as measured in the search's plan) runs again, and so does a run whose recipe is not the candidate's (a
    key names a trial, and a new study numbers its trials anew), so nothing is judged on a run of another recipe."""
    from speedkit.experiments.tune.storage import read_plan, update_plan

    settings = TuneSettings("fashion-mnist", searched_methods=["ema", "label_smoothing"], out_dir=tmp_path,
                            runner=FAKE, budget=60, trial_limit=12, max_trials=4, max_baseline_trials=1,
                            seeds_to_confirm=2, tune_hparams=False, **SMALL)
    first = tune(settings, **QUIET)

    def confirmation_starts() -> list[str]:
        return [line.split()[1] for line in fake_env.read_text().splitlines()
                if line.startswith("start") and "-confirm-" in line]

    ran = confirmation_starts()
    assert len(ran) == 2 * len(candidates(first.summary["confirmation"]))
    again = tune(settings, **QUIET)
    assert confirmation_starts() == ran  # nothing ran again
    assert again.summary["confirmation"] == first.summary["confirmation"]

    winner_key = first.summary["confirmation"]["best_recipe"]
    winner = first.summary["confirmation"]["recipes"][winner_key]
    cut_short, other_recipe = (RunRecord.load(tmp_path / "runs" / name) for name in winner["runs"])
    study = optuna.load_study(study_name="tune", storage=_storage(str(tmp_path / "study.journal")))
    update_plan(study, measured=[run for run in read_plan(study)["measured"] if run["run"] != cut_short.run_id])
    other_recipe.config["tune"]["recipe"]["methods"] = {}
    other_recipe.save()
    third = tune(settings, **QUIET)
    assert confirmation_starts() == ran + winner["runs"]
    assert third.summary["confirmation"]["best_recipe"] == winner_key
