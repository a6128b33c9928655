"""The public Task: a user's own model and data through make_trainer, the one resolver of a task, the
built-in tasks defined with it, and the errors for a task that cannot run (before training starts)."""
from __future__ import annotations

import sys
import textwrap

import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

import speedkit
from speedkit.data import load_fashion_mnist
from speedkit.record.metrics import Accuracy, CrossEntropy
from speedkit.tasks import TASKS, get_task, make_trainer, register_task, resolve_task
from speedkit.tasks import Recipe, get_recipe
from speedkit.tasks.task import BUILT_IN

pytestmark = pytest.mark.prerequisite("fashion-mnist")  # the user's data here is real images


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.AdaptiveAvgPool2d(4), nn.Flatten())
        self.head = nn.Linear(32 * 16, classes)

    def forward(self, x):
        return self.head(self.features(x))


def fashion_tensors(n: int, split: str = "train"):
    """The first ``n`` real Fashion-MNIST images as normalised float tensors, and their labels."""
    arrays = load_fashion_mnist()
    x = arrays.train_x[:n] if split == "train" else arrays.test_x[:n]
    y = arrays.train_y[:n] if split == "train" else arrays.test_y[:n]
    return ((x.float() / 255 - arrays.mean) / arrays.std).unsqueeze(1), y.long()


def user_task(name: str = "my-fashion", classes: int = 10, **changes) -> speedkit.Task:
    """A task as a user writes one: their CNN, their in-memory data in a DataLoader, their recipe."""
    train_x, train_y = fashion_tensors(2048)
    val_x, val_y = fashion_tensors(512, "test")

    def train_data(request: speedkit.DataRequest):
        keep = int(len(train_y) * request.data_fraction)
        generator = torch.Generator().manual_seed(request.seed)
        return DataLoader(TensorDataset(train_x[:keep], train_y[:keep]), batch_size=request.batch_size,
                          shuffle=True, generator=generator)

    def eval_data(request: speedkit.DataRequest):
        return DataLoader(TensorDataset(val_x, val_y), batch_size=256)

    baseline = Recipe(name="baseline", task=name, domain="vision", model="small-cnn", duration="2ep", batch_size=64,
                      optimizer={"name": "adamw", "lr": 3e-3}, eval_interval="1ep")
    fields = dict(name=name, domain="vision", model=lambda model_name: SmallCNN(classes), train_data=train_data,
                  eval_data=eval_data, metrics=lambda: {"accuracy": Accuracy(), "loss": CrossEntropy()},
                  target_metric="eval/accuracy", target_value=0.7, recipes={"baseline": baseline})
    return speedkit.Task(**{**fields, **changes})



def test_a_user_task_trains_through_make_trainer(tmp_path):
    task = user_task()
    trainer = make_trainer(task, "baseline", run_dir=tmp_path, save_checkpoints=False)
    record = trainer.fit()
    assert record.status == "completed"
    assert record.config["task"] == "my-fashion"
    assert record.target == {"metric": "eval/accuracy", "value": 0.7}
    assert record.final_metrics["eval/accuracy"] > 0.6  # chance is 0.1: it learned from the real images
    assert get_task("my-fashion") is task  # resolving registered it, so its name now works everywhere
    assert get_recipe("my-fashion", "baseline").model == "small-cnn"


def test_a_user_task_takes_speedup_methods_from_a_recipe(tmp_path):
    task = user_task()
    trainer = make_trainer(task, "baseline", methods={"label_smoothing": {"smoothing": 0.1}, "channels_last": {}},
                           duration="4ba", run_dir=tmp_path, save_checkpoints=False)
    record = trainer.fit()
    assert sorted(m["name"] for m in record.methods) == ["channels_last", "label_smoothing"]
    assert record.status == "completed"


def test_the_built_in_tasks_are_tasks_like_any_other():
    for name in ("fashion-mnist", "pydocs"):
        task = TASKS[name]
        assert isinstance(task, speedkit.Task) and name in BUILT_IN
        assert "baseline" in task.recipes and task.recipes["baseline"].task is None  # the task says whose
        assert (task.recipe("baseline").task, task.recipe("baseline").domain) == (name, task.domain)
        assert resolve_task(name) is task
    assert TASKS["fashion-mnist"].model_fit_problem("torchvision:resnet18") is None
    assert "does not fit" in TASKS["fashion-mnist"].model_fit_problem("gpt-nano")
    assert TASKS["fashion-mnist"].model_names == ["resnet8", "resnet9"]


