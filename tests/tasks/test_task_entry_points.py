"""A user's task through every entry point but the benchmark: ``speedkit train --task pkg.mod:attr`` and
``--task image-folder --data DIR``, ``speedkit tune`` with a Task, and ``MethodExplorer(task=...)`` with the
methods that do not fit the user's model greyed, each with its reason."""
from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path

import pytest
from prerequisites import import_or_missing
from test_folder_tasks import write_image_folder
from test_tasks import user_task

from speedkit.cli.main import main
from speedkit.tasks import TASKS

pytestmark = pytest.mark.prerequisite("fashion-mnist")



def _record(run_dir: Path) -> dict:
    (record,) = run_dir.glob("*/record.json")
    return json.loads(record.read_text())


# -- speedkit train --------------------------------------------------------------------------
def test_train_takes_a_task_from_a_module_in_the_current_folder(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_project_tasks.py").write_text(textwrap.dedent("""
        from test_tasks import user_task
        fashion = user_task("cli-fashion")
    """))
    monkeypatch.chdir(tmp_path)
    code = main(["train", "--task", "my_project_tasks:fashion", "--duration", "6ba", "--run-dir", "runs",
                 "--no-progress"])
    assert code == 0, capsys.readouterr().err
    record = _record(tmp_path / "runs")
    assert record["config"]["task"] == "cli-fashion" and record["status"] == "completed"
    assert "completed" in capsys.readouterr().out


def test_train_takes_an_image_folder(tmp_path, capsys):
    data = write_image_folder(tmp_path / "pictures", per_class=12)
    code = main(["train", "--task", "image-folder", "--data", str(data), "--image-size", "20", "--duration", "2ba",
                 "--run-dir", str(tmp_path / "runs"), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    record = _record(tmp_path / "runs")
    assert record["config"]["task"] == "image-folder" and record["status"] == "completed"
    assert "20x20" in TASKS["image-folder"].summary


@pytest.mark.parametrize("args, message", [
    (["--task", "not_a_module_anywhere:task"], "cannot import module 'not_a_module_anywhere'"),
    (["--task", "image-folder"], r"give the folder \(--data DIR"),
    (["--task", "text-folder", "--data", "{empty}"], "no files ending in"),
    (["--task", "image-folder", "--data", "{empty}"], "has no class subfolders"),
    (["--task", "fashion-mnist", "--data", "{empty}"], "loads its own data"),
])
def test_train_refuses_a_task_it_cannot_build_before_training(tmp_path, capsys, args, message):
    empty = tmp_path / "empty"
    empty.mkdir()
    args = [a.replace("{empty}", str(empty)) for a in args]
    assert main(["train", *args, "--run-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("speedkit: error:")
    assert re.search(message, err), err
    assert not (tmp_path / "runs").exists()  # refused before any run folder was made


# -- speedkit tune ---------------------------------------------------------------------------
def test_tune_searches_a_user_task(tmp_path, monkeypatch):
    import_or_missing("optuna")
    from speedkit.experiments.tune import TuneInputError, TuneSettings, tune

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "support"))
    result = tune(TuneSettings(user_task("tuned-fashion"),
                               searched_methods=["label_smoothing", "low_precision_layernorm"],
                  out_dir=tmp_path, runner="tune_fakes:fake_run", budget=30, max_trials=2, max_baseline_trials=1,
                  seeds_to_confirm=1, data_fraction=0.25), log=lambda *_: None)
    assert result.summary["task"] == "tuned-fashion"
    assert result.summary["methods_searched"] == ["label_smoothing"]
    assert "found no nn.LayerNorm" in result.summary["left_out"]["low_precision_layernorm"]  # the user's CNN has none
    with pytest.raises(TuneInputError, match=r"cannot build task 'tuned-fashion'.*'package.module:attr'"):
        tune(TuneSettings(user_task("tuned-fashion"), n_workers=2, out_dir=tmp_path / "two", budget=30), log=lambda *_: None)


def test_two_worker_processes_tune_a_user_task_named_by_its_module(tmp_path, monkeypatch):
    """``--task two_worker_tasks:fashion --workers 2``: the second process imports the same module and works on the study.

    The module has a name no other test uses: an earlier test's ``my_tasks`` may sit in ``sys.modules``."""
    import_or_missing("optuna")
    import tune_fakes

    from speedkit.experiments.tune import TuneSettings, tune
    from speedkit.experiments.tune.storage import open_storage

    (tmp_path / "two_worker_tasks.py").write_text("from test_tasks import user_task\nfashion = user_task('two-workers')\n")
    monkeypatch.chdir(tmp_path)
    tests = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tests / "tasks"), str(tests / "support"), str(tmp_path)]))
    (tmp_path / "arrived").mkdir()
    monkeypatch.setenv("TUNE_FAKE_RENDEZVOUS", f"{tmp_path / 'arrived'}:2")  # both processes in before any run ends
    monkeypatch.setattr(tune_fakes, "_met", False)
    monkeypatch.setenv("TUNE_FAKE_PACE", "0.1")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = tune(TuneSettings("two_worker_tasks:fashion", searched_methods=["label_smoothing"],
                               out_dir=tmp_path / "out",
                  runner="tune_fakes:fake_run", budget=60, trial_limit=12, max_trials=4, max_baseline_trials=1,
                  seeds_to_confirm=1, data_fraction=0.25, n_workers=2), log=lambda *_: None)
    assert result.summary["task"] == "two-workers"
    import optuna

    storage = open_storage(result.storage)
    trials = optuna.load_study(study_name="tune", storage=storage).get_trials(deepcopy=False)
    log = (tmp_path / "out" / "worker-1.log").read_text()
    assert len({t.user_attrs.get("worker") for t in trials}) == 2, log[-2000:]


