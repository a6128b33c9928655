"""Issue 41: what the hosts did wrong without a word, each through a real host: a user's OneCycle with Muon in
Lightning, speedkit schedules on top of a user's scheduler, EMA's default half-life in a short plain loop,
test-time augmentation in a loop that never calls the evaluation hooks, and evaluation calls Lightning's code
check is fooled by."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from prerequisites import import_or_missing

from speedkit.hosts import HostCannotServeError, Speedkit
from speedkit.methods import EMA, Muon, TestTimeAugmentation


def images(n: int = 64, batch_size: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 4, (n,), generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch_size)


def net(seed: int = 0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 4))


def train_loop(sk, model, optimizer, loader, scheduler=None, evaluate=None):
    while not sk.done:
        for batch in loader:
            batch = sk.batch(batch)
            sk.backward(sk.loss(model(batch[0]), batch))
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            optimizer.zero_grad()
            sk.step_end()
            if sk.done:
                break
        if evaluate is not None:
            with sk.evaluating():
                evaluate(model)
    sk.finish()


# -- 1: the user's scheduler and Muon -----------------------------------------------------------------------
def test_lightning_muon_follows_the_users_one_cycle_and_schedules_on_top_are_refused():
    L = import_or_missing("lightning.pytorch", "pip install 'torch-speedkit[lightning]'")
    from speedkit.hosts.lightning import SpeedkitCallback

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net()

        def training_step(self, batch, batch_idx):
            return F.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            adamw = torch.optim.AdamW(self.parameters(), lr=1e-3)
            cycle = torch.optim.lr_scheduler.OneCycleLR(adamw, max_lr=3e-3, total_steps=8)
            return {"optimizer": adamw, "lr_scheduler": {"scheduler": cycle, "interval": "step"}}

    class Recorder(L.Callback):
        def __init__(self):
            self.lrs = []

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            self.lrs.append([g["lr"] for g in optimizer.param_groups])

    quiet = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                 enable_checkpointing=False, max_steps=8)
    recorder = Recorder()
    L.Trainer(callbacks=[SpeedkitCallback([Muon(lr=0.02)]), recorder], **quiet).fit(Module(), images())
    adamw, muon = zip(*recorder.lrs)
    assert max(adamw) == pytest.approx(3e-3, rel=0.05) and len(set(muon)) > 4  # Muon's lr moves with the cycle
    for a, m in zip(adamw, muon):
        assert m / 0.02 == pytest.approx(a / 3e-3)  # Muon's lr is its peak, as max_lr is AdamW's

    module = Module()
    with pytest.raises(HostCannotServeError, match=r"schedules='cosine' and your own LR scheduler would both "
                                                   r"set the learning rate in Lightning; keep one: remove "
                                                   r"SpeedkitCallback"):
        L.Trainer(callbacks=[SpeedkitCallback([Muon()], schedules="cosine")], **quiet).fit(module, images())


def test_a_plain_loop_refuses_schedules_on_top_of_a_users_scheduler_before_the_first_step():
    model = net()
    sk = Speedkit([Muon()], max_duration="8ba", train_dataloader=images(), schedules="cosine")
    sk.prepare_model(model)
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.optim.lr_scheduler.LambdaLR(adamw, lambda step: 1.0)
    with pytest.raises(HostCannotServeError, match=r"keep one: remove Speedkit\(schedules=...\)"):
        sk.prepare_optimizer(adamw)


def test_the_hugging_face_trainer_refuses_schedules_with_its_own_scheduler(tmp_path):
    transformers = import_or_missing("transformers", "pip install 'torch-speedkit[hf]'")
    from speedkit.hosts.hf import SpeedkitTrainer

    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=2, report_to=[], use_cpu=True,
                                          lr_scheduler_type="linear")
    with pytest.raises(HostCannotServeError, match=r"lr_scheduler_type='linear' would both set the learning rate.*"
                                                   r"lr_scheduler_type='constant'"):
        SpeedkitTrainer(model=net(), args=args, methods=[EMA()], schedules="cosine")


# -- 2: EMA's default half-life is a fraction of the run --------------------------------------------------------
def test_emas_default_half_life_is_a_tenth_of_a_short_plain_loop_and_a_long_one_is_warned_about():
    model = net()
    sk = Speedkit([EMA()], max_duration="64ba", train_dataloader=images())
    sk.prepare_model(model)
    optimizer = sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    train_loop(sk, model, optimizer, images())
    ema = sk.methods[0]
    assert ema.smoothing == pytest.approx(0.5 ** (1 / 6.4))  # half-life 6.4 batches, not 50
    assert ema.updates == 64

    model = net()
    sk = Speedkit([EMA(half_life="50ba")], max_duration="64ba", train_dataloader=images())
    sk.prepare_model(model)
    with pytest.warns(UserWarning, match=r"half-life of 50 batches is 78% of this 64-batch run.*0.1dur"):
        sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))


# -- 9: silent no-ops --------------------------------------------------------------------------------------------
def test_test_time_augmentation_in_a_loop_whose_evaluation_skips_the_hooks_is_refused():
    model = net()
    sk = Speedkit([TestTimeAugmentation()], max_duration="4ba", train_dataloader=images())
    sk.prepare_model(model)
    optimizer = sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(HostCannotServeError, match=r"test_time_augmentation needs eval_after_forward.*first evaluation "
                                                   r"did not reach.*`outputs = sk.eval_outputs\(outputs\)`"):
        train_loop(sk, model, optimizer, images(), evaluate=lambda m: m(torch.randn(2, 1, 8, 8)))

    model = net()
    sk = Speedkit([TestTimeAugmentation()], max_duration="4ba", train_dataloader=images())
    sk.prepare_model(model)
    optimizer = sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(HostCannotServeError, match=r"no `with sk.evaluating\(\):` evaluation ran"):
        train_loop(sk, model, optimizer, images())  # never evaluates: TTA did nothing


def test_lightning_refuses_evaluation_calls_a_condition_kept_from_running():
    L = import_or_missing("lightning.pytorch", "pip install 'torch-speedkit[lightning]'")
    from speedkit.hosts.lightning import SpeedkitCallback

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net, self.tta = net(), False

        def training_step(self, batch, batch_idx):
            return F.cross_entropy(self.net(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            logits = self.net(batch[0])
            if self.tta:  # the code names speedkit's call, but it never runs
                logits = self.speedkit.eval_outputs(logits)
            self.log("val_loss", F.cross_entropy(logits, batch[1]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, max_steps=4,
                        num_sanity_val_steps=0, callbacks=[SpeedkitCallback([TestTimeAugmentation()])])
    with pytest.raises(HostCannotServeError, match=r"test_time_augmentation needs eval_after_forward.*"
                                                   r"validation_step's first validation did not reach"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Module(), images(), images(16))


def test_a_plain_loops_accumulation_closes_a_step_at_an_epochs_end_and_bad_values_are_refused():
    """Issue 55.4: 4 batches an epoch in steps of 3 are a step of 3 and a step of 1 (as Lightning and the Hugging
    Face Trainer step at an epoch's end); "2ep" is 4 optimizer steps, and the clock counts every sample once."""
    model = net()
    sk = Speedkit([EMA(half_life="1ba")], max_duration="2ep", train_dataloader=images(), accumulation=3)
    model = sk.prepare_model(model)
    optimizer = sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    due, steps = [], 0
    while not sk.done:
        for batch in images():
            batch = sk.batch(batch)
            sk.backward(sk.loss(model(batch[0]), batch))
            due.append(sk.step_due)
            if sk.step_due:
                optimizer.step()
                optimizer.zero_grad()
                steps += 1
            sk.step_end()
    sk.finish()
    assert due == [False, False, True, True] * 2 and steps == 4
    clock = sk.state.timestamp
    assert (clock.epoch, clock.batch, clock.sample) == (2, 4, 128)
    assert next(m for m in sk.methods if m.name == "ema").updates == 4

    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match=r"accumulation must be a whole number of batches an optimizer step"):
            Speedkit([], max_duration="1ba", accumulation=bad)

    class Accelerator:  # what Speedkit reads of accelerate's: processes and its own accumulation
        num_processes, gradient_accumulation_steps = 1, 2

    with pytest.raises(ValueError, match=r"Speedkit\(accumulation=4\) and Accelerator\(gradient_accumulation_steps=2\) "
                                         r"disagree; set it once, in the Accelerator"):
        Speedkit([], max_duration="1ba", accelerator=Accelerator(), accumulation=4)
    assert Speedkit([], max_duration="1ba", accelerator=Accelerator()).accumulation == 2


