"""Host conformance (issue 41): one table of methods x hosts. Each cell either trains and checks what a host
promises, or is refused before training with the fix. No cell is "accepted and does nothing".

A trained cell, in a plain loop, a real ``lightning.Trainer.fit`` and a real ``transformers.Trainer.train``, with
the user's own LR scheduler (a linear decay built on the user's optimizer before speedkit sees it):

* the method acted (the engine's trace shows it);
* the lr of every group, Muon's included, follows the user's schedule at every step;
* a run stopped at the end of its first epoch and resumed from the host's own checkpoint ends with the same
  weights, bit for bit, as the uninterrupted run (random methods included: the RNGs ride in the method state);
* the weights the last evaluation measured are the final weights, and (Lightning) the checkpointed ones.

A refused cell raises before the first optimizer step, naming the method and the fix.

Every LR scheduler class torch ships, in a plain loop and in Lightning with Muon: AdamW's lr is the schedule's,
Muon's changes by the same ratio at every step, and speedkit ``schedules=`` beside any of them is refused.
"""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim import lr_scheduler
from prerequisites import import_or_missing
from torch_schedulers import every_torch_scheduler

from speedkit.hosts import HostCannotServeError, Speedkit
from speedkit.methods import (EMA, SAM, Autocast, CutMix, GradientClipping, LabelSmoothing, MixUp, Muon,
                              ProgressiveResizing, SeqLengthWarmup, TestTimeAugmentation)

STEPS, PER_EPOCH, BATCH = 8, 4, 16  # two epochs of four batches
LR, MUON_LR = 1e-2, 0.02


def schedule(step: int) -> float:
    """The user's schedule: linear decay to zero over the run (what HF's lr_scheduler_type='linear' is)."""
    return 1.0 - step / STEPS


# -- the table -----------------------------------------------------------------------------------------------
# method name -> (make the method, {host: None (trains) or (refusal regex, host options)})
LOOP, LIGHTNING, HF = "loop", "lightning", "hf"
TRAINS = None


def HF_LABELS(name):
    return (rf"{name} cannot run in the Hugging Face Trainer.*batches are dicts.*remove it", {})


CELLS = {
    "ema": (lambda: EMA(half_life="0.25dur"), {LOOP: TRAINS, LIGHTNING: TRAINS, HF: TRAINS}),
    "muon": (lambda: Muon(lr=MUON_LR), {LOOP: TRAINS, LIGHTNING: TRAINS, HF: TRAINS}),
    "mixup": (lambda: MixUp(alpha=0.4), {LOOP: TRAINS, LIGHTNING: TRAINS, HF: HF_LABELS("mixup")}),
    "cutmix": (lambda: CutMix(alpha=1.0), {LOOP: TRAINS, LIGHTNING: TRAINS, HF: HF_LABELS("cutmix")}),
    "label_smoothing": (lambda: LabelSmoothing(0.1), {LOOP: TRAINS, LIGHTNING: TRAINS,
                                                      HF: HF_LABELS("label_smoothing")}),
    "progressive_resizing": (lambda: ProgressiveResizing(initial_scale=0.5, finetune_fraction=0.25),
                             {LOOP: TRAINS, LIGHTNING: TRAINS, HF: TRAINS}),
    "test_time_augmentation": (lambda: TestTimeAugmentation(), {
        LOOP: TRAINS, LIGHTNING: TRAINS,
        HF: (r"test_time_augmentation needs eval_.*prediction_step gives speedkit no evaluation batch; remove the "
             r"method", {})}),
    "gradient_clipping": (lambda: GradientClipping(clipping_type="norm", clipping_threshold=0.5), {
        LOOP: TRAINS,
        LIGHTNING: (r"gradient_clipping and Lightning's own gradient clipping.*remove L.Trainer\(gradient_clip_val",
                    {"gradient_clip_val": 1.0}),
        HF: (r"gradient_clipping and the Hugging Face Trainer's own.*pass TrainingArguments\(max_grad_norm=0\)",
             {"max_grad_norm": 1.0})}),
    "seq_length_warmup": (lambda: SeqLengthWarmup(), {
        host: (r"seq_length_warmup needs language batches.*would do nothing; remove it", {})
        for host in (LOOP, LIGHTNING, HF)}),
    "sam": (lambda: SAM(), {host: (r"sam cannot run in .*remove it, or train with speedkit.Trainer", {})
                            for host in (LOOP, LIGHTNING, HF)}),
    "autocast": (lambda: Autocast(), {
        LOOP: (r"autocast cannot run in .*remove it and wrap your forward in torch.autocast", {}),
        LIGHTNING: (r"autocast cannot run in Lightning.*remove it and pass .*bf16-mixed", {}),
        HF: (r"autocast cannot run in .*remove it and pass TrainingArguments\(bf16=True\)", {})}),
}
TABLE = [(name, host) for name, (_, hosts) in CELLS.items() for host in hosts]


