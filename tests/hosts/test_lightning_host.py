"""speedkit's methods in a real ``lightning.Trainer.fit`` on CPU: surgery, EMA, Muon, label smoothing,
mixup/cutmix, progressive resizing and sequence-length warmup, schedules as fractions of max_steps/max_epochs;
a kill and a resume through Lightning's own checkpoint end equal to an uninterrupted run; refusals."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from prerequisites import import_or_missing

L = import_or_missing("lightning.pytorch", "pip install 'torch-speedkit[lightning]'")

from speedkit.core import Event, Method  # noqa: E402
from speedkit.core.method import MethodCard  # noqa: E402
from speedkit.hosts import HostCannotServeError, OptimizerGroup  # noqa: E402
from speedkit.hosts.lightning import SpeedkitCallback  # noqa: E402
from speedkit.methods.ema import init_ema  # noqa: E402
from speedkit.methods import (EMA, AlternatingFlip, Autocast, BlurPool, CutMix, LabelSmoothing, MixUp,  # noqa: E402
                              Muon, ProgressiveResizing, QKNorm, ReLUSquared,
                              RotaryEmbeddings, SeqLengthWarmup)
from speedkit.models import get_model  # noqa: E402
from speedkit.optim.muon import Muon as MuonOptimizer  # noqa: E402

QUIET = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
             num_sanity_val_steps=0, enable_checkpointing=False)


def image_loader(n: int = 64, batch_size: int = 16):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 1, 16, 16, generator=g), torch.randint(0, 4, (n,), generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch_size)


class Classifier(L.LightningModule):
    """A LightningModule as its docs write one, plus speedkit's two marked lines in training_step."""

    def __init__(self, seed: int = 0, criterion=None):
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, stride=2, padding=1),
                                 nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))
        self.criterion, self.sizes = criterion, []

    def forward(self, x):
        self.sizes.append(x.shape[-1])
        return self.net(x)

    def training_step(self, batch, batch_idx):
        batch = self.speedkit.batch(batch)                                  # speedkit
        x, _ = batch
        return self.speedkit.loss(self(x), batch, self.criterion)           # speedkit

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class PlainClassifier(Classifier):
    """No speedkit lines in training_step."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)


def method(callback, name):
    return next(m for m in callback.session.methods if m.name == name)


def test_vision_methods_run_in_lightning_fit_by_fractions_of_max_steps():
    seen_targets = []

    def criterion(logits, targets):
        seen_targets.append(targets)
        return F.cross_entropy(logits, targets)

    module = Classifier(criterion=criterion)
    callback = SpeedkitCallback([BlurPool(), EMA(half_life="0.25dur"), Muon(lr=0.02), LabelSmoothing(0.1),
                                 MixUp(alpha=0.4), ProgressiveResizing(initial_scale=0.5, finetune_fraction=0.25)],
                                schedules="cosine")
    trainer = L.Trainer(max_steps=8, callbacks=[callback], **QUIET)
    trainer.fit(module, image_loader())

    assert any("blurpool: changed" in note for note in callback.session.record.notes["surgery"])
    assert isinstance(trainer.optimizers[0], OptimizerGroup)
    assert any(isinstance(o, MuonOptimizer) for o in trainer.optimizers[0].optimizers)
    ema = method(callback, "ema")
    assert ema.updates == 8 and ema.smoothing == pytest.approx(0.5 ** (1 / 2))  # half-life: 0.25 of 8 steps
    assert module.sizes[0] < 16 and module.sizes[-1] == 16  # progressive resizing reached full size at the end
    dense = seen_targets[0]
    assert dense.shape == (16, 4) and dense.is_floating_point() and dense.min() > 0  # mixed, then smoothed
    adamw = trainer.optimizers[0].optimizers[0]
    assert adamw.param_groups[0]["lr"] < 0.05 * 1e-2  # cosine, as a fraction of max_steps: near zero at the end
    assert callback.session.state.timestamp.batch == 8


def test_cutmix_and_resizing_follow_max_epochs():
    module = Classifier()
    callback = SpeedkitCallback([CutMix(alpha=1.0), ProgressiveResizing(initial_scale=0.5, finetune_fraction=0.5)])
    trainer = L.Trainer(max_epochs=2, callbacks=[callback], **QUIET)
    trainer.fit(module, image_loader())  # 4 batches an epoch
    state = callback.session.state
    assert str(state.max_duration) == "2ep" and state.batches_per_epoch == 4
    assert state.timestamp.epoch == 2 and state.timestamp.batch == 8
    assert module.sizes[:4] != [16] * 4 and module.sizes[4:] == [16] * 4  # full size for the second half
    assert callback.session.engine.events_of("cutmix")[speedkit_event("before_forward")] == 8


@pytest.mark.parametrize("limits, length", [(dict(max_steps=100, max_epochs=2), "2ep"),
                                             (dict(max_steps=6, max_epochs=2), "6ba")])
def test_with_max_steps_and_max_epochs_schedules_end_where_lightning_ends_the_run(limits, length):
    """Lightning stops at whichever limit comes first. speedkit took max_steps whenever it was set, so with
    max_epochs=2 of 4 steps ending a max_steps=100 run, the cosine schedule, EMA's half-life and progressive
    resizing ran as fractions of 100 steps in an 8-step run: the rate never fell and the images never grew."""
    module = Classifier()
    callback = SpeedkitCallback([ProgressiveResizing(initial_scale=0.5, finetune_fraction=0.25)], schedules="cosine")
    trainer = L.Trainer(callbacks=[callback], **limits, **QUIET)
    trainer.fit(module, image_loader())  # 4 batches an epoch
    state = callback.session.state
    assert str(state.max_duration) == length and state.timestamp.batch == min(8, limits["max_steps"])
    assert module.sizes[-1] == 16  # full size at the end
    assert trainer.optimizers[0].param_groups[0]["lr"] < 0.1 * 1e-2  # cosine near its end at the run's end


def speedkit_event(name):
    from speedkit.core import Event

    return Event(name)


class TinyLM(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.gpt = get_model("gpt-nano", n_layer=1, n_embd=32, n_head=2, block_size=32)
        self.lengths = []

    def training_step(self, batch, batch_idx):
        batch = self.speedkit.batch(batch)                                  # speedkit
        idx, _ = batch
        self.lengths.append(idx.shape[1])
        return self.speedkit.loss(self.gpt(idx), batch)                     # speedkit

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def test_language_surgeries_and_sequence_length_warmup_in_lightning():
    tokens = torch.randint(0, 256, (32, 33), generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])
    module = TinyLM()
    callback = SpeedkitCallback([RotaryEmbeddings(), QKNorm(), ReLUSquared(), Muon(),
                                 SeqLengthWarmup(duration=0.5, min_seq_length=8, truncate=True)])
    trainer = L.Trainer(max_steps=6, callbacks=[callback], **QUIET)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8))
    notes = " ".join(callback.session.record.notes["surgery"])
    assert "rotary_embeddings: changed" in notes and "qk_norm: changed" in notes and "relu_squared: changed" in notes
    assert module.lengths[0] < 32 and module.lengths[-1] == 32 and module.lengths == sorted(module.lengths)
    assert any(n.endswith("qk_norm.q_gain") for n, _ in module.named_parameters())


class Kill(L.Callback):
    """Dies at the start of the second epoch, after Lightning saved the first epoch's checkpoint."""

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == 1:
            raise RuntimeError("killed")


