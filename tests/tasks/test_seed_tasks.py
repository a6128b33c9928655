"""The seed's workloads as tasks (issue 43 item 3): ``imagenet`` (ResNets on an ImageNet-layout folder or its
shards) and ``gpt2`` (GPT-2 124M on BPE token shards), each at ``cpu`` sizes (a rehearsal) or ``gpu`` ones, their
published presets, and the errors a user meets without ``--data``."""
from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("litdata")
pytest.importorskip("tokenizers")

from cli_child import speedkit_train  # noqa: E402
from streaming_data import make_image_folder  # noqa: E402

from speedkit.data.streaming import StreamingImageLoader, StreamingTokenLoader  # noqa: E402
from speedkit.tasks import TASKS, DataRequest, find_task, resolve_task  # noqa: E402
from speedkit.tasks.builtin.gpt2 import gpt2_recipes, gpt2_task  # noqa: E402
from speedkit.tasks.builtin.imagenet import imagenet_recipes, imagenet_task  # noqa: E402


@pytest.fixture(autouse=True)
def cache_here(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEEDKIT_SHARDS", str(tmp_path / "cache"))


@pytest.fixture
def imagenet_folder(tmp_path):
    """ImageNet's layout: train/<class>/ and val/<class>/ of JPEG and PNG images of varied sizes."""
    make_image_folder(tmp_path / "imagenet" / "train", per_class=5, seed=0)
    make_image_folder(tmp_path / "imagenet" / "val", per_class=2, seed=1)
    return tmp_path / "imagenet"


@pytest.fixture
def corpus(tmp_path):
    rng = random.Random(0)
    words = ["the", "seed", "trains", "a", "model", "on", "tokens", "from", "shards", "of", "text", "and", "images"]
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(8):
        (root / f"doc{i}.txt").write_text(" ".join(rng.choice(words) for _ in range(1500)) + "\n")
    return root


def _request(model=None, batch_size=4, recipe=None):
    return DataRequest(batch_size=batch_size, device=torch.device("cpu"), model=model, recipe=recipe)


def test_imagenet_at_cpu_sizes_streams_the_folder_at_each_recipes_published_sizes(imagenet_folder):
    with pytest.warns(UserWarning, match="streaming it from shards"):
        task = imagenet_task(imagenet_folder, sizes="cpu")
    assert task.name == "imagenet" and "cpu sizes" in task.summary and "3 classes" in task.summary
    assert "80 px (baseline, plain-bf16) and 64 px (mild, medium, hot), evaluated at 80 px" in task.summary
    assert task.baselines == ("baseline", "plain-bf16")
    assert {"baseline", "plain-bf16", "mild", "medium", "hot"} <= set(task.recipes)
    model = task.model(task.models[0])
    assert task.models[0] == "resnet18" and task.recipe("hot").model == "resnet18"
    # Composer's recipes train at 176 px and its baseline at 224, both evaluated at 224: times 64/176
    for recipe, train_size, crop in (("mild", 64, 0.966), ("plain-bf16", 80, 0.875)):
        request = _request(model, recipe=task.recipe(recipe))
        train, evaluate = task.train_data(request), task.eval_data(request)
        assert isinstance(train, StreamingImageLoader)
        assert train._transform.scale == (0.35, 1.0)  # the crops every cpu rehearsal was measured with
        images, labels = next(iter(train))
        assert images.shape == (4, 3, train_size, train_size) and labels.dtype == torch.int64
        assert next(iter(evaluate))[0].shape[-1] == 80  # FFCV's test: evaluation at a higher resolution
        assert evaluate._transform.crop_fraction == crop  # 224 of 232 px, and of 256
        assert model(images).shape == (4, 3)
    for name in ("resnet50", "resnet101", "torchvision:resnet34", "timm:resnet50"):
        assert task.model_fit_problem(name) is None
    # asked again, the shards prepared once are found (a shard folder as --data works the same); the user's sizes
    # hold for every recipe
    again = imagenet_task(imagenet_folder, sizes="cpu", image_size=48, eval_image_size=72)
    for recipe in ("mild", "baseline"):
        assert next(iter(again.train_data(_request(recipe=again.recipe(recipe)))))[0].shape[-1] == 48
        assert next(iter(again.eval_data(_request(recipe=again.recipe(recipe)))))[0].shape[-1] == 72
    # the recipes follow the training size: progressive resizing starts at the published 88 px where that is
    # below it (and is off at 48 or 64 px)
    larger = imagenet_task(imagenet_folder, sizes="cpu", image_size=128)
    assert larger.recipe("mild").methods["progressive_resizing"]["initial_scale"] == pytest.approx(88 / 128, abs=1e-3)
    assert "progressive_resizing" not in again.recipe("mild").methods


def test_imagenet_at_gpu_sizes_crops_and_sizes_as_the_published_pipeline(imagenet_folder):
    with pytest.warns(UserWarning, match="streaming it from shards"):
        task = imagenet_task(imagenet_folder, sizes="gpu")
    for recipe, train_size in (("mild", 176), ("baseline", 224)):
        request = _request(recipe=task.recipe(recipe))
        train, evaluate = task.train_data(request), task.eval_data(request)
        assert train._transform.scale == (0.08, 1.0)  # torchvision's RandomResizedCrop, as Composer and FFCV train
        assert next(iter(train))[0].shape[-1] == train_size
        assert next(iter(evaluate))[0].shape[-1] == 224


def test_a_resolution_is_refused_where_the_task_would_not_read_it():
    from speedkit.tasks import make_trainer
    from speedkit.tasks.recipes import Recipe

    with pytest.raises(ValueError, match="resolution.train must be a whole number of pixels"):
        Recipe(name="r", model="resnet18", duration="1ep", batch_size=8, optimizer={"name": "sgd"},
               resolution={"train": 6.5})
    with pytest.raises(ValueError, match="eval_crop is the share of the short side"):
        Recipe(name="r", model="resnet18", duration="1ep", batch_size=8, optimizer={"name": "sgd"},
               resolution={"eval_crop": 1.5})
    mild = imagenet_recipes("cpu")["mild"]
    with pytest.raises(ValueError, match="sets resolution .* which task 'fashion-mnist' does not read"):
        make_trainer("fashion-mnist", mild.with_changes(model="resnet8", task=None, domain=None), duration="1ba")


def test_imagenet_gpu_presets_are_composers_published_resnet50_recipes():
    recipes = imagenet_recipes("gpu")
    assert all(r.methods.pop("torch_compile") == {} for r in recipes.values())  # the gpu sizes compile
    base = recipes["baseline"]
    assert (base.model, base.batch_size, base.duration, base.optimizer["lr"], base.optimizer["momentum"]) == \
        ("resnet50", 2048, "90ep", 2.048, 0.875)
    assert [recipes[r].duration for r in ("mild", "medium", "hot")] == ["36ep", "135ep", "270ep"]
    assert set(recipes["mild"].methods) == {"blurpool", "channels_last", "ema", "progressive_resizing",
                                            "label_smoothing"}
    assert recipes["mild"].methods["label_smoothing"] == {"smoothing": 0.08}
    assert set(recipes["medium"].methods) == set(recipes["mild"].methods) | {"mixup", "sam"}
    hot = recipes["hot"].methods
    assert set(hot) == set(recipes["medium"].methods) | {"colout", "randaugment", "stochastic_depth"}
    assert hot["stochastic_depth"] == {"drop_rate": 0.1, "mode": "sample", "drop_distribution": "linear"}
    assert hot["progressive_resizing"]["initial_scale"] == 0.6 and hot["sam"] == {"rho": 0.5, "interval": 5}
    assert base.resolution == recipes["plain-bf16"].resolution == {"train": 224, "eval": 224, "eval_crop": 0.875}
    for name in ("mild", "medium", "hot"):
        assert recipes[name].resolution == {"train": 176, "eval": 224, "eval_crop": 0.966}
    cpu = imagenet_recipes("cpu")
    for name, recipe in cpu.items():  # the rehearsal keeps the methods and scales the rest
        scaled = {"ema", "progressive_resizing"}
        assert recipe.methods.keys() == recipes[name].methods.keys() - {"progressive_resizing"}
        assert {m: a for m, a in recipe.methods.items() if m not in scaled} == \
            {m: a for m, a in recipes[name].methods.items() if m not in scaled}
        assert recipe.model == "resnet18" and recipe.batch_size == 64
        assert recipe.optimizer["lr"] == pytest.approx(recipes[name].optimizer["lr"] * 64 / 2048, rel=1e-3)


def test_a_rehearsal_keeps_the_ema_window_at_its_share_of_the_published_run():
    # 100 batches of mild's 36 ImageNet epochs at batch 2048 (22,521 batches) is 0.44% of the run; kept at 100
    # batches, a rehearsal's EMA would span a sixth of its 628 batches and evaluation would see stale weights
    from speedkit.tasks.builtin._seed import rehearsal
    from speedkit.tasks.recipes import load_presets

    published, cpu = imagenet_recipes("gpu"), imagenet_recipes("cpu")
    for name in ("mild", "medium", "hot"):
        epochs = float(published[name].duration.removesuffix("ep"))
        share = float(cpu[name].methods["ema"]["half_life"].removesuffix("dur"))
        assert share * epochs * 1_281_167 / 2048 == pytest.approx(100, rel=0.01)
        assert cpu[name].methods["ema"]["update_interval"] == 1  # 20 published batches is under one of a rehearsal
        assert published[name].methods["ema"] == {"half_life": "100ba", "update_interval": 20}
    with pytest.raises(ValueError, match="epoch_samples"):  # a batch window in an epoch budget needs the data's size
        rehearsal(load_presets("imagenet"), model="resnet18", batch_size=64, duration_scale=0.1, scale_lr=True)


def test_a_rehearsal_never_trains_on_images_smaller_than_the_published_recipe():
    # Composer's mild trains at 176 px from half that, 88 px; at the rehearsal's 64 px, half would be 32 px
    published = imagenet_recipes("gpu")
    assert published["mild"].methods["progressive_resizing"]["initial_scale"] == 0.5
    for name in ("mild", "medium", "hot"):
        at_64 = imagenet_recipes("cpu")[name]
        assert "progressive_resizing" not in at_64.methods and "progressive resizing off" in at_64.summary
        at_128 = imagenet_recipes("cpu", image_size=128)[name].methods["progressive_resizing"]
        smallest = published[name].methods["progressive_resizing"]["initial_scale"] * 176
        assert at_128["initial_scale"] * 128 == pytest.approx(smallest, abs=0.1)  # 88 px (hot: 106)
        assert imagenet_recipes("cpu", image_size=224)[name].methods["progressive_resizing"] == \
            published[name].methods["progressive_resizing"]  # larger than published: as published


def test_gpt2_at_cpu_sizes_trains_windows_of_the_shards_vocabulary(corpus):
    with pytest.warns(UserWarning, match="streaming it from shards"):
        task = gpt2_task(corpus, sizes="cpu")
    assert task.name == "gpt2" and task.domain == "language" and task.target_metric == "eval/loss"
    assert {"baseline", "composer", "hot"} <= set(task.recipes)
    vocab = task.model("gpt-nano").config.vocab_size
    assert vocab < 50257  # the BPE trained on this corpus, not GPT-2's
    model = task.model(task.models[0])
    loader = task.train_data(_request(model, batch_size=8))
    assert isinstance(loader, StreamingTokenLoader)
    x, y = next(iter(loader))
    assert x.shape == (8, 256) and int(x.max()) < vocab
    assert model.config.vocab_size == vocab and model(x).shape[-1] == model.config.padded_vocab_size  # 64s
    hf = pytest.importorskip("transformers") and task.model("hf:gpt2")
    assert (hf.config.n_layer, hf.config.n_head, hf.config.n_embd, hf.config.n_positions, hf.config.vocab_size) == \
        (12, 12, 768, 1024, vocab)


def test_gpt2_cpu_rehearsal_evaluates_within_each_scaled_budget():
    # the presets' cadences (500, 250 batches) outlast the rehearsal's budgets: hot would be evaluated once, at
    # its end, so its time to the target could only be its whole budget
    from speedkit.core.time import Time

    for name, recipe in gpt2_recipes("cpu").items():
        budget, cadence = Time.from_input(recipe.duration), Time.from_input(recipe.eval_interval)
        assert cadence.unit is budget.unit and budget.value >= 6 * cadence.value, (name, recipe.duration,
                                                                                   recipe.eval_interval)
    assert gpt2_recipes("gpu")["hot"].eval_interval == "250ba"  # the published cadence where the budget is


def test_a_rehearsal_budget_chosen_for_a_recipe_replaces_its_scaled_one():
    from speedkit.core.time import Time
    from speedkit.tasks.builtin._seed import rehearsal
    from speedkit.tasks.recipes import load_presets

    recipes = rehearsal(load_presets("gpt2"), model="gpt-nano", batch_size=16, duration_scale=0.05, scale_lr=False,
                        durations={"hot": "300ba"})
    assert {name: r.duration for name, r in recipes.items()} == {"baseline": "700ba", "composer": "700ba",
                                                                 "hot": "300ba"}
    # the gpt2 rehearsal's hot trains longer than the scaled preset (160 batches), which missed its targets
    assert Time.from_input(gpt2_recipes("cpu")["hot"].duration).value > 160


def test_gpt2_gpu_presets_are_the_published_ones_at_gpt2_124m():
    recipes = gpt2_recipes("gpu")
    assert {r.model for r in recipes.values()} == {"gpt2-124m"}
    composer = recipes["composer"]
    assert composer.optimizer["lr"] == 6e-4 and composer.batch_size == 512 and composer.duration == "14000ba"
    assert composer.methods["seq_length_warmup"] == {"duration": 0.3, "min_seq_length": 8, "step_size": 8,
                                                     "truncate": True}
    assert "alibi" in composer.methods
    assert {"muon", "rotary_embeddings", "qk_norm", "relu_squared"} <= set(recipes["hot"].methods)
    from speedkit.models import get_model

    config = get_model("gpt2-124m", vocab_size=1000).config  # GPT-2 124M's sizes
    assert (config.n_layer, config.n_head, config.n_embd, config.block_size) == (12, 12, 768, 1024)


@pytest.mark.parametrize("name", ["imagenet", "gpt2"])
def test_without_data_the_error_names_the_argument_and_how_to_prepare_it(name, tmp_path):
    with pytest.raises(ValueError, match=r"--data DIR.*speedkit data prepare"):
        find_task(name)
    with pytest.raises(FileNotFoundError, match=r"--data .* is not a folder.*speedkit data prepare"):
        find_task(name, tmp_path / "missing")
    with pytest.raises(ValueError, match="sizes must be one of"):
        find_task(name, tmp_path, sizes="tpu")
    # an option the task does not take (the name these sizes had before, say) is named with those it takes
    with pytest.raises(ValueError, match=rf"task '{name}' takes no option 'profile'; its options: sizes, "):
        find_task(name, tmp_path, profile="cpu")
    done = speedkit_train("--task", name, cwd=tmp_path)
    assert done.returncode == 2 and "--data" in done.stderr and "speedkit data prepare" in done.stderr


@pytest.mark.slow
def test_the_cli_trains_both_seed_tasks_at_cpu_sizes(imagenet_folder, corpus, tmp_path):
    for args in (["--task", "imagenet", "--data", str(imagenet_folder), "--recipe", "hot", "--batch-size", "4"],
                 ["--task", "gpt2", "--data", str(corpus), "--recipe", "composer"]):
        done = speedkit_train(*args, "--sizes", "cpu", "--duration", "2ba", "--no-progress",
                              "--run-dir", str(tmp_path / "runs"), cwd=tmp_path)  # SPEEDKIT_SHARDS: cache_here
        assert done.returncode == 0, done.stderr[-2000:]
        assert "completed" in done.stdout + done.stderr


def test_both_resolve_by_name_so_bench_and_tune_find_them_again(imagenet_folder):
    task = resolve_task("imagenet", imagenet_folder, sizes="cpu")
    assert TASKS["imagenet"] is task and find_task("imagenet") is task


@pytest.mark.parametrize("name", ["imagenet", "gpt2"])
def test_in_memory_is_refused_by_the_seed_tasks_which_always_stream(name, tmp_path):
    with pytest.raises(ValueError, match=rf"task {name} always streams.*leave out stream=False"):
        find_task(name, tmp_path, sizes="cpu", stream=False)


def test_both_seed_tasks_state_their_sizes_in_one_type():
    from speedkit.tasks.builtin import gpt2, imagenet
    from speedkit.tasks.builtin._seed import SeedSizes

    sizes = [*imagenet.SIZES.values(), *gpt2.SIZES.values()]
    assert all(type(each) is SeedSizes for each in sizes)
    assert imagenet.SIZES["cpu"].short_side and gpt2.SIZES["cpu"].context  # each task's data sizes
