"""A user's torch LR schedulers in speedkit's Trainer: every class torch ships drives the user's optimizer as it
would without speedkit, the groups Muon adds follow its relative change, ReduceLROnPlateau steps on an
evaluation metric, and what cannot work is refused before the first step."""
from __future__ import annotations

import pytest
import torch
from helpers import toy_loaders
from torch import nn
from torch.optim import lr_scheduler

from torch_schedulers import every_torch_scheduler
from speedkit import Trainer
from speedkit.callbacks import Callback
from speedkit.methods import SAM, Muon
from speedkit.optim import Cosine

STEPS = 8
LR, MUON_LR = 1e-3, 0.02

SCHEDULERS = every_torch_scheduler(STEPS, LR)


def mlp() -> nn.Module:
    """A hidden matrix for Muon between a first and a last layer that stay with AdamW."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))


class LearningRates(Callback):
    """The lr of the user's first group and of every group the user's optimizer does not hold, right after each
    optimizer step (the rates it used; the schedulers step after)."""

    def __init__(self, user: torch.optim.Optimizer):
        self.user, self.rows = user, []

    def after_train_batch(self, state, logger):
        added = [g["lr"] for o in state.optimizers for g in o.param_groups
                 if all(g is not mine for mine in self.user.param_groups)]
        self.rows.append((self.user.param_groups[0]["lr"], added))


def train_with(tmp_path, make_scheduler, methods=(), steps=STEPS, **options):
    """(user's lr, Muon's groups' lrs) at each step of a Trainer run with the user's AdamW and scheduler, and
    the run's record."""
    model = mlp()
    adamw = torch.optim.AdamW(model.parameters(), lr=LR)
    train, test = toy_loaders()
    rates = LearningRates(adamw)
    options = {"eval_dataloader": test, "eval_interval": "1ba", **options}
    trainer = Trainer(model, train, optimizers=adamw, schedulers=make_scheduler(adamw), methods=list(methods),
                      callbacks=[rates], max_duration=f"{steps}ba", device="cpu", run_dir=tmp_path, run_name="r",
                      save_checkpoints=False, progress_bar=False, **options)
    record = trainer.fit()
    return rates.rows, record


def schedule_alone(name: str) -> list[float]:
    """The lr the scheduler gives AdamW at each step in a plain torch loop, without speedkit; a
    ReduceLROnPlateau steps once a step on a metric that never improves."""
    adamw = torch.optim.AdamW(mlp().parameters(), lr=LR)
    scheduler = SCHEDULERS[name](adamw)
    lrs = []
    for _ in range(STEPS):
        lrs.append(adamw.param_groups[0]["lr"])
        adamw.step()
        scheduler.step(1.0) if isinstance(scheduler, lr_scheduler.ReduceLROnPlateau) else scheduler.step()
    return lrs


def test_the_schedulers_are_every_class_torch_ships():
    assert set(SCHEDULERS) == {name for name in lr_scheduler.__all__ if name != "LRScheduler"}


def test_an_exponential_decay_reaches_muons_group(tmp_path):
    rows, _ = train_with(tmp_path, lambda adamw: lr_scheduler.ExponentialLR(adamw, 0.5), [Muon(lr=MUON_LR)], steps=5)
    adamw_lr, muon_lrs = rows[4]  # the fifth step, after four decays
    assert adamw_lr == pytest.approx(LR * 0.5 ** 4)
    assert muon_lrs == [pytest.approx(MUON_LR * 0.5 ** 4)]


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_every_torch_scheduler_drives_the_users_optimizer_as_alone_and_muon_follows(name, tmp_path):
    alone = schedule_alone(name)
    assert len(set(alone)) > 1, "the schedule must change the rate for the test to mean something"
    rows, _ = train_with(tmp_path, SCHEDULERS[name], [Muon(lr=MUON_LR)])
    assert len(rows) == STEPS
    for step, ((adamw_lr, muon_lrs), expected) in enumerate(zip(rows, alone)):
        assert adamw_lr == pytest.approx(expected, rel=1e-9), (step, rows)
        assert muon_lrs, "Muon added no group"
        for lr in muon_lrs:  # Muon's lr changes by the same ratio as the user's
            assert lr == pytest.approx(MUON_LR * expected / LR, rel=1e-9), (step, rows)


class SeenPlateau(lr_scheduler.ReduceLROnPlateau):
    """torch's ReduceLROnPlateau, keeping the metric values it was stepped with."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    def step(self, metrics, epoch=None):
        self.seen.append(metrics)
        super().step(metrics)


def test_reduce_lr_on_plateau_steps_on_the_eval_loss_after_each_evaluation(tmp_path):
    """Patience counts evaluations: with an evaluation every 2 batches, the rate is cut every 2 batches."""
    built = []
    plateau = lambda adamw: built.append(SeenPlateau(adamw, factor=0.5, patience=0, threshold=1.0)) or built[0]
    rows, record = train_with(tmp_path, plateau, [Muon(lr=MUON_LR)], eval_interval="2ba")
    assert [lr for lr, _ in rows] == [pytest.approx(LR * 0.5 ** (step // 2)) for step in range(STEPS)]
    assert [muon for _, muon in rows] == [[pytest.approx(MUON_LR * 0.5 ** (step // 2))] for step in range(STEPS)]
    assert built[0].seen == [row["eval/loss"] for row in record.evals] and len(built[0].seen) == STEPS // 2


def test_reduce_lr_on_plateau_steps_on_the_target_metric_when_the_run_has_one(tmp_path):
    built = []
    plateau = lambda adamw: built.append(SeenPlateau(adamw, mode="max")) or built[0]
    _, record = train_with(tmp_path, plateau, stop_at=("eval/accuracy", 1.01), steps=4)
    assert built[0].seen == [row["eval/accuracy"] for row in record.evals] and len(built[0].seen) == 4


def test_reduce_lr_on_plateau_that_cannot_step_is_refused_before_training(tmp_path):
    plateau = lambda adamw: lr_scheduler.ReduceLROnPlateau(adamw)  # mode="min"
    with pytest.raises(ValueError, match=r"ReduceLROnPlateau\(mode='min'\) steps on eval/accuracy, where higher is "
                                         r"better: .*build it with mode='max'"):
        train_with(tmp_path, plateau, stop_at=("eval/accuracy", 0.9))
    with pytest.raises(ValueError, match=r"this Trainer evaluates nothing; pass eval_dataloader="):
        train_with(tmp_path, plateau, eval_dataloader=None)


def test_speedkit_schedules_beside_a_torch_scheduler_are_refused(tmp_path):
    both = lambda adamw: [Cosine(), lr_scheduler.ExponentialLR(adamw, 0.5)]
    with pytest.raises(ValueError, match=r"speedkit schedules \(cosine\) and torch LR schedulers \(ExponentialLR\): "
                                         r"both would set the learning rate at every step; keep one kind"):
        train_with(tmp_path, both)


def test_a_scheduler_on_an_optimizer_the_trainer_was_not_given_is_refused(tmp_path):
    other = torch.optim.SGD(mlp().parameters(), lr=LR)
    with pytest.raises(ValueError, match=r"your ExponentialLR drives an optimizer this Trainer was not given"):
        train_with(tmp_path, lambda adamw: lr_scheduler.ExponentialLR(other, 0.5))


def test_a_resumed_run_keeps_muon_following_the_users_scheduler(tmp_path):
    """Four batches, a checkpoint, then four more on a new Trainer: the rates are those of one eight-batch run."""
    decay = lambda adamw: lr_scheduler.ExponentialLR(adamw, 0.7)
    whole, _ = train_with(tmp_path / "whole", decay, [Muon(lr=MUON_LR)])
    rows = []
    for steps in (4, 8):
        model = mlp()
        adamw = torch.optim.AdamW(model.parameters(), lr=LR)
        rates = LearningRates(adamw)
        train, _ = toy_loaders()
        Trainer(model, train, optimizers=adamw, schedulers=decay(adamw), methods=[Muon(lr=MUON_LR)],
                callbacks=[rates], max_duration=f"{steps}ba", device="cpu", run_dir=tmp_path, run_name="r",
                progress_bar=False, autoresume=True, extend_duration=True).fit()
        rows += rates.rows
    assert rows == [(pytest.approx(lr), [pytest.approx(m) for m in muon]) for lr, muon in whole]


@pytest.mark.parametrize("methods", [[SAM()], [SAM(), Muon(lr=MUON_LR)]], ids=["sam", "sam+muon"])
def test_an_optimizer_wrapped_in_sam_keeps_the_users_schedule(methods, tmp_path):
    """SAM's wrapper shares the user's groups: it is no group of its own to follow the schedule, so the user's
    rate is the schedule's alone, LinearLR's warmup included, and Muon's (wrapped too) still follows it."""
    rows, _ = train_with(tmp_path, SCHEDULERS["LinearLR"], methods)
    alone = schedule_alone("LinearLR")
    assert [lr for lr, _ in rows] == [pytest.approx(lr, rel=1e-9) for lr in alone]
    assert [muon for _, muon in rows] == [[pytest.approx(MUON_LR * lr / LR, rel=1e-9)] if len(methods) > 1 else []
                                          for lr in alone]


def test_the_nan_guards_cut_holds_for_the_user_and_muon_under_a_torch_scheduler(tmp_path):
    """A skipped step halves every rate; the scheduler and Muon's following keep the cut afterwards."""
    losses = []

    def nan_on_the_third_step(logits, targets):
        losses.append(torch.nn.functional.cross_entropy(logits, targets))
        return losses[-1] * float("nan") if len(losses) == 3 else losses[-1]

    decay = lambda adamw: lr_scheduler.ExponentialLR(adamw, 0.7)
    rows, record = train_with(tmp_path, decay, [Muon(lr=MUON_LR)], loss_fn=nan_on_the_third_step, nan_policy="skip")
    expected = [LR * 0.7 ** step * (0.5 if step >= 3 else 1.0) for step in range(STEPS)]
    assert [lr for lr, _ in rows] == [pytest.approx(lr, rel=1e-9) for lr in expected]
    assert [muon for _, muon in rows] == [[pytest.approx(MUON_LR * lr / LR, rel=1e-9)] for lr in expected]


def test_a_resumed_sam_run_keeps_its_schedule(tmp_path):
    """Loading a checkpoint replaces the optimizer's groups; SAM's wrapper must set the new ones, or the schedule
    stops at the resume."""
    rows = []
    for steps in (4, 8):
        model = mlp()
        adamw = torch.optim.AdamW(model.parameters(), lr=LR)
        rates = LearningRates(adamw)
        Trainer(model, toy_loaders()[0], optimizers=adamw, schedulers=Cosine(), methods=[SAM()], callbacks=[rates],
                max_duration=f"{steps}ba", device="cpu", run_dir=tmp_path, run_name="r", progress_bar=False,
                autoresume=True, extend_duration=True).fit()
        rows += [lr for lr, _ in rates.rows]
    assert len(rows) == 8 and all(later < earlier for earlier, later in zip(rows[4:], rows[5:])), rows