def resumable_methods():
    return [EMA(half_life="3ba"), Muon(lr=0.02), LabelSmoothing(0.1),
            ProgressiveResizing(initial_scale=0.5, finetune_fraction=0.25)]


def test_a_kill_and_resume_through_lightning_checkpoints_ends_as_an_uninterrupted_run(tmp_path):
    whole = Classifier()
    whole_callback = SpeedkitCallback(resumable_methods(), schedules="cosine")
    L.Trainer(max_epochs=2, callbacks=[whole_callback], **QUIET).fit(whole, image_loader())

    killed = Classifier()
    saver = L.callbacks.ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_epochs=1)
    quiet = {**QUIET, "enable_checkpointing": True, "default_root_dir": tmp_path / "lightning"}
    with pytest.raises(RuntimeError, match="killed"):
        L.Trainer(max_epochs=2, callbacks=[SpeedkitCallback(resumable_methods(), schedules="cosine"), saver, Kill()],
                  **quiet).fit(killed, image_loader())
    (checkpoint,) = tmp_path.glob("*.ckpt")
    assert "SpeedkitCallback" in torch.load(checkpoint, weights_only=False)["callbacks"]

    resumed = Classifier(seed=1)  # other starting weights: everything must come from the checkpoint
    callback = SpeedkitCallback(resumable_methods(), schedules="cosine")
    L.Trainer(max_epochs=2, callbacks=[callback], **quiet).fit(resumed, image_loader(), ckpt_path=checkpoint)

    for (name, ours), theirs in zip(resumed.state_dict().items(), whole.state_dict().values()):
        assert torch.allclose(ours, theirs, atol=1e-6), name  # EMA's final weights, after Muon's steps
    assert method(callback, "ema").updates == method(whole_callback, "ema").updates == 8
    assert resumed.sizes == whole.sizes[4:]  # resizing resumed where it was in the schedule

    # the same checkpoint resumed into a longer run: the schedules would jump from half way to a third of the way
    longer = SpeedkitCallback(resumable_methods(), schedules="cosine")
    with pytest.raises(HostCannotServeError, match=r"was 2ep long, 50% of the way through it, and this one is 3ep "
                                                   r"long \(33% of the way\).*max_steps and max_epochs"):
        L.Trainer(max_epochs=3, callbacks=[longer], **quiet).fit(Classifier(), image_loader(), ckpt_path=checkpoint)