# -- the user's model and data ------------------------------------------------------------------------------
def data():
    g = torch.Generator().manual_seed(0)
    n = STEPS // 2 * BATCH
    return torch.randn(n, 1, 16, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


class Net(nn.Module):
    """A small conv net (two hidden conv filters for Muon, a head that stays with AdamW); takes HF-style
    keyword inputs too."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2, padding=1),
                                  nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(8, 4)
        self.trained_forwards = 0

    def forward(self, pixel_values, labels=None):
        self.trained_forwards += int(self.training)
        return self.head(self.body(pixel_values))


def loader():
    x, y = data()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)


@torch.no_grad()
def plain_loss(model) -> float:
    """The evaluation metric, measured on whatever weights the model holds."""
    x, y = data()
    was = model.training
    model.eval()
    loss = F.cross_entropy(model(x), y).item()
    model.train(was)
    return loss


def group_base(group) -> float:
    return group.get("speedkit_base_lr", group.get("initial_lr"))


def check_lrs(lrs: list[list[tuple[float, float]]], muon: bool) -> None:
    """Every group's lr, at every step, is its base lr times the user's schedule."""
    assert len(lrs) == STEPS
    for step, groups in enumerate(lrs):
        assert len(groups) >= (2 if muon else 1)
        for lr, base in groups:
            assert lr == pytest.approx(base * schedule(step), rel=1e-6, abs=1e-12), (step, groups)
    if muon:
        assert any(base == MUON_LR for _, base in lrs[0])


def check_acted(session, name: str) -> None:
    acted = session.engine.events_of(name)
    assert acted and sum(acted.values()) > 0, f"{name} was accepted and did nothing"


# -- the plain loop ------------------------------------------------------------------------------------------
def run_loop(make, *, seed=0, stop_at=None, resume=None, model=None):
    model = Net(seed) if model is None else model
    sk = Speedkit([make()], max_duration=f"{STEPS}ba", train_dataloader=loader())
    model = sk.prepare_model(model)
    adamw = torch.optim.AdamW(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(adamw, schedule)  # the user's, built before speedkit's split
    optimizer = sk.prepare_optimizer(adamw)
    if resume is not None:
        model.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        scheduler.load_state_dict(resume["scheduler"])
        sk.load_state_dict(resume["speedkit"])
    lrs, measured = [], None
    while not sk.done:
        for batch in loader():
            batch = sk.batch(batch)
            sk.backward(sk.loss(model(batch[0]), batch))
            lrs.append([(g["lr"], group_base(g)) for g in optimizer.param_groups])
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            sk.step_end()
            if stop_at is not None and sk.state.timestamp.batch == stop_at:
                return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "speedkit": sk.state_dict()}
            if sk.done:
                break
        with sk.evaluating():
            x, y = data()
            outputs = sk.eval_outputs(model(sk.eval_batch((x, y))[0]))
            measured = F.cross_entropy(outputs, y).item(), plain_loss(model)
    sk.finish()
    return {"model": model, "session": sk.session, "lrs": lrs, "measured": measured}


def loop_cell(name, make, refusal, tmp_path):
    if refusal is not None:
        model = Net()
        with pytest.raises((HostCannotServeError, ValueError), match=refusal[0]):
            run_loop(make, model=model)
        assert model.trained_forwards == 0  # refused before the first step
        return
    whole = run_loop(make)
    check_acted(whole["session"], name)
    check_lrs(whole["lrs"], muon=name == "muon")
    checkpoint = run_loop(make, stop_at=PER_EPOCH)
    torch.save(checkpoint, tmp_path / "loop.pt")
    resumed = run_loop(make, seed=1, resume=torch.load(tmp_path / "loop.pt", weights_only=True))
    assert len(resumed["lrs"]) == STEPS - PER_EPOCH and resumed["lrs"] == whole["lrs"][PER_EPOCH:]
    for key, value in whole["model"].state_dict().items():
        assert torch.equal(resumed["model"].state_dict()[key], value), key
    # The last evaluation measured the final weights (EMA's average is both; TTA's outputs are not plain).
    metric, plain = whole["measured"]
    assert plain_loss(whole["model"]) == pytest.approx(plain, abs=1e-7)
    if name != "test_time_augmentation":
        assert metric == pytest.approx(plain, abs=1e-7)


# -- Lightning ------------------------------------------------------------------------------------------------
def lightning_cell(name, make, refusal, tmp_path):
    L = import_or_missing("lightning.pytorch", "pip install 'torch-speedkit[lightning]'")
    from speedkit.hosts.lightning import SpeedkitCallback

    class Module(L.LightningModule):
        def __init__(self, seed=0):
            super().__init__()
            self.net = Net(seed)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            batch = self.speedkit.batch(batch)
            return self.speedkit.loss(self(batch[0]), batch)

        def validation_step(self, batch, batch_idx):
            batch = self.speedkit.eval_batch(batch)
            logits = self.speedkit.eval_outputs(self(batch[0]))
            self.log("val_loss", F.cross_entropy(logits, batch[1]))

        def configure_optimizers(self):
            adamw = torch.optim.AdamW(self.parameters(), lr=LR)
            decay = torch.optim.lr_scheduler.LambdaLR(adamw, schedule)
            return {"optimizer": adamw, "lr_scheduler": {"scheduler": decay, "interval": "step"}}

    class Recorder(L.Callback):
        def __init__(self):
            self.lrs = []

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            self.lrs.append([(g["lr"], group_base(g)) for g in optimizer.param_groups])

    class Kill(L.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == 1:
                raise RuntimeError("killed")

    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data()), batch_size=STEPS // 2 * BATCH)
    quiet = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                 num_sanity_val_steps=0, max_epochs=2, deterministic=True)

    def fit(folder, module, extra=(), ckpt_path=None, **options):
        callback, recorder = SpeedkitCallback([make()]), Recorder()
        saver = L.callbacks.ModelCheckpoint(dirpath=tmp_path / folder, save_top_k=-1, every_n_epochs=1)
        trainer = L.Trainer(callbacks=[callback, recorder, saver, *extra], default_root_dir=tmp_path / folder,
                            **{**quiet, **options})
        trainer.fit(module, loader(), val, ckpt_path=ckpt_path)
        return trainer, callback, recorder

    if refusal is not None:
        module = Module()
        with pytest.raises((HostCannotServeError, ValueError), match=refusal[0]):
            fit("refused", module, **refusal[1])
        assert module.net.trained_forwards == 0  # refused before the first step
        return
    whole_module = Module()
    trainer, callback, recorder = fit("whole", whole_module)
    check_acted(callback.session, name)
    check_lrs(recorder.lrs, muon=name == "muon")
    # The checkpoint holds the weights validation measured, and they are the final weights.
    final = torch.load(tmp_path / "whole" / f"epoch=1-step={STEPS}.ckpt", weights_only=True)["state_dict"]
    for key, value in whole_module.state_dict().items():
        assert torch.equal(final[key], value), key
    fresh = Module(seed=2)
    fresh.load_state_dict(final)
    if name != "test_time_augmentation":
        assert trainer.callback_metrics["val_loss"].item() == pytest.approx(plain_loss(fresh), abs=1e-6)

    with pytest.raises(RuntimeError, match="killed"):
        fit("killed", Module(), extra=[Kill()])
    resumed_module = Module(seed=1)
    _, _, resumed = fit("killed", resumed_module, ckpt_path=tmp_path / "killed" / f"epoch=0-step={PER_EPOCH}.ckpt")
    assert resumed.lrs == recorder.lrs[PER_EPOCH:]
    for key, value in whole_module.state_dict().items():
        assert torch.equal(resumed_module.state_dict()[key], value), key


# -- Hugging Face ---------------------------------------------------------------------------------------------
class Pixels(torch.utils.data.Dataset):
    """The cells' data as the Hugging Face Trainer takes it: dicts of pixel values and labels."""

    def __init__(self):
        self.x, self.y = data()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"pixel_values": self.x[i], "labels": self.y[i]}