def test_the_resolver_takes_a_module_attribute_and_a_function(tmp_path, monkeypatch):
    (tmp_path / "my_tasks.py").write_text(textwrap.dedent("""
        from test_tasks import user_task
        task = user_task("from-module")
        def make(data=None):
            return user_task("from-function" if data is None else "with-data-" + data)
        def not_a_task():
            return 42
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "test_tasks", sys.modules[__name__])
    assert resolve_task("my_tasks:task").name == "from-module"
    assert resolve_task("my_tasks:make").name == "from-function"
    assert resolve_task("my_tasks:make", data="x").name == "with-data-x"
    assert resolve_task(lambda: user_task("from-lambda")).name == "from-lambda"
    assert "from-module" in TASKS and "from-lambda" in TASKS
    with pytest.raises(TypeError, match="returned int, not a speedkit.Task"):
        resolve_task("my_tasks:not_a_task")
    with pytest.raises(ValueError, match="has no attribute 'nothing'"):
        resolve_task("my_tasks:nothing")


@pytest.mark.parametrize("task, data, message", [
    ("no_such_module_h12:task", None, "cannot import module 'no_such_module_h12'.*on the Python path"),
    ("no-such-task", None, r"unknown task 'no-such-task'.*fashion-mnist.*image-folder.*package.module:attr"),
    ("pydocs", "/tmp", "loads its own data"),
    ("image-folder", None, r"give the folder \(--data DIR"),
    (":attr", None, "expected 'package.module:attr'"),
])
def test_a_task_that_cannot_be_found_is_refused_with_the_fix(task, data, message):
    with pytest.raises(ValueError, match=message):
        resolve_task(task, data)


def test_a_task_object_is_checked_when_made():
    with pytest.raises(ValueError, match=r"target_metric 'eval/acc' is not one of its metrics \['eval/accuracy'"):
        user_task(target_metric="eval/acc")
    with pytest.raises(ValueError, match="holding a 'baseline' Recipe"):
        user_task(recipes={})
    someone_elses = user_task("someone-else").recipes["baseline"]
    with pytest.raises(ValueError, match=r"task='someone-else'.*it must say name='baseline' and leave out task and "
                                         r"domain \(or say task='other'"):
        user_task(name="other", recipes={"baseline": someone_elses})
    with pytest.raises(ValueError, match="domain must be one of"):
        user_task(domain="audio")
    with pytest.raises(TypeError, match="train_data must be a function"):
        user_task(train_data=[1, 2])
    with pytest.raises(TypeError, match="flips_keep_labels must be True or False"):
        user_task(flips_keep_labels="no")


def test_a_built_in_name_cannot_be_taken_and_a_taken_name_needs_replace():
    baseline = get_recipe("fashion-mnist", "baseline")
    with pytest.raises(ValueError, match="'fashion-mnist' is built in; give your task another name"):
        register_task(user_task("fashion-mnist", recipes={"baseline": baseline}))
    register_task(user_task("mine"))
    with pytest.raises(ValueError, match="pass replace=True"):
        register_task(user_task("mine"))
    assert register_task(user_task("mine"), replace=True).name == "mine"


def test_a_model_whose_outputs_do_not_fit_the_labels_is_refused_before_training(tmp_path):
    task = user_task(classes=3)  # Fashion-MNIST labels go up to 9
    with pytest.raises(ValueError, match=r"task 'my-fashion'.*labels.*outside \[0, 2\]"):
        make_trainer(task, "baseline", run_dir=tmp_path, save_checkpoints=False)


def test_a_model_that_cannot_take_the_inputs_is_refused_before_training(tmp_path):
    task = user_task(model=lambda name: nn.Linear(5, 10))
    with pytest.raises(ValueError, match=r"task 'my-fashion': its model Linear cannot take its data"):
        make_trainer(task, "baseline", run_dir=tmp_path, save_checkpoints=False)


def test_an_unknown_model_name_for_a_task_names_the_ones_that_fit(tmp_path):
    with pytest.raises(ValueError, match=r"model 'resnet8' does not fit task 'my-fashion'; use one of \['small-cnn'\]"):
        make_trainer(user_task(), "baseline", model="resnet8", run_dir=tmp_path)


def test_fashion_mnist_evaluates_on_the_test_set_its_loaders_give():
    from speedkit.data import fashion_mnist_loaders
    from speedkit.tasks.builtin.fashion_mnist import fashion_mnist_eval

    request = speedkit.DataRequest(batch_size=64, device=torch.device("cpu"), seed=3, eval_fraction=0.05)
    _, expected = fashion_mnist_loaders(batch_size=64, seed=3, eval_fraction=0.05)
    for (x, y), (ex, ey) in zip(fashion_mnist_eval(request), expected, strict=True):
        assert torch.equal(x, ex) and torch.equal(y, ey)


class DictCNN(SmallCNN):
    def forward(self, pixel_values, labels=None):
        return super().forward(pixel_values)


def test_a_task_whose_dict_batches_carry_no_labels_is_refused_before_training(tmp_path):
    def dicts(request):
        x, _ = fashion_tensors(64)
        return [{"pixel_values": x}]

    task = user_task("unlabelled", model=lambda name: DictCNN(), train_data=dicts, eval_data=dicts,
                     recipes={"baseline": user_task("unlabelled").recipes["baseline"]})
    with pytest.raises(ValueError, match=r"task 'unlabelled': .* no 'labels' .*add the labels under 'labels'"):
        make_trainer(task, "baseline", run_dir=tmp_path)
    assert "unlabelled" not in TASKS  # a refused task is not registered


def test_a_registered_task_leaves_bare_preset_names_to_the_built_in_presets():
    from speedkit.models import get_model
    from speedkit.tasks import recipe_parts

    register_task(user_task("has-a-baseline"))  # a vision "baseline" beside fashion-mnist's
    parts = recipe_parts("baseline", get_model("resnet8"))
    assert parts["config"]["recipe_spec"]["task"] == "fashion-mnist"
    assert recipe_parts("has-a-baseline:baseline")["config"]["recipe_spec"]["model"] == "small-cnn"


def test_a_user_task_is_benchmarked_against_its_baseline_from_the_library_and_the_cli(tmp_path, monkeypatch):
    """`speedkit bench` takes a user's task like the built-in ones: its recipes against its baseline,
    interleaved by seed, its entry keyed by its name beside the others in summary.json."""
    from speedkit.cli.main import main
    from speedkit.experiments.bench import run_benchmark

    task = user_task("bench-me")
    task.recipes["one-epoch"] = task.recipes["baseline"].with_changes(
        name="one-epoch", duration="1ep", methods={"label_smoothing": {"smoothing": 0.1}})
    result = run_benchmark(task, seeds=2, recipes=["one-epoch"], baselines=["baseline"], out_dir=tmp_path / "out",
                           run_dir=tmp_path / "runs", figures=False, log=lambda line: None)
    assert result.key == "bench-me" and list(result.summary) == ["bench-me"]
    assert [r.config["recipe"] for r in result.records] == ["baseline", "one-epoch"] * 2  # A B A B
    entry = result.entry
    assert set(entry["baselines"]) == {"baseline"} and set(entry["recipes"]) == {"one-epoch"}
    assert entry["target"] == {"metric": "eval/accuracy", "value": 0.7}
    assert entry["recipes"]["one-epoch"]["budget"] == "1ep" and entry["baselines"]["baseline"]["budget"] == "2ep"
    assert len(entry["recipes"]["one-epoch"]["final_metric"]) == 2

    (tmp_path / "bench_tasks.py").write_text("from test_tasks import user_task\ntask = user_task('bench-cli')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "test_tasks", sys.modules[__name__])
    assert main(["bench", "--task", "bench_tasks:task", "--seeds", "1", "--recipes", "hot", "--out", str(tmp_path / "out"),
                 "--run-dir", str(tmp_path / "cli-runs"), "--no-figures"]) == 0
    summary = __import__("json").loads((tmp_path / "out" / "summary.json").read_text())
    assert set(summary) == {"bench-me", "bench-cli"}  # merged beside the first task's entry
    assert summary["bench-cli"]["baselines"]["baseline"]["runs"] == ["bench-cli-baseline-s0"]
    # by default against each of the task's baselines (the rebuilt plain-bf16 too); the strongest is the one
    # that reached the target first on this machine (bf16 is slower where the CPU emulates it)
    baselines = summary["bench-cli"]["baselines"]
    assert set(baselines) == {"baseline", "plain-bf16"}
    reached = {name: entry["time_to_target_s"][0] for name, entry in baselines.items()
               if entry["time_to_target_s"][0] is not None}
    assert reached and summary["bench-cli"]["strongest_baseline"] == min(reached, key=reached.get)
    # the vision ladder's hot on its 2ep baseline is 1ep, 32 steps here: planned up to the baseline's 64, as
    # `speedkit train --recipe hot` plans it
    assert summary["bench-cli"]["recipes"]["hot"]["budget"] == "64ba"
    with pytest.raises(ValueError, match="unknown benchmark task 'nothing-such'.*register_task"):
        from speedkit.experiments.bench import get_profile
        get_profile("nothing-such")


def test_a_benchmark_split_by_seeds_across_processes_is_reported_whole_with_reuse(tmp_path, monkeypatch, capsys):
    """Two `speedkit bench --seeds` invocations (one per core) fill one --run-dir; `--reuse` then reports all
    seeds as one benchmark, from the runs as they were, paired by seed."""
    import json

    from speedkit.cli.main import main

    (tmp_path / "split_tasks.py").write_text("from test_tasks import user_task\ntask = user_task('bench-split')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "test_tasks", sys.modules[__name__])
    common = ["bench", "--task", "split_tasks:task", "--recipes", "hot", "--baselines", "baseline", "--duration", "6ba",
              "--run-dir", str(tmp_path / "runs"), "--no-figures"]
    assert main([*common, "--seeds", "1-1", "--out", str(tmp_path / "one")]) == 0
    assert main([*common, "--seeds", "0,", "--out", str(tmp_path / "zero")]) == 0
    assert json.loads((tmp_path / "one" / "summary.json").read_text())["bench-split"]["seeds"] == [1]
    assert main([*common, "--seeds", "2", "--reuse", "--out", str(tmp_path / "whole")]) == 0
    entry = json.loads((tmp_path / "whole" / "summary.json").read_text())["bench-split"]
    assert entry["seeds"] == [0, 1]
    assert entry["recipes"]["hot"]["runs"] == ["bench-split-hot-s0", "bench-split-hot-s1"]
    assert entry["baselines"]["baseline"]["runs"] == ["bench-split-baseline-s0", "bench-split-baseline-s1"]
    # another --target judges the same runs at it, the headline included (the runs had the task's 0.7)
    assert main([*common, "--seeds", "2", "--reuse", "--target", "0.5", "--out", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "summary.json").read_text())["bench-split"]
    assert again["target"] == {"metric": "eval/accuracy", "value": 0.5}
    for name, runs in (("hot", again["recipes"]["hot"]), ("baseline", again["baselines"]["baseline"])):
        assert runs["time_to_target_s"] == runs["time_to"]["0.5"], name
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        main([*common, "--seeds", "1,1"])
    assert refused.value.code == 2
    assert "'1,1' is not seeds; give a count (3), a list (0,1) or a range (4-6)" in capsys.readouterr().err


def test_only_runs_the_named_recipes_and_keeps_the_others_runs(tmp_path, monkeypatch, capsys):
    """`speedkit bench --only hot` runs hot again on every seed and pairs it with the baseline runs already in
    --run-dir, untouched; what it cannot keep is named before anything runs."""
    import json

    from speedkit.cli.main import main
    from speedkit.record.runs import load_records

    (tmp_path / "only_tasks.py").write_text("from test_tasks import user_task\ntask = user_task('bench-only')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "test_tasks", sys.modules[__name__])
    runs = tmp_path / "runs"
    common = ["bench", "--task", "only_tasks:task", "--recipes", "hot", "--baselines", "baseline", "--duration", "6ba",
              "--run-dir", str(runs), "--no-figures", "--seeds", "2"]
    capsys.readouterr()
    assert main([*common, "--only", "hot", "--out", str(tmp_path / "none")]) == 2
    refusal = capsys.readouterr().err
    assert "no finished bench-only run for baseline seed 0, baseline seed 1 (runs on other data" in refusal
    assert "; run them too (leave out --only" in refusal
    assert not runs.exists() or not load_records(runs)  # refused before any run
    assert main([*common, "--out", str(tmp_path / "first")]) == 0
    first = {r.run_id for r in load_records(runs)}
    assert main([*common, "--only", "hot", "--out", str(tmp_path / "again")]) == 0
    new = [r for r in load_records(runs) if r.run_id not in first]
    assert sorted(r.config["recipe"] for r in new) == ["hot", "hot"]  # hot ran again on both seeds, nothing else
    entry = json.loads((tmp_path / "again" / "summary.json").read_text())["bench-only"]
    before = json.loads((tmp_path / "first" / "summary.json").read_text())["bench-only"]
    assert entry["seeds"] == [0, 1]
    assert set(entry["recipes"]["hot"]["runs"]) == {r.name for r in new}
    assert entry["baselines"]["baseline"]["runs"] == before["baselines"]["baseline"]["runs"]
    assert entry["baselines"]["baseline"]["time_to_target_s"] == before["baselines"]["baseline"]["time_to_target_s"]
    capsys.readouterr()
    assert main([*common, "--only", "mild", "--out", str(tmp_path / "x")]) == 2
    assert "--only mild: ['mild'] is not among this benchmark's recipes" in capsys.readouterr().err
    assert main([*common, "--only", "hot", "--reuse", "--out", str(tmp_path / "x")]) == 2
    assert "--reuse reuses them all: give one" in capsys.readouterr().err


def test_an_option_a_folder_task_or_a_task_function_does_not_take_is_named_with_those_it_takes(tmp_path):
    from speedkit.tasks import find_task

    with pytest.raises(ValueError, match=r"task 'image-folder' takes no option 'eval_image_size'.*image_size"):
        find_task("image-folder", tmp_path, eval_image_size=64)

    def my_task(data=None, width: int = 8):
        raise AssertionError("not called with an option it does not take")

    with pytest.raises(ValueError, match=r"takes no option 'widht' \(did you mean 'width'\?\); its options: width"):
        find_task(my_task, widht=16)