def one_epoch_checkpoint(folder, module, callbacks):
    saver = L.callbacks.ModelCheckpoint(dirpath=folder, save_top_k=-1, every_n_epochs=1)
    L.Trainer(max_epochs=1, callbacks=[*callbacks, saver], **{**QUIET, "enable_checkpointing": True,
                                                               "default_root_dir": folder}).fit(module, image_loader())
    (checkpoint,) = folder.glob("*.ckpt")
    return checkpoint


class OptimizerAtStart(L.Callback):
    """The optimizer state as restored, when training resumes."""

    def on_train_start(self, trainer, pl_module):
        (optimizer,) = trainer.optimizers
        self.state = {name: {k: v.clone() for k, v in optimizer.state.get(p, {}).items()}
                      for name, p in pl_module.named_parameters()}


def test_a_muon_checkpoint_resumed_without_the_callback_goes_on_as_a_plain_run(tmp_path):
    checkpoint = one_epoch_checkpoint(tmp_path / "muon", Classifier(), [SpeedkitCallback([Muon(lr=0.02)])])
    saved = torch.load(checkpoint, weights_only=True)
    adamw_saved, muon_saved = saved["optimizer_states"][0]["optimizers"]
    assert muon_saved["state"]  # Muon stepped: its momentum is in the file

    resumed, at_start = PlainClassifier(seed=1), OptimizerAtStart()
    trainer = L.Trainer(max_epochs=2, callbacks=[at_start], **QUIET)
    with pytest.warns(UserWarning, match="SpeedkitCallback"):  # Lightning's own: the callback is missing
        trainer.fit(resumed, image_loader(), ckpt_path=checkpoint)  # was a bare KeyError: 'param_groups'
    assert trainer.global_step == 8  # resumed at step 4, trained the second epoch
    # The head stayed with AdamW under Muon: its moments resume; the conv filters were Muon's and start afresh.
    head_index = adamw_saved["param_groups"][0]["params"][-2]
    assert torch.equal(at_start.state["net.6.weight"]["exp_avg"], adamw_saved["state"][head_index]["exp_avg"])
    assert at_start.state["net.6.weight"]["step"] == 4
    assert at_start.state["net.0.weight"] == {} and at_start.state["net.2.weight"] == {}
    assert set(at_start.state["net.0.bias"]) == {"step", "exp_avg", "exp_avg_sq"}


