"""The domain ladders rebuilt for a task that brings only its baseline: budgets as the same share of its own
baseline's as on the reference task, its model, nothing of what the reference measured, surgeries that
find nothing left out with a warning, and the command that measures a rung there."""
from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch.nn as nn
from test_tasks import user_task

from speedkit.core import Time
from speedkit.tasks import Recipe, make_trainer
from speedkit.tasks.ladder import REFERENCES, RUNGS, budget_fraction, domain_ladder, measure_hint, scaled_budget
from speedkit.tasks.recipes import load_presets

pytestmark = pytest.mark.prerequisite("fashion-mnist")


def samples(recipe: Recipe, batches_per_epoch_at_64: int = 100) -> float:
    """Samples a recipe trains on, on a data set of ``100 * 64`` samples."""
    time = Time.from_input(recipe.duration)
    return time.value * 64 * batches_per_epoch_at_64 if time.unit.value == "ep" else time.value * recipe.batch_size


@pytest.mark.parametrize("domain", sorted(REFERENCES))
@pytest.mark.parametrize("duration", ["10ep", "3000ba"])
def test_a_rung_trains_the_same_share_of_its_baseline_as_on_the_reference_task(domain, duration):
    reference_task, reference_name = REFERENCES[domain]
    presets = load_presets(reference_task)
    baseline = presets[reference_name].with_changes(name="baseline", model="their-model", duration=duration,
                                                    batch_size=64)
    ladder = domain_ladder(domain, baseline)
    assert list(ladder) == list(RUNGS)
    for name, rung in ladder.items():
        share = budget_fraction(presets[name], presets[reference_name])
        assert 0 < share < 1  # each rung trains less than its baseline
        assert samples(rung) / samples(baseline) == pytest.approx(share, abs=0.05 + 1 / 3000)
        assert rung.model == "their-model" and rung.adopted_from == f"{reference_task}:{name}"
        assert rung.methods == presets[name].methods and rung.reached is None and rung.target is None
    shares = [samples(ladder[name]) for name in RUNGS]
    assert shares == sorted(shares, reverse=True)  # mild trains longest, hot shortest


def test_budgets_round_up_to_the_half_epoch_and_keep_whole_batches():
    baseline = load_presets("fashion-mnist")["baseline"].with_changes(duration="10ep")
    assert scaled_budget(baseline, 0.36, 256) == "4ep" and scaled_budget(baseline, 0.01, 256) == "0.5ep"
    batches = baseline.with_changes(duration="1000ba", batch_size=64)
    assert scaled_budget(batches, 0.5, 256) == "125ba"  # half the samples, at four times the batch
    with pytest.raises(ValueError, match="not wall-clock time"):
        scaled_budget(baseline.with_changes(duration="60s"), 0.5, 64)


def test_a_registered_task_with_only_a_baseline_gets_the_vision_ladder_and_one_with_rungs_keeps_its_own():
    task = user_task("ladder-user")
    assert list(task.recipes) == ["baseline", "plain-bf16", *RUNGS]
    # the baseline speed-ups are measured against: its own, with bf16 where fast here and channels_last
    strong = task.recipes["plain-bf16"]
    assert task.baselines == ("baseline", "plain-bf16") and strong.precision == "auto"
    assert strong.methods == {"channels_last": {}} and strong.duration == task.recipes["baseline"].duration
    assert {r.model for r in task.recipes.values()} == {"small-cnn"} and task.models == ("small-cnn",)
    baseline = dataclasses.replace(task.recipes["baseline"], task=None, domain=None)
    own = baseline.with_changes(name="mild", duration="1ep")
    keeps = user_task("ladder-own", recipes={"baseline": baseline, "mild": own})
    assert list(keeps.recipes) == ["baseline", "mild"] and keeps.recipes["mild"].adopted_from is None


class OnlyLinear(nn.Module):
    """A model with no convolution: the ladder's channels_last has nothing to change in it."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x)


def _trainer_and_warnings(task, recipe: str, run_dir):
    """A two-batch Trainer of ``recipe`` and the warnings its building raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = make_trainer(task, recipe, duration="2ba", run_dir=run_dir, save_checkpoints=False)
    return trainer, [str(w.message) for w in caught]


def test_an_adopted_rung_runs_without_a_surgery_that_finds_nothing_and_says_how_to_measure_it(tmp_path):
    task = user_task("ladder-linear", model=lambda name: OnlyLinear())
    trainer, messages = _trainer_and_warnings(task, "mild", tmp_path)
    assert any("speedkit bench --task ladder-linear --recipes mild --baselines plain-bf16 --seeds 1" in m
               for m in messages)
    dropped = [m for m in messages if "runs without" in m]
    assert dropped, messages
    used = {m.CARD.name for m in trainer.state.methods}
    assert used < set(task.recipes["mild"].methods) and used  # what acts stays, what finds nothing goes
    assert trainer.fit().status == "completed"
    own = task.recipes["baseline"].with_changes(name="mine", methods={"blurpool": {}})
    with pytest.raises(ValueError, match="blurpool found no"):  # a recipe of the user's own is refused, as before
        make_trainer(task, own, run_dir=tmp_path, run_name="own", save_checkpoints=False)


def test_the_rebuilt_plain_bf16_is_a_baseline_no_hint_asks_to_measure_and_its_surgery_may_find_nothing(tmp_path):
    task = user_task("ladder-linear-bf16", model=lambda name: OnlyLinear())
    trainer, messages = _trainer_and_warnings(task, "plain-bf16", tmp_path)
    assert not any("speedkit bench" in m for m in messages), messages  # a baseline is what rungs are measured against
    assert any("runs without channels_last" in m for m in messages), messages  # no conv for it to act on
    assert trainer.fit().status == "completed"