def hf_cell(name, make, refusal, tmp_path):
    transformers = import_or_missing("transformers", "pip install 'torch-speedkit[hf]'")
    from speedkit.hosts.hf import SpeedkitTrainer

    class Recorder(transformers.TrainerCallback):
        def __init__(self):
            self.lrs = []

        def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
            self.lrs.append([(g["lr"], group_base(g)) for g in optimizer.param_groups])

    class Kill(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == PER_EPOCH:
                raise RuntimeError("killed")

    def arguments(folder, **overrides):
        settings = dict(output_dir=str(tmp_path / folder), max_steps=STEPS, per_device_train_batch_size=BATCH,
                        learning_rate=LR, lr_scheduler_type="linear", weight_decay=0.0, max_grad_norm=0.0,
                        logging_steps=100, save_strategy="steps", save_steps=PER_EPOCH, report_to=[], use_cpu=True,
                        disable_tqdm=True, seed=0, data_seed=0, dataloader_num_workers=0, eval_strategy="steps",
                        eval_steps=PER_EPOCH, per_device_eval_batch_size=STEPS // 2 * BATCH)
        return transformers.TrainingArguments(**{**settings, **overrides})

    def trainer(folder, model, extra=(), **overrides):
        recorder = Recorder()
        return SpeedkitTrainer(model=model, args=arguments(folder, **overrides), train_dataset=Pixels(),
                               eval_dataset=Pixels(), methods=[make()], callbacks=[recorder, *extra]), recorder

    if refusal is not None:
        model = Net()
        with pytest.raises((HostCannotServeError, ValueError), match=refusal[0]):
            trainer("refused", model, **refusal[1])[0].train()
        assert model.trained_forwards == 0
        return
    whole, recorder = trainer("whole", Net())
    whole.train()
    check_acted(whole.speedkit, name)
    check_lrs(recorder.lrs, muon=name == "muon")
    # The final weights are the ones the last evaluation measured.
    measured = next(h["eval_loss"] for h in reversed(whole.state.log_history) if "eval_loss" in h)
    assert measured == pytest.approx(plain_loss(whole.model), abs=1e-6)
    # The last checkpoint's model weights are the final ones (and so the measured ones).
    from safetensors.torch import load_file
    final = load_file(tmp_path / "whole" / f"checkpoint-{STEPS}" / "model.safetensors")
    for key, value in whole.model.state_dict().items():
        assert torch.equal(final[key], value), key

    killed, _ = trainer("killed", Net(), extra=[Kill()])
    with pytest.raises(RuntimeError, match="killed"):
        killed.train()
    resumed, resumed_recorder = trainer("killed", Net(seed=1))
    resumed.train(resume_from_checkpoint=str(tmp_path / "killed" / f"checkpoint-{PER_EPOCH}"))
    assert resumed_recorder.lrs == recorder.lrs[PER_EPOCH:]
    for key, value in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[key], value), key


RUN = {LOOP: loop_cell, LIGHTNING: lightning_cell, HF: hf_cell}


@pytest.mark.parametrize("name, host", TABLE, ids=[f"{host}-{name}" for name, host in TABLE])
def test_each_cell_trains_and_keeps_its_promises_or_is_refused_before_training(name, host, tmp_path):
    make, hosts = CELLS[name]
    RUN[host](name, make, hosts[host], tmp_path)


def test_the_table_covers_every_host_for_every_method_and_refusals_name_a_fix():
    for name, (make, hosts) in CELLS.items():
        assert set(hosts) == {LOOP, LIGHTNING, HF}, name
        assert make().name == name
        for refusal in hosts.values():
            assert refusal is None or re.search(r"remove|pass|add|use", refusal[0]), (name, refusal)


# -- every LR scheduler torch ships, in a plain loop with Muon ----------------------------------------------
SCHEDULERS = every_torch_scheduler(STEPS, LR)


def step_scheduler(scheduler) -> None:
    if isinstance(scheduler, lr_scheduler.ReduceLROnPlateau):
        scheduler.step(1.0)  # a metric that never improves: the rate is cut at every step
    else:
        scheduler.step()


def user_schedule_alone(name: str) -> list[float]:
    """The lr the user's scheduler gives AdamW at each step, in a loop without speedkit."""
    adamw = torch.optim.AdamW(Net().parameters(), lr=LR)
    scheduler = SCHEDULERS[name](adamw)
    lrs = []
    for _ in range(STEPS):
        lrs.append(adamw.param_groups[0]["lr"])
        adamw.step()
        step_scheduler(scheduler)
    return lrs


def run_loop_with_scheduler(name: str, methods=(), schedules=None) -> list[tuple[float, list[float]]]:
    """(AdamW's lr, Muon's groups' lrs) at each step of a plain loop with the user's scheduler ``name``."""
    sk = Speedkit(list(methods), max_duration=f"{STEPS}ba", train_dataloader=loader(), schedules=schedules)
    model = sk.prepare_model(Net())
    adamw = torch.optim.AdamW(model.parameters(), lr=LR)
    scheduler = SCHEDULERS[name](adamw)
    optimizer = sk.prepare_optimizer(adamw)
    added = [group for group in optimizer.param_groups if all(group is not g for g in adamw.param_groups)]
    rows = []
    while not sk.done:
        for batch in loader():
            batch = sk.batch(batch)
            sk.backward(sk.loss(model(batch[0]), batch))
            rows.append((adamw.param_groups[0]["lr"], [group["lr"] for group in added]))
            optimizer.step()
            step_scheduler(scheduler)
            optimizer.zero_grad(set_to_none=True)
            sk.step_end()
            if sk.done:
                break
    return rows


def test_the_schedulers_are_every_class_torch_ships():
    shipped = {name for name in lr_scheduler.__all__ if name != "LRScheduler"}
    assert set(SCHEDULERS) == shipped


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_muon_follows_every_torch_scheduler_as_the_users_optimizer_does(name):
    alone = user_schedule_alone(name)
    assert len(set(alone)) > 1, "the schedule must change the rate for the test to mean something"
    rows = run_loop_with_scheduler(name, [Muon(lr=MUON_LR)])
    assert len(rows) == STEPS
    for step, ((adamw_lr, muon_lrs), expected) in enumerate(zip(rows, alone)):
        assert adamw_lr == pytest.approx(expected, rel=1e-9), step  # speedkit leaves the user's group alone
        assert muon_lrs, "Muon added no group"
        for lr in muon_lrs:  # Muon's lr changes by the same ratio as the user's
            assert lr == pytest.approx(MUON_LR * expected / LR, rel=1e-9), (step, rows)


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_speedkit_schedules_beside_any_torch_scheduler_are_refused_before_training(name):
    refusal = (rf"schedules='cosine' and your own LR scheduler would both set the learning rate in this loop; "
               rf"keep one: .*found: your .*{name}")
    with pytest.raises(HostCannotServeError, match=refusal):
        run_loop_with_scheduler(name, [Muon(lr=MUON_LR)], schedules="cosine")


def fit_lightning_with_scheduler(name: str, schedules=None) -> list[list[float]]:
    """Every group's lr at each optimizer step of ``lightning.Trainer.fit`` with Muon, the user's scheduler
    ``name`` returned by configure_optimizers (stepped each step; ReduceLROnPlateau on a metric that never improves)."""
    L = import_or_missing("lightning.pytorch", "pip install 'torch-speedkit[lightning]'")
    from speedkit.hosts.lightning import SpeedkitCallback

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = Net()

        def training_step(self, batch, batch_idx):
            self.log("plateau", 1.0)
            return F.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            adamw = torch.optim.AdamW(self.parameters(), lr=LR)
            return {"optimizer": adamw, "lr_scheduler": {"scheduler": SCHEDULERS[name](adamw), "interval": "step",
                                                         "monitor": "plateau"}}

    class Recorder(L.Callback):
        def __init__(self):
            self.lrs = []

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            self.lrs.append([g["lr"] for g in optimizer.param_groups])

    recorder = Recorder()
    L.Trainer(callbacks=[SpeedkitCallback([Muon(lr=MUON_LR)], schedules=schedules), recorder], accelerator="cpu",
              devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
              enable_checkpointing=False, max_steps=STEPS).fit(Module(), loader())
    return recorder.lrs


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_lightning_muon_follows_every_torch_scheduler_as_the_users_optimizer_does(name):
    alone = user_schedule_alone(name)
    rows = fit_lightning_with_scheduler(name)
    assert len(rows) == STEPS
    for step, ((adamw_lr, *muon_lrs), expected) in enumerate(zip(rows, alone)):
        assert adamw_lr == pytest.approx(expected, rel=1e-9), step
        assert muon_lrs and all(lr == pytest.approx(MUON_LR * expected / LR, rel=1e-9) for lr in muon_lrs), (step, rows)


def test_lightning_refuses_speedkit_schedules_beside_a_reduce_on_plateau():
    with pytest.raises(HostCannotServeError, match=r"schedules='cosine' and your own LR scheduler would both set the "
                                                   r"learning rate in Lightning; keep one: .*found: your "
                                                   r"ReduceLROnPlateau"):
        fit_lightning_with_scheduler("ReduceLROnPlateau", schedules="cosine")


# -- gradient accumulation (issue 55.4) ------------------------------------------------------------------------
# Each host's own accumulation option, with microbatches of MICRO samples, against speedkit's Trainer with
# grad_accum=ACCUM on loader batches of ACCUM * MICRO: the same optimizer steps, so the same lr at every step
# (speedkit's schedule, Muon's group included), the same clock, EMA counting steps, clipping once a step, and the
# same final weights.
ACCUM, MICRO = 2, BATCH // 2
ACCUM_STEPS = STEPS  # two epochs of PER_EPOCH optimizer steps
SGD_LR = 0.1  # SGD, on which gradient clipping and the loss's scale show (Adam and Muon normalize them away)


def accumulation_methods():
    return [EMA(half_life="0.25dur"), Muon(lr=MUON_LR), GradientClipping(clipping_type="norm", clipping_threshold=0.02)]


def group_lrs(optimizers) -> list[float]:
    """The distinct lrs of every group (a host may split the optimizer's parameters into groups of equal settings)."""
    return sorted({round(g["lr"], 12) for o in optimizers for g in o.param_groups})


def accumulation_loader(batch_size):
    x, y = data()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch_size)