def test_a_plain_checkpoint_resumed_with_the_callback_is_refused_before_training(tmp_path):
    checkpoint = one_epoch_checkpoint(tmp_path / "plain", PlainClassifier(), [])
    module = Classifier(seed=1)
    with pytest.raises(ValueError, match=r"written without SpeedkitCallback.*\(muon\).*Resume it as it was written"):
        L.Trainer(max_epochs=2, callbacks=[SpeedkitCallback([Muon()])], **QUIET).fit(
            module, image_loader(), ckpt_path=checkpoint)
    assert module.sizes == []  # no forward ran


class ManualClassifier(PlainClassifier):
    """Manual optimization: training_step steps the optimizer itself, every ``every``-th batch."""

    def __init__(self, every: int):
        super().__init__()
        self.automatic_optimization, self.every = False, every

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        self.manual_backward(F.cross_entropy(self(batch[0]), batch[1]))
        if (batch_idx + 1) % self.every == 0:
            optimizer.step()
            optimizer.zero_grad()


def test_manual_optimization_steps_speedkits_clock_and_accumulating_by_hand_is_refused():
    """Under manual optimization speedkit's clock counts the steps training_step makes; a training_step that
    accumulates gradients over two batches was counted as two steps, so schedules ran twice as fast as
    Lightning's max_steps and EMA averaged weights that had not moved, without a word."""
    callback = SpeedkitCallback([EMA(half_life="1ba")])
    trainer = L.Trainer(max_steps=3, callbacks=[callback], **QUIET)
    trainer.fit(ManualClassifier(every=1), image_loader())
    assert callback.session.state.timestamp.batch == trainer.global_step == 3
    trainer = L.Trainer(max_steps=3, callbacks=[SpeedkitCallback([EMA(half_life="1ba")])], **QUIET)
    with pytest.raises(HostCannotServeError, match=r"accumulate_grad_batches=k\), or step the optimizers"):
        trainer.fit(ManualClassifier(every=2), image_loader())


def test_a_batch_method_without_the_step_call_is_refused_before_training():
    module = PlainClassifier()
    trainer = L.Trainer(max_steps=2, callbacks=[SpeedkitCallback([MixUp()])], **QUIET)
    with pytest.raises(HostCannotServeError, match=r"mixup needs before_forward.*Lightning.*"
                                                   r"`batch = self.speedkit.batch\(batch\)`"):
        trainer.fit(module, image_loader())
    assert module.sizes == []  # refused at setup: not one forward ran


class InputsBeforeTheBatchCall(Classifier):
    """Takes x from the loader's batch, then makes the batch call: the forward sees the images before resizing."""

    def training_step(self, batch, batch_idx):
        x, _ = batch
        batch = self.speedkit.batch(batch)
        return self.speedkit.loss(self(x), batch, self.criterion)


def test_a_forward_given_the_inputs_from_before_the_batch_call_is_refused():
    """Progressive resizing made the batch smaller; the model trained at the loader's size all the same, and the
    run counted it as resized. Refused as that first forward is called, before it computes anything."""
    module = InputsBeforeTheBatchCall()
    trainer = L.Trainer(max_steps=2, callbacks=[SpeedkitCallback([ProgressiveResizing(initial_scale=0.5)])],
                        **QUIET)
    with pytest.raises(HostCannotServeError, match=r"forward was given the inputs from before the batch methods "
                                                   r"replaced them \(progressive_resizing\)"):
        trainer.fit(module, image_loader())
    assert module.sizes == []


@pytest.mark.parametrize("refused, message", [
    (AlternatingFlip(), r"alternating_flip cannot run in Lightning: .*DataModule.*alternate_flips\(dataset, sampler"),
    (Autocast(), r"autocast cannot run in Lightning: .*precision='bf16-mixed'"),
])
def test_methods_lightning_cannot_serve_are_refused(refused, message):
    trainer = L.Trainer(max_steps=2, callbacks=[SpeedkitCallback([refused])], **QUIET)
    with pytest.raises(HostCannotServeError, match=message):
        trainer.fit(Classifier(), image_loader())