def test_the_measure_command_carries_the_folder_options():
    hint = measure_hint("image-folder", "hot", "data/glyphs", {"image_size": 28, "flips_keep_labels": False})
    assert hint == ("speedkit bench --task image-folder --data data/glyphs --image-size 28 --no-flips "
                    "--recipes hot --baselines baseline --seeds 1")


def test_a_rebuilt_rung_keeps_the_tasks_optimizer_and_says_what_it_changed():
    """Issue 41.3: AdamW 2e-3 at batch 64 became SGD 0.2 at batch 256 and ended at chance."""
    baseline = Recipe(name="baseline", model="theirs", duration="3ep", batch_size=64,
                      optimizer={"name": "adamw", "lr": 2e-3, "weight_decay": 0.01})
    for name, rung in domain_ladder("vision", baseline).items():  # another kind than the reference's SGD: all kept
        assert rung.batch_size == 64 and rung.optimizer == baseline.optimizer, name
        assert "adamw at lr 0.002 and batch size 64, kept" in rung.summary
        assert "sgd at lr 0.2 and batch 256 was tuned for another optimizer" in rung.summary
    # The reference's kind: the batch grows as the reference rung's did from its baseline's (128 -> 256: twice),
    # not to the rung's own 256, and the lr scales with it from the task's own (not the rung's 0.2).
    sgd = baseline.with_changes(optimizer={"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 0.0})
    for rung in domain_ladder("vision", sgd).values():
        assert rung.batch_size == 128 and rung.optimizer == {**sgd.optimizer, "lr": 0.02}
        assert "lr 0.02 and batch size 128 (its baseline: lr 0.01 at batch 64" in rung.summary
    # The image-folder task's SGD at 0.05/64 becomes 0.1/128, as the reference's 0.1/128 became 0.2/256.
    folder = load_presets("image-folder")["baseline"]
    assert {(r.batch_size, r.optimizer["lr"]) for r in domain_ladder("vision", folder).values()} == {(128, 0.1)}


def test_a_rebuilt_rung_keeps_the_baselines_random_crop():
    """The reference rungs drop the crop (Fashion-MNIST's objects are centred); a user's baseline's crop stays."""
    reference = load_presets("fashion-mnist")["hot"]
    assert reference.augment["crop_pad"] == 0 and reference.augment["flip"] == "alternating"
    folder = load_presets("image-folder")["baseline"]
    for rung in domain_ladder("vision", folder.with_changes(augment={"crop_pad": 3, "flip": "random"})).values():
        assert rung.augment == {"crop_pad": 3, "flip": "alternating"}  # the crop is the baseline's, the flip the rung's
    for rung in domain_ladder("vision", folder.with_changes(augment={"flip": "random"})).values():
        assert rung.augment["crop_pad"] == 0  # a baseline that takes no crop adds none


def test_a_budget_scaled_keeps_the_number_of_evaluations():
    rung = Recipe(name="hot", model="m", duration="4ep", batch_size=128, optimizer={"name": "sgd", "lr": 0.1}, eval_interval="0.8ep")
    assert rung.with_budget("2ep").eval_interval == "0.4ep" and rung.with_budget("2ep").duration == "2ep"
    assert rung.with_changes(eval_interval="50ba").with_budget("2ep").eval_interval == "50ba"  # units differ
    assert rung.with_changes(eval_interval="0.1dur").with_budget("1ep").eval_interval == "0.1dur"
    batches = Recipe(name="b", model="m", duration="300ba", batch_size=8, optimizer={"name": "sgd", "lr": 0.1}, eval_interval="100ba")
    assert batches.with_budget("150ba").eval_interval == "50ba"


def test_a_rung_is_never_planned_as_a_handful_of_steps_on_a_small_data_set(tmp_path):
    task = user_task("ladder-small")  # 2048 images at batch 64: 32 steps an epoch; the baseline trains 64
    rung = task.recipes["hot"]
    assert rung.duration == "1ep" and rung.batch_size == 64 and rung.optimizer == {"name": "adamw", "lr": 3e-3}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = make_trainer(task, "hot", run_dir=tmp_path, save_checkpoints=False)
    assert str(trainer.state.max_duration) == "64ba"  # the baseline's own length: no rung can say less
    assert any("would train 32 step(s)" in str(w.message) and "trains 64 instead" in str(w.message)
               for w in caught), [str(w.message) for w in caught]
    assert type(trainer.state.optimizers[0]).__name__ == "AdamW"
    assert trainer.state.train_dataloader.batch_size == 64
    explicit = make_trainer(task, "hot", duration="2ba", run_dir=tmp_path, run_name="asked", save_checkpoints=False)
    assert str(explicit.state.max_duration) == "2ba"  # a length the user asks for is theirs
    # A rung given as a Recipe (the benchmark's, its budget scaled) is planned the same way when asked to be.
    given = dataclasses.replace(rung, duration="0.5ep")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        floored = make_trainer(task, given, step_floor=True, run_dir=tmp_path, run_name="floored",
                               save_checkpoints=False)
    assert str(floored.state.max_duration) == "64ba"
    as_given = make_trainer(task, given, run_dir=tmp_path, run_name="as-given", save_checkpoints=False)
    assert str(as_given.state.max_duration) == "0.5ep"