# -- the explorer ----------------------------------------------------------------------------
def test_the_explorer_opens_on_a_user_task_and_runs_it(tmp_path):
    pytest.importorskip("ipywidgets")
    from speedkit.ui import MethodExplorer

    explorer = MethodExplorer(task=user_task("explored"), run_dir=tmp_path, live=False)
    assert explorer.task.value == "explored" and "explored" in explorer.task.options
    assert {"fashion-mnist", "pydocs"} <= set(explorer.task.options)  # the dropdown lists every registered task
    # its baseline, the vision ladder rebuilt on it, and the explorer's own
    assert list(explorer.preset.options) == ["baseline", "plain-bf16", "mild", "medium", "hot", "custom"]
    assert explorer.model.value == "small-cnn"
    # Greyed with the reason: by domain (a language method), and by the user's model (no LayerNorm to act on).
    assert explorer.rows["rotary_embeddings"].checkbox.disabled
    layernorm = explorer.rows["low_precision_layernorm"]
    assert layernorm.checkbox.disabled and "found no nn.LayerNorm" in layernorm.checkbox.tooltip
    assert not explorer.rows["label_smoothing"].checkbox.disabled
    (record,) = explorer.run_all([{"recipe": "baseline", "methods": {"label_smoothing": {}}}], duration="4ba")
    assert record.status == "completed" and record.config["task"] == "explored"


def test_the_explorer_greys_what_the_chosen_model_lacks(tmp_path):
    pytest.importorskip("ipywidgets")
    from speedkit.ui import MethodExplorer

    explorer = MethodExplorer(task="fashion-mnist", run_dir=tmp_path, live=False)
    assert not explorer.rows["stochastic_depth"].checkbox.disabled  # resnet8 has residual blocks
    explorer.model.options = [*explorer.model.options, "torchvision:mobilenet_v3_small"]
    explorer.model.value = "torchvision:mobilenet_v3_small"
    row = explorer.rows["stochastic_depth"]
    assert row.checkbox.disabled and "found no residual blocks" in row.checkbox.tooltip


def test_the_explorer_greys_what_the_tasks_dict_batches_do_not_allow(tmp_path):
    pytest.importorskip("ipywidgets")
    from test_tasks import DictCNN, fashion_tensors
    from torch.utils.data import DataLoader, TensorDataset

    from speedkit.ui import MethodExplorer

    x, y = fashion_tensors(256)

    def dicts(request):
        loader = DataLoader(TensorDataset(x, y), batch_size=request.batch_size)
        return [{"pixel_values": images, "labels": labels} for images, labels in loader]

    task = user_task("dict-batches", model=lambda name: DictCNN(), train_data=dicts, eval_data=dicts,
                     recipes={"baseline": user_task("dict-batches").recipes["baseline"]})
    explorer = MethodExplorer(task=task, run_dir=tmp_path, live=False)
    for method in ("label_smoothing", "mixup", "cutmix", "selective_backprop", "test_time_augmentation"):
        row = explorer.rows[method]
        assert row.checkbox.disabled and "cannot act on this batch (a dict with keys" in row.checkbox.tooltip, method
    for method in ("cutout", "channels_last", "progressive_resizing"):
        assert not explorer.rows[method].checkbox.disabled, method
    (record,) = explorer.run_all([{"recipe": "baseline", "methods": {"cutout": {}}}], duration="3ba")
    assert record.status == "completed"