class Recorder(PlainClassifier):
    """Keeps every training batch it is given, by epoch."""

    def __init__(self):
        super().__init__()
        self.batches = {}

    def training_step(self, batch, batch_idx):
        self.batches.setdefault(self.current_epoch, []).append([t.clone() for t in batch])
        return F.cross_entropy(self(batch[0]), batch[1])


def test_the_refusals_fix_for_alternating_flips_flips_alternately_in_a_lightning_fit():
    """The fix the alternating_flip refusal names: the DataModule's loader flips each image on alternate epochs,
    the same images as speedkit's loader with the same seed, because Lightning tells the sampler the epoch."""
    from speedkit.data.per_image import alternate_flips
    from speedkit.functional import alternating_flip_mask

    x = torch.randn(32, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    y = torch.arange(32) % 4
    ids = torch.arange(32)
    dataset, sampler = alternate_flips(torch.utils.data.TensorDataset(x, y, ids),
                                       torch.utils.data.SequentialSampler(range(32)), seed=5)
    module = Recorder()
    L.Trainer(max_epochs=3, **QUIET).fit(module, torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler))
    for epoch in range(3):
        images, _, seen = (torch.cat(parts) for parts in zip(*module.batches[epoch]))
        flipped = torch.tensor([torch.equal(image, x[i].flip(-1)) for image, i in zip(images, seen)])
        kept = torch.tensor([torch.equal(image, x[i]) for image, i in zip(images, seen)])
        assert torch.equal(flipped, alternating_flip_mask(32, epoch, seed=5)[seen]) and bool((flipped ^ kept).all())


class StartingWeights(Method):
    """An averaging method a host has never heard of: it keeps the starting weights and evaluates with them."""

    CARD = MethodCard(name="starting_weights", summary="Evaluate with the starting weights.", domain="any",
                      events=(Event.FIT_START,), reads=("model",), writes=("eval",))

    def __init__(self):
        super().__init__()
        self.kept = None

    def apply(self, event, state, logger):
        self.kept = init_ema(state.model)

    def averaged_weights(self):
        return self.kept

    def evaluates_average(self):
        return True


def test_a_new_averaging_methods_weights_are_a_checkpoints_model_weights_with_no_host_change(tmp_path):
    module = Classifier()
    start = {k: v.clone() for k, v in module.state_dict().items()}
    checkpoint = torch.load(one_epoch_checkpoint(tmp_path, module, [SpeedkitCallback([StartingWeights()])]),
                            weights_only=True)
    for name, saved in checkpoint["state_dict"].items():
        assert torch.equal(saved, start[name]), name  # the weights evaluation measures
    training = checkpoint["callbacks"]["SpeedkitCallback"]["training_weights"]
    assert not torch.equal(training["net.0.weight"], start["net.0.weight"])  # trained on, for a resume


class Validated(Classifier):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)


class SaveMidValidation(L.Callback):
    def __init__(self, path):
        self.path, self.weights_then = path, None

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self.weights_then is None:
            self.weights_then = {k: v.clone() for k, v in pl_module.state_dict().items()}  # EMA's, swapped in
            trainer.save_checkpoint(self.path)


def test_a_checkpoint_saved_mid_validation_keeps_emas_average_apart_from_the_training_weights(tmp_path):
    module, saver = Validated(), SaveMidValidation(tmp_path / "mid.ckpt")
    L.Trainer(max_steps=4, val_check_interval=2, limit_val_batches=2,
              callbacks=[SpeedkitCallback([EMA(half_life="2ba")]), saver], **QUIET).fit(
        module, image_loader(), image_loader(32))
    saved = torch.load(saver.path, weights_only=True)
    own = saved["callbacks"]["SpeedkitCallback"]
    for name, average in saver.weights_then.items():
        assert torch.equal(saved["state_dict"][name], average), name
        assert torch.equal(own["methods"]["ema"]["ema"][name], average), name  # the EMA state resumes its average
    assert not torch.equal(own["training_weights"]["net.0.weight"], saver.weights_then["net.0.weight"])