def trainer_accumulated(tmp_path):
    """speedkit's Trainer: whole batches of ACCUM * MICRO, each split into ACCUM microbatches."""
    from speedkit import Trainer
    from speedkit.core.engine import Callback

    class Recorder(Callback):
        def __init__(self):
            self.lrs = []

        def batch_end(self, state, logger):
            self.lrs.append(group_lrs(state.optimizers))

    recorder, model = Recorder(), Net()
    trainer = Trainer(model, accumulation_loader(ACCUM * MICRO), max_duration="2ep", grad_accum=ACCUM,
                      methods=accumulation_methods(), schedulers="cosine", callbacks=[recorder],
                      optimizers=lambda params: torch.optim.SGD(params, lr=SGD_LR), device="cpu",
                      run_dir=tmp_path / "trainer", save_checkpoints=False, progress_bar=False)
    trainer.fit()
    assert trainer.microbatch_size == MICRO
    ema = next(m for m in trainer.state.methods if m.name == "ema")
    return {"model": model, "lrs": recorder.lrs, "clock": trainer.state.timestamp, "ema": (ema.updates, ema.smoothing)}


def check_same_run(host, reference, session):
    assert len(host["lrs"]) == len(reference["lrs"]) == ACCUM_STEPS
    for step, (got, want) in enumerate(zip(host["lrs"], reference["lrs"])):
        assert got == pytest.approx(want, rel=1e-6), step
    assert len(reference["lrs"][0]) == 2  # SGD's and Muon's, each on speedkit's schedule
    clock, want = session.state.timestamp, reference["clock"]
    assert (clock.batch, clock.sample, clock.epoch) == (want.batch, want.sample, want.epoch) == (
        ACCUM_STEPS, ACCUM_STEPS * ACCUM * MICRO, 2)
    ema = next(m for m in session.methods if m.name == "ema")  # one update a step, its half-life in steps
    assert (ema.updates, ema.smoothing) == pytest.approx(reference["ema"]) and ema.updates == ACCUM_STEPS
    for key, value in reference["model"].state_dict().items():
        torch.testing.assert_close(host["model"].state_dict()[key], value, rtol=1e-5, atol=1e-7, msg=key)


