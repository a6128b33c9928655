"""The tasks over a user's own files: ``image-folder`` (class folders of images) and ``text-folder`` (a folder
of text files), each with a default model and recipe that train as they are, models by library name, and
clear errors for a folder that holds nothing to train on."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from cli_child import speedkit_train
from prerequisites import import_or_missing

from speedkit.data import load_fashion_mnist
from speedkit.data.text import DEFAULT_TEXT_ROOT
from speedkit.tasks import TASKS, make_trainer, resolve_task

pytestmark = pytest.mark.prerequisite("fashion-mnist", "python-docs")  # the folders hold real files
CLASSES = {0: "tshirt", 1: "trouser", 7: "sneaker"}  # three Fashion-MNIST classes, easy to tell apart


def write_image_folder(root: Path, per_class: int, rgb: bool = False, offset: int = 0) -> Path:
    """Real Fashion-MNIST images written as PNG files into root/<class>/."""
    arrays = load_fashion_mnist()
    labels = arrays.train_y.numpy()
    for label, name in CLASSES.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i, index in enumerate(np.flatnonzero(labels == label)[offset:offset + per_class]):
            pixels = arrays.train_x[index].numpy()
            image = Image.fromarray(pixels, mode="L")
            (image.convert("RGB") if rgb else image).save(folder / f"{i:03d}.png")
    return root



@pytest.fixture(scope="module")
def image_dir(tmp_path_factory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("images"), per_class=80)


def test_image_folder_trains_with_its_default_model_and_recipe(image_dir, tmp_path):
    trainer = make_trainer("image-folder", "baseline", data=image_dir, duration="3ep", run_dir=tmp_path,
                           save_checkpoints=False)
    task = TASKS["image-folder"]
    assert task.summary.startswith("3-class images") and "1 channel" in task.summary  # grayscale PNGs: 1 channel
    record = trainer.fit()
    assert record.status == "completed" and record.config["task"] == "image-folder"
    assert record.final_metrics["eval/accuracy"] > 0.6  # chance is 1/3


def test_a_folder_tasks_benchmark_times_its_baselines_every_quarter_epoch_and_its_rungs_as_they_ship(image_dir):
    from speedkit.experiments.bench import get_profile

    resolve_task("image-folder", data=image_dir)
    profile = get_profile("image-folder", "cpu")
    assert TASKS["image-folder"].recipes["plain-bf16"].eval_interval == "1ep"  # evaluating once an epoch...
    assert profile.recipe("plain-bf16").eval_interval == "0.25ep"  # ...would round its time up to the epoch
    assert profile.recipe("hot").eval_interval == TASKS["image-folder"].recipes["hot"].eval_interval


def test_a_baseline_trained_to_its_target_is_timed_as_bench_times_it(image_dir):
    """`speedkit train --recipe plain-bf16 --stop-at-target` evaluates every quarter epoch, as bench does; a
    speed-up rung, a run without a target and a cadence the user gave keep theirs."""
    from speedkit.tasks import RunRequest
    from speedkit.tasks.build import request_recipe

    task = resolve_task("image-folder", data=image_dir)

    def cadence(recipe, **fields):
        return request_recipe(RunRequest.build("image-folder", recipe, data=image_dir, **fields), task).eval_interval

    assert cadence("plain-bf16") == "1ep"
    assert cadence("plain-bf16", stop_at_target=True) == "0.25ep"
    assert cadence("plain-bf16", stop_at_target=True, eval_interval="7ba") == "7ba"
    assert cadence("hot", stop_at_target=True) == task.recipes["hot"].eval_interval != "0.25ep"


def test_image_folder_reads_train_and_val_folders_in_colour(tmp_path):
    root = tmp_path / "data"
    write_image_folder(root / "train", per_class=20, rgb=True)
    write_image_folder(root / "val", per_class=5, rgb=True, offset=20)
    task = resolve_task("image-folder", data=root)
    from speedkit.tasks.builtin import load_image_folder

    arrays = load_image_folder(str(root.resolve()), 32, 0.1, 0)
    assert tuple(arrays.train_x.shape) == (60, 3, 32, 32) and tuple(arrays.val_x.shape) == (15, 3, 32, 32)
    assert arrays.classes == ("sneaker", "trouser", "tshirt")
    assert "3 channel" in task.summary


@pytest.mark.parametrize("name", ["torchvision:mobilenet_v3_small", "timm:resnet10t"])
def test_image_folder_trains_a_library_model_adapted_to_its_channels_and_classes(image_dir, tmp_path, name):
    if name.startswith("timm:"):
        import_or_missing("timm", "pip install 'torch-speedkit[timm]'")
    trainer = make_trainer("image-folder", "baseline", data=image_dir, model=name, duration="2ba", run_dir=tmp_path,
                           save_checkpoints=False, eval_fraction=0.5)
    first_conv = next(m for m in trainer.state.model.modules() if m.__class__.__name__ == "Conv2d")
    assert first_conv.in_channels == 1
    assert trainer.fit().status == "completed"


def test_a_library_model_that_does_not_exist_is_named(image_dir, tmp_path):
    with pytest.raises(ValueError, match="'no_such_net' is not a torchvision classification model"):
        make_trainer("image-folder", "baseline", data=image_dir, model="torchvision:no_such_net", run_dir=tmp_path)


def test_a_folder_without_images_is_refused_with_the_layout(tmp_path):
    (tmp_path / "cats").mkdir()
    (tmp_path / "cats" / "notes.txt").write_text("no pictures here")
    with pytest.raises(FileNotFoundError, match=r"class folder\(s\) cats hold no images.*expected the layout"):
        make_trainer("image-folder", data=tmp_path)
    with pytest.raises(FileNotFoundError, match="has no class subfolders"):
        make_trainer("image-folder", data=tmp_path / "cats")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        make_trainer("image-folder", data=tmp_path / "missing")


def test_one_class_folder_is_not_a_classification_task(tmp_path):
    write_image_folder(tmp_path, per_class=3)
    for name in ("trouser", "sneaker"):
        shutil.rmtree(tmp_path / name)
    with pytest.raises(ValueError, match="one class folder .*needs at least two"):
        resolve_task("image-folder", data=tmp_path)


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory) -> Path:
    """Twenty real files of the Python docs' sources, copied into a folder of the user's."""
    root = tmp_path_factory.mktemp("text")
    for path in sorted((DEFAULT_TEXT_ROOT / "library").glob("*.rst.txt"))[:20]:
        shutil.copy(path, root / path.name)
    return root


def test_text_folder_trains_its_default_language_model(text_dir, tmp_path):
    trainer = make_trainer("text-folder", "baseline", data=text_dir, duration="16ba", eval_interval="8ba",
                           batch_size=8, eval_fraction=0.02, run_dir=tmp_path, save_checkpoints=False)
    record = trainer.fit()
    assert record.status == "completed" and record.config["task"] == "text-folder"
    first, last = record.evals[0]["eval/bpb"], record.evals[-1]["eval/bpb"]
    assert last < 8.0 and last < first  # 8 bits per byte is knowing nothing; it learned from the text
    assert set(TASKS["text-folder"].recipes) == {"baseline", "plain-bf16", "mild", "medium", "hot"}  # pydocs' ladder
    assert TASKS["text-folder"].recipes["plain-bf16"].methods == {}  # the language reference has no plain-bf16


def test_the_folder_tasks_take_their_domains_ladders_rebuilt_on_their_baselines(image_dir, text_dir):
    from speedkit.tasks.ladder import RUNGS, budget_fraction
    from speedkit.tasks.recipes import load_presets

    reference = load_presets("fashion-mnist")
    image = resolve_task("image-folder", data=image_dir)
    assert list(image.recipes) == ["baseline", "plain-bf16", *RUNGS] and image.baselines[-1] == "plain-bf16"
    for name in RUNGS:
        rung = image.recipes[name]
        share = float(rung.duration.removesuffix("ep")) / float(image.recipes["baseline"].duration.removesuffix("ep"))
        assert rung.model == "resnet9" and rung.adopted_from == f"fashion-mnist:{name}"
        assert 0 <= share - budget_fraction(reference[name], reference["baseline"]) < 0.05  # rounded up
    text = resolve_task("text-folder", data=text_dir)
    assert text.recipes["hot"].duration == load_presets("pydocs")["hot"].duration  # the same baseline budget


def test_a_folder_without_text_is_refused(tmp_path):
    (tmp_path / "picture.png").write_bytes(b"\x89PNG")
    with pytest.raises(FileNotFoundError, match=r"no files ending in .txt, .rst, .md under"):
        make_trainer("text-folder", data=tmp_path)


# -- folders of any size and any mess, through `speedkit train` in a child process -----------------
def _no_more_open_files_than(limit: int):
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def test_two_thousand_images_train_under_ulimit_n_256(tmp_path):
    data = write_image_folder(tmp_path / "many", per_class=667)  # 2,001 files: every one was opened at once
    result = speedkit_train("--task", "image-folder", "--data", str(data), "--image-size", "8", "--duration", "1ba",
                            "--save-interval", "none", "--no-progress", cwd=tmp_path,
                            preexec_fn=_no_more_open_files_than(256))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "completed" in result.stdout


def test_a_truncated_image_is_refused_naming_it_or_skipped_and_counted(tmp_path):
    data = write_image_folder(tmp_path / "pictures", per_class=12)
    broken = data / "trouser" / "005.png"
    broken.write_bytes(broken.read_bytes()[:60])  # cut off mid-file, as an interrupted copy leaves it
    args = ["--task", "image-folder", "--data", str(data), "--image-size", "16", "--duration", "1ba",
            "--save-interval", "none", "--no-progress"]
    refused = speedkit_train(*args, cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert str(broken) in refused.stderr and "--skip-unreadable" in refused.stderr
    skipped = speedkit_train(*args, "--skip-unreadable", cwd=tmp_path)
    assert skipped.returncode == 0, skipped.stderr[-2000:]
    assert "left out 1 image(s) that cannot be decoded" in skipped.stderr and str(broken) in skipped.stderr


def test_image_size_out_of_bounds_is_one_line_naming_the_flag(image_dir, tmp_path):
    result = speedkit_train("--task", "image-folder", "--data", str(image_dir), "--image-size", "0",
                            "--no-progress", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "--image-size (image_size) must be from 4 to 1024 pixels" in result.stderr and "got 0" in result.stderr


@pytest.mark.parametrize("size", [-4, 100_000])
def test_image_size_bounds_in_the_python_api(image_dir, size):
    with pytest.raises(ValueError, match=rf"--image-size \(image_size\) must be from 4 to 1024 pixels.*got {size}"):
        resolve_task("image-folder", data=image_dir, image_size=size)


def test_an_oversized_request_is_refused_before_decoding_with_the_fix():
    from speedkit.data.images import check_memory

    with pytest.raises(MemoryError, match=r"100000 images at 1024x1024 .* need about 1464.8 GiB.* lower "
                                          r"--image-size \(image_size\) to \d+ or less"):
        check_memory(100_000, 3, 1024, "image-folder big", available=16 * 2**30)
    check_memory(100_000, 3, 32, "image-folder big", available=16 * 2**30)  # 1.4 GiB: fits


def test_binary_files_in_a_text_folder_are_refused_naming_them_or_skipped(text_dir, tmp_path):
    data = tmp_path / "text"
    shutil.copytree(text_dir, data)
    (data / "weights.txt").write_bytes(bytes(range(256)) * 64)  # a binary file named .txt
    args = ["--task", "text-folder", "--data", str(data), "--duration", "1ba", "--batch-size", "4",
            "--eval-fraction", "0.02", "--save-interval", "none", "--no-progress"]
    refused = speedkit_train(*args, cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "are not text" in refused.stderr and str(data / "weights.txt") in refused.stderr
    skipped = speedkit_train(*args, "--skip-unreadable", cwd=tmp_path)
    assert skipped.returncode == 0, skipped.stderr[-2000:]
    assert "left out 1 file(s) that are not text: weights.txt" in skipped.stderr


def test_a_task_whose_labels_flips_change_trains_without_flips(image_dir, tmp_path):
    """Digits, letters, text: ``--no-flips`` / ``flips_keep_labels=False`` takes a recipe's flips out, saying
    which, and refuses a flipping method asked for by name."""
    from speedkit.tasks import get_recipe
    from speedkit.tasks.recipes import without_flips

    hot = get_recipe("fashion-mnist", "hot")  # alternating flips and a flip-only test-time view
    adapted, removed = without_flips(hot)
    assert adapted.augment["flip"] is None and "test_time_augmentation" not in adapted.methods
    assert removed == ["augment flip='alternating'", "test_time_augmentation"]
    assert adapted.methods.keys() == hot.methods.keys() - {"test_time_augmentation"}
    shifted, removed = without_flips(hot.with_changes(methods={"test_time_augmentation": {"shifts": 1}}))
    assert shifted.methods["test_time_augmentation"] == {"shifts": 1, "flip": False}  # the shifted views stay
    assert without_flips(adapted) == (adapted, [])

    options = {"flips_keep_labels": False}
    with pytest.warns(UserWarning, match=r"runs without augment flip='random'"):
        trainer = make_trainer("image-folder", "baseline", data=image_dir, task_options=options, duration="2ba",
                               run_dir=tmp_path, save_checkpoints=False)
    assert TASKS["image-folder"].flips_keep_labels is False
    assert trainer.state.train_dataloader.augment.flip is None and trainer.state.train_dataloader.augment.crop_pad == 2
    with pytest.raises(ValueError, match=r"\['alternating_flip'\] only flip images.*image-folder"):
        make_trainer("image-folder", "mild", data=image_dir, task_options=options, methods={"alternating_flip": {}},
                     run_dir=tmp_path, run_name="refused", save_checkpoints=False)
    plain = make_trainer("image-folder", "baseline", data=image_dir, duration="2ba", run_dir=tmp_path,
                         run_name="flipping", save_checkpoints=False)  # the default: flips keep labels
    assert plain.state.train_dataloader.augment.flip == "random"


def test_no_flips_is_a_folder_option_of_train_tune_and_bench():
    from speedkit.cli.main import _parser
    from speedkit.cli.task_flags import folder_options

    for command in ("train", "tune", "bench"):
        args = _parser().parse_args([command, "--task", "image-folder", "--data", "DIR", "--no-flips"])
        assert folder_options(args) == {"flips_keep_labels": False}
        assert folder_options(_parser().parse_args([command, "--task", "image-folder"])) is None


def test_a_killed_baseline_plan_continues_where_it_stopped_and_another_folders_runs_are_never_taken(image_dir,
                                                                                                    tmp_path):
    """A benchmark's runs name a folder task alone ("image-folder" for every folder), so each records what its folder
    held; `--find-budgets` run again takes the plan runs that ended, reruns one a kill cut short (its record still
    says "running"), and neither it nor `--reuse` takes the runs of another folder."""
    from speedkit.experiments.bench import run_benchmark
    from speedkit.record.runs import RunRecord, load_records

    runs, logged = tmp_path / "runs", []
    common = dict(seeds=1, recipes="hot", baselines="plain-bf16", duration="6ep", duration_scale=0.5, target=0.5,
                  device="cpu", run_dir=runs, out_dir=tmp_path / "out", figures=False, log=logged.append)
    first = run_benchmark("image-folder", data=image_dir, find_budgets=True, **common)
    assert first.records[0].config["data"]["path"] == str(image_dir.resolve())
    baseline = first.entry["baselines"]["plain-bf16"]
    assert baseline["budget"] == baseline["budget_search"]["budget"] != "3ep"  # as found: not scaled again

    def plan_runs() -> list[RunRecord]:
        return [r for r in load_records(runs) if r.config["bench"].get("budget_search")]

    walked = plan_runs()
    assert len(walked) >= 2  # 3 epochs, then 2 (and 1 where 2 reached the target)
    killed = next(path for path in runs.rglob("record.json") if RunRecord.load(path).run_id == walked[-1].run_id)
    record = RunRecord.load(killed)
    record.status = "running"  # as a kill leaves it: saved at its last evaluation, never closed
    record.save(killed)
    logged.clear()
    again = run_benchmark("image-folder", data=image_dir, find_budgets=True, **common)
    new = [r for r in plan_runs() if r.run_id not in {w.run_id for w in walked}]
    assert [r.config["recipe_spec"]["duration"] for r in new] == [walked[-1].config["recipe_spec"]["duration"]]
    assert sum("kept from an earlier benchmark" in line for line in logged) == len(walked) - 1
    assert again.entry["baselines"]["plain-bf16"]["budget_search"] == first.entry["baselines"]["plain-bf16"][
        "budget_search"]

    other = write_image_folder(tmp_path / "other", per_class=80, offset=80)  # the same classes, other images
    found = json.loads((tmp_path / "out" / "image-folder_budgets.json").read_text())
    with pytest.raises(ValueError, match=r"the budgets of plain-bf16 were found under other conditions \(data .* there, "
                                         r".* here; duration_scale 0.5 there, 1.0 here\)"):
        run_benchmark("image-folder", data=other, budgets=found, **{**common, "duration_scale": 1.0})
    with pytest.raises(ValueError, match="no finished image-folder run for plain-bf16 seed 0, hot seed 0 .runs on "
                                         "other data"):
        run_benchmark("image-folder", data=other, reuse=True, **common)
    logged.clear()
    run_benchmark("image-folder", data=other, find_budgets=True, **common)
    assert not any("kept from an earlier benchmark" in line for line in logged)