# -- a need a card declares (SAM's step closure) is refused by every host from the card, in one message ------------
def hosts_that_do_not_rerun_the_step():
    import_or_missing("lightning.pytorch", "pip install 'torch-speedkit[lightning]'")
    import_or_missing("transformers", "pip install 'torch-speedkit[hf]'")
    from speedkit.hosts.hf import HF_CALLBACK, HF_TRAINER
    from speedkit.hosts.lightning import lightning_host
    from speedkit.hosts.loop import LOOP

    return [LOOP, lightning_host(("batch", "loss"), ("eval_batch", "eval_outputs")), HF_TRAINER, HF_CALLBACK]


def test_a_method_whose_card_needs_the_step_closure_is_refused_by_every_host_naming_method_host_and_fix():
    from speedkit.core import Event, Method
    from speedkit.core.method import MethodCard

    class TwoPassStep(Method):  # a method no host knows by name
        CARD = MethodCard(name="two_pass_step", summary="Steps with a closure.", domain="any",
                          events=(Event.FIT_START,), loop_needs=("step_closure",))

        def apply(self, event, state, logger):
            pass

    for host in hosts_that_do_not_rerun_the_step():
        with pytest.raises(HostCannotServeError) as refused:
            host.check([TwoPassStep()])
        assert str(refused.value) == (f"two_pass_step cannot run in {host.name}: its optimizer step runs the forward, "
                                      f"the loss and the backward a second time, with speedkit's events, through a "
                                      f"closure (optimizer.step(closure)), which {host.name} does not give; remove "
                                      f"it, or train with speedkit.Trainer")
    with pytest.raises(ValueError, match="unknown loop_needs"):
        MethodCard(name="typo", summary="", domain="any", events=(), loop_needs=("step_closur",))