def test_lightning_accumulate_grad_batches_equals_the_trainers_grad_accum(tmp_path):
    L = import_or_missing("lightning.pytorch", "pip install 'torch-speedkit[lightning]'")
    from speedkit.hosts.lightning import SpeedkitCallback

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = Net()

        def training_step(self, batch, batch_idx):
            batch = self.speedkit.batch(batch)
            return self.speedkit.loss(self.net(batch[0]), batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=SGD_LR)

    class Recorder(L.Callback):
        lrs: list = []

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            self.lrs.append(group_lrs(callback.session.state.optimizers))

    module, callback, recorder = Module(), SpeedkitCallback(accumulation_methods(), schedules="cosine"), Recorder()
    recorder.lrs = []
    trainer = L.Trainer(callbacks=[callback, recorder], accumulate_grad_batches=ACCUM, max_epochs=2,
                        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0)
    trainer.fit(module, accumulation_loader(MICRO))
    assert trainer.global_step == ACCUM_STEPS
    check_same_run({"model": module.net, "lrs": recorder.lrs}, trainer_accumulated(tmp_path), callback.session)


def test_hf_gradient_accumulation_steps_equals_the_trainers_grad_accum(tmp_path):
    transformers = import_or_missing("transformers", "pip install 'torch-speedkit[hf]'")
    from speedkit.hosts.hf import SpeedkitTrainer

    class InOrder(SpeedkitTrainer):
        def _get_train_sampler(self, *args, **kwargs):  # the reference's loader does not shuffle
            return torch.utils.data.SequentialSampler(self.train_dataset)

    class Recorder(transformers.TrainerCallback):
        lrs: list = []

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.lrs.append(group_lrs(trainer.speedkit.state.optimizers))

    recorder = Recorder()
    recorder.lrs = []
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), num_train_epochs=2, per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=ACCUM, optim="sgd", learning_rate=SGD_LR, lr_scheduler_type="constant",
        weight_decay=0.0, max_grad_norm=0.0, logging_steps=100, save_strategy="no", report_to=[], use_cpu=True,
        disable_tqdm=True, seed=0, dataloader_num_workers=0)
    model = Net()
    trainer = InOrder(model=model, args=args, train_dataset=Pixels(), methods=accumulation_methods(),
                      schedules="cosine", callbacks=[recorder])
    trainer.train()
    assert trainer.state.global_step == ACCUM_STEPS
    check_same_run({"model": model, "lrs": recorder.lrs}, trainer_accumulated(tmp_path), trainer.speedkit)


def test_a_plain_loop_with_accumulation_equals_the_trainers_grad_accum(tmp_path):
    model = Net()
    sk = Speedkit(accumulation_methods(), max_duration="2ep", train_dataloader=accumulation_loader(MICRO),
                  schedules="cosine", accumulation=ACCUM)
    model = sk.prepare_model(model)
    optimizer = sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=SGD_LR))
    lrs, due = [], []
    while not sk.done:
        for batch in accumulation_loader(MICRO):
            batch = sk.batch(batch)
            sk.backward(sk.loss(model(batch[0]), batch))
            due.append(sk.step_due)
            if sk.step_due:
                lrs.append(group_lrs(sk.state.optimizers))
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            sk.step_end()
    sk.finish()
    assert due == [False, True] * ACCUM_STEPS
    check_same_run({"model": model, "lrs": lrs}, trainer_accumulated(tmp_path), sk.session)


def test_accelerate_gradient_accumulation_steps_equals_the_trainers_grad_accum(tmp_path):
    accelerate = import_or_missing("accelerate", "pip install 'torch-speedkit[accelerate]'")
    from accelerate.state import AcceleratorState, GradientState

    accelerator = accelerate.Accelerator(gradient_accumulation_steps=ACCUM, cpu=True)
    try:
        model, loader = Net(), accumulation_loader(MICRO)
        sk = Speedkit(accumulation_methods(), max_duration="2ep", train_dataloader=loader, schedules="cosine",
                      accelerator=accelerator)
        model = sk.prepare_model(model)
        optimizer = sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=SGD_LR))
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        lrs = []
        while not sk.done:
            for batch in loader:
                with accelerator.accumulate(model):
                    batch = sk.batch(batch)
                    sk.backward(sk.loss(model(batch[0]), batch))
                    if sk.step_due:
                        lrs.append(group_lrs(sk.state.optimizers))
                    optimizer.step()  # accelerate's optimizer steps only when the gradients sync
                    optimizer.zero_grad()
                    sk.step_end()
        sk.finish()
        check_same_run({"model": accelerator.unwrap_model(model), "lrs": lrs}, trainer_accumulated(tmp_path),
                       sk.session)
    finally:
        accelerator.end_training()
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
