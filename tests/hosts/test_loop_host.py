"""speedkit's methods in a hand-written loop: the same losses as speedkit's Trainer for host-independent
methods, the calls a step must make, Muon's optimizer group, method state through the loop's checkpoint, and
the refusals of methods a loop cannot serve."""
from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers import toy_loaders, toy_model

from speedkit.hosts import HostCannotServeError, OptimizerGroup, Speedkit
from speedkit.methods import (EMA, SAM, AlternatingFlip, Autocast, Factorize, GradientClipping, LabelSmoothing,
                              MixUp, Muon, SqueezeExcite)
from speedkit.train.trainer import Trainer


def host_independent_methods():
    """Methods whose maths does not depend on who runs the loop (no random draws, no data loader)."""
    return [LabelSmoothing(0.1), GradientClipping(clipping_type="norm", clipping_threshold=0.5),
            EMA(half_life="4ba"), Muon(lr=0.02)]


def plain_loop(model, loader, methods, steps: int, schedules=None, killed_after: int | None = None):
    """The loop a user writes, with speedkit's marked calls; returns the per-step losses and the session.
    ``killed_after``: the run of ``steps`` batches ends there, as a kill would end it."""
    sk = Speedkit(methods, max_duration=f"{steps}ba", train_dataloader=loader, schedules=schedules)
    model = sk.prepare_model(model)
    optimizer = sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    losses = []
    while not sk.done:
        for batch in loader:
            batch = sk.batch(batch)
            loss = sk.loss(model(batch[0]), batch)
            sk.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sk.step_end()
            losses.append(loss.item())
            if sk.done or len(losses) == killed_after:
                return losses, sk, optimizer
    return losses, sk, optimizer


def test_a_plain_loop_gives_the_trainers_losses_and_weights(tmp_path):
    model = toy_model()
    train, _ = toy_loaders(batch_size=32, n=128, shuffle=False)  # 4 batches an epoch; 10 steps cross epochs
    trainer = Trainer(copy.deepcopy(model), train, max_duration="10ba", methods=host_independent_methods(),
                      optimizers=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), log_interval=1,
                      run_dir=tmp_path, save_checkpoints=False, nan_policy=None, schedulers="cosine")
    trainer.fit()
    _, expected = trainer.memory_logger.series("loss")

    losses, sk, optimizer = plain_loop(model, train, host_independent_methods(), steps=10, schedules="cosine")
    sk.finish()  # FIT_END: EMA's average into the model, as the Trainer's fit ends
    assert isinstance(optimizer, OptimizerGroup)  # Muon took the hidden matrix; SGD kept the rest
    assert losses == pytest.approx(expected, rel=1e-6, abs=1e-7)
    assert sk.state.timestamp.batch == 10 and sk.state.timestamp.epoch == 2
    for (name, ours), theirs in zip(model.state_dict().items(), trainer.state.model.state_dict().values()):
        assert torch.allclose(ours, theirs, atol=1e-6), name


def test_method_state_resumes_through_the_loops_checkpoint():
    train, _ = toy_loaders(batch_size=32, n=128, shuffle=False)
    whole_losses, whole, _ = plain_loop(toy_model(), train, [EMA(half_life="3ba"), Muon()], steps=8)

    model = toy_model()
    first_losses, first, optimizer = plain_loop(model, train, [EMA(half_life="3ba"), Muon()], steps=8,
                                                killed_after=4)
    saved = copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "speedkit": first.state_dict()})

    model = toy_model(seed=1)  # other weights: everything must come from the checkpoint
    sk = Speedkit([EMA(half_life="3ba"), Muon()], max_duration="8ba", train_dataloader=train)
    model = sk.prepare_model(model)
    optimizer = sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    sk.load_state_dict(saved["speedkit"])
    losses = []
    for batch in train:  # the second epoch
        batch = sk.batch(batch)
        loss = sk.loss(model(batch[0]), batch)
        sk.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        sk.step_end()
        losses.append(loss.item())
    assert first_losses + losses == pytest.approx(whole_losses, rel=1e-6)
    ema, whole_ema = (next(m for m in run.methods if m.name == "ema").ema for run in (sk, whole))
    assert all(torch.allclose(ema[k], whole_ema[k], atol=1e-7) for k in ema)


def test_a_resume_into_a_run_of_another_length_is_refused_at_load_state_dict():
    """Schedules are fractions of max_duration: the 8-batch run's checkpoint at batch 4 (cosine half way) resumed
    as a 16-batch run would restart the rate near its peak (a quarter of the way), without a word."""
    train, _ = toy_loaders(batch_size=32, n=128, shuffle=False)  # 4 batches an epoch
    _, first, _ = plain_loop(toy_model(), train, [EMA(half_life="0.5dur")], steps=8, schedules="cosine",
                             killed_after=4)
    saved = copy.deepcopy(first.state_dict())

    def resumed(max_duration):
        sk = Speedkit([EMA(half_life="0.5dur")], max_duration=max_duration, train_dataloader=train,
                      schedules="cosine")
        model = sk.prepare_model(toy_model())
        sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        return sk

    with pytest.raises(HostCannotServeError, match=r"checkpoint's run was 8ba long, 50% of the way through it, and "
                                                   r"this one is 16ba long \(25% of the way\).*max_duration"):
        resumed("16ba").load_state_dict(saved)
    resumed("2ep").load_state_dict(saved)  # the same length in epochs
    sk = resumed("8ba")
    sk.load_state_dict(saved)
    assert sk.state.timestamp.batch == 4


def test_a_resume_that_restores_the_optimizer_but_not_speedkit_is_refused_at_its_first_step():
    """Model and optimizer restored from a checkpoint, ``sk.load_state_dict`` forgotten: speedkit's clock would
    start at 0, so ``while not sk.done`` trains the whole max_duration again, schedules and EMA started over."""
    train, _ = toy_loaders(batch_size=32, n=128, shuffle=False)
    model = toy_model()
    _, first, optimizer = plain_loop(model, train, [EMA(half_life="0.5dur")], steps=8, killed_after=4)
    saved = copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict()})

    def resumed(**options):
        sk = Speedkit([EMA(half_life="0.5dur")], max_duration="8ba", train_dataloader=train, **options)
        resumed_model = sk.prepare_model(toy_model(seed=1))
        resumed_optimizer = sk.prepare_optimizer(torch.optim.SGD(resumed_model.parameters(), lr=0.1, momentum=0.9))
        resumed_model.load_state_dict(saved["model"])
        resumed_optimizer.load_state_dict(saved["optimizer"])
        return sk

    sk = resumed()
    with pytest.raises(HostCannotServeError, match=r"optimizer holds state from earlier steps.*sk.load_state_dict"):
        sk.batch(next(iter(train)))
    assert sk.state.timestamp.batch == 0
    sk = resumed()
    sk.load_state_dict(first.state_dict())  # the fix: the clock goes on from batch 4
    sk.batch(next(iter(train)))
    assert sk.state.timestamp.batch == 4
    resumed(warm_optimizer=True).batch(next(iter(train)))  # a warm start on purpose


def test_a_checkpoint_taken_inside_the_evaluation_where_emas_average_is_in_the_model_is_refused():
    """Inside ``with sk.evaluating():`` the model holds EMA's average and EMA the training weights: a resumable
    checkpoint taken there would swap them on resume. After the block it holds what training goes on from."""
    train, _ = toy_loaders(batch_size=32, n=128, shuffle=False)
    model = toy_model()
    _, sk, _ = plain_loop(model, train, [EMA(half_life="0.5dur")], steps=4)
    trained = copy.deepcopy(model.state_dict())
    with sk.evaluating():
        assert not all(torch.equal(trained[k], v) for k, v in model.state_dict().items())  # the average is in
        with pytest.raises(HostCannotServeError, match=r"inside `with sk.evaluating\(\):`.*after the with-block"):
            sk.state_dict()
    saved = sk.state_dict()
    assert all(torch.equal(trained[k], v) for k, v in model.state_dict().items())
    assert not all(torch.equal(saved["methods"]["ema"]["ema"][k], v) for k, v in trained.items())
    _, plain, _ = plain_loop(toy_model(), train, [LabelSmoothing(0.1)], steps=2)
    with plain.evaluating():  # nothing averaged: the model holds its training weights
        plain.state_dict()


def test_an_evaluation_outside_sk_evaluating_beside_ema_is_refused():
    """With EMA, an evaluation forward (eval mode, gradients off) outside ``with sk.evaluating():`` measured the
    training weights as if they were EMA's average. Inside the block, in eval mode with gradients on (frozen batch
    norm), before the first step, after ``sk.finish()`` and without an averaging method, the forward is left alone."""
    train, _ = toy_loaders(batch_size=32, n=128, shuffle=False)
    images = next(iter(train))[0]

    def evaluate(model, grad: bool = False):
        model.eval()
        with torch.set_grad_enabled(grad):
            model(images)
        model.train()

    model = toy_model()
    sk = Speedkit([EMA(half_life="0.5dur")], max_duration="4ba", train_dataloader=train)
    model = sk.prepare_model(model)
    sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    evaluate(model)  # before the first step the average is the weights
    model = toy_model()
    _, sk, _ = plain_loop(model, train, [EMA(half_life="0.5dur")], steps=4)
    with pytest.raises(HostCannotServeError, match=r"outside `with sk.evaluating\(\):`.*ema keeps an average"):
        evaluate(model)
    evaluate(model, grad=True)
    with sk.evaluating():
        evaluate(model)
    sk.finish()
    evaluate(model)  # the weights the run ends with (EMA's average)
    assert not model._forward_pre_hooks
    plain_model = toy_model()
    plain_loop(plain_model, train, [LabelSmoothing(0.1)], steps=2)
    evaluate(plain_model)


@pytest.mark.parametrize("muon", [False, True], ids=["sgd", "muon-group"])
def test_a_grad_scaler_speedkit_was_not_given_is_refused_before_clipping_steps_scaled_gradients(muon):
    """fp16's loss scaling in your own loop: gradient clipping at sk.backward sees the gradients times the loss
    scale. Given the scaler, it unscales them first, and the run is the unscaled run's (with Muon's optimizer
    group too, which the scaler steps as one: unscaled once); not given, the first optimizer step is refused (it
    would clip to the threshold over 65536, and training all but stop)."""
    train, _ = toy_loaders(batch_size=32, n=128, shuffle=False)

    def run(scaler, give: bool, accelerated: bool = False):
        # Accelerate's fp16: its backward scales the loss, and speedkit takes its scaler from it
        accelerator = SimpleNamespace(scaler=scaler, backward=lambda loss: scaler.scale(loss).backward())
        methods = [GradientClipping(clipping_type="norm", clipping_threshold=0.5), *([Muon()] if muon else [])]
        sk = Speedkit(methods, max_duration="6ba",
                      train_dataloader=train, grad_scaler=scaler if give else None,
                      accelerator=accelerator if accelerated else None)
        model = sk.prepare_model(toy_model())
        optimizer = sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        while not sk.done:
            for batch in train:
                batch = sk.batch(batch)
                loss = sk.loss(model(batch[0]), batch)
                if scaler is None:
                    sk.backward(loss)
                    optimizer.step()
                else:
                    sk.backward(loss if accelerated else scaler.scale(loss))
                    scaler.step(optimizer)
                    scaler.update()
                optimizer.zero_grad()
                sk.step_end()
                if sk.done:
                    break
        return model

    def scaler():
        return torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)

    with pytest.raises(HostCannotServeError, match=r"GradScaler.*gradient_clipping.*grad_scaler=scaler"):
        run(scaler(), give=False)
    unscaled = run(None, give=False)
    for scaled in (run(scaler(), give=True), run(scaler(), give=False, accelerated=True)):
        for (name, ours), theirs in zip(scaled.state_dict().items(), unscaled.state_dict().values()):
            assert torch.allclose(ours, theirs, atol=1e-6), name


def test_a_step_without_the_loss_call_is_refused_with_the_call_to_add():
    train, _ = toy_loaders(batch_size=32, n=64)
    model = toy_model()
    sk = Speedkit([LabelSmoothing()], max_duration="2ba", train_dataloader=train)
    optimizer = sk.prepare_optimizer(torch.optim.SGD(sk.prepare_model(model).parameters(), lr=0.1))
    x, y = sk.batch(next(iter(train)))
    sk.backward(F.cross_entropy(model(x), y))  # the user computed the loss without sk.loss
    optimizer.step()
    with pytest.raises(HostCannotServeError, match=r"label_smoothing needs before_loss, after_loss.*sk.loss\(outputs, batch\)"):
        sk.step_end()


@pytest.mark.parametrize("method, message", [
    (AlternatingFlip(), "alternating_flip cannot run in a plain PyTorch loop: it replaces the training data loader"),
    (Autocast(), "autocast cannot run in a plain PyTorch loop: .*torch.autocast"),
    (SAM(), "sam cannot run in a plain PyTorch loop: .*closure"),
])
def test_methods_a_loop_cannot_serve_are_refused_before_training(method, message):
    with pytest.raises(HostCannotServeError, match=message):
        Speedkit([method], max_duration="2ba")


def test_conflicting_methods_are_refused_as_in_the_trainer():
    from speedkit.methods import CutMix

    with pytest.raises(ValueError, match="mixup and cutmix both take the role 'label_mixing'"):
        Speedkit([MixUp(), CutMix()], max_duration="2ba")


def test_an_epoch_duration_over_a_loader_without_a_length_is_refused_before_training():
    """The loop's epochs end by count; a loader without len() would end "2ep" after two batches."""

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(torch.randn(64, 8))

    stream = torch.utils.data.DataLoader(Stream(), batch_size=8)
    with pytest.raises(ValueError, match=r"max_duration='2ep' counts epochs.*no len\(\).*pass batches_per_epoch="):
        Speedkit([], max_duration="2ep", train_dataloader=stream)
    sk = Speedkit([], max_duration="2ep", train_dataloader=stream, batches_per_epoch=8)
    assert sk.state.batches_per_epoch == 8


def test_a_users_learning_rate_changes_reach_muons_group_without_a_scheduler():
    """Muon's group keeps the relative change of the user's lr, whoever makes it (here the user's own code)."""
    train, _ = toy_loaders(batch_size=32)
    sk = Speedkit([Muon(lr=0.02)], max_duration="4ba", train_dataloader=train)
    model = sk.prepare_model(toy_model())
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer = sk.prepare_optimizer(adamw)
    muon_lrs = []
    for batch in train:
        batch = sk.batch(batch)
        muon_lrs.append([g["lr"] for g in optimizer.param_groups if "speedkit_base_lr" in g])
        sk.backward(sk.loss(model(batch[0]), batch))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        for group in adamw.param_groups:  # the user's own decay: halve the rate each step
            group["lr"] *= 0.5
        sk.step_end()
        if sk.done:
            break
    assert muon_lrs == [[pytest.approx(0.02 * 0.5 ** step)] for step in range(4)]


def test_a_loop_without_step_end_is_refused_at_its_second_step_not_finished_with_its_first_weights():
    """Without sk.step_end() EMA never averaged, and sk.finish() put back the weights the model started with:
    a trained model silently replaced by an untrained one."""
    train, _ = toy_loaders(batch_size=32, n=64)

    def steps_without_step_end(count: int):
        model = toy_model()
        sk = Speedkit([EMA(half_life="2ba")], max_duration="2ba", train_dataloader=train)
        optimizer = sk.prepare_optimizer(torch.optim.SGD(sk.prepare_model(model).parameters(), lr=0.1))
        for batch in list(train)[:count]:
            batch = sk.batch(batch)
            sk.backward(sk.loss(model(batch[0]), batch))
            optimizer.step()
        return sk

    with pytest.raises(HostCannotServeError, match=r"sk.batch\(batch\) was called again before sk.step_end"):
        steps_without_step_end(2)
    with pytest.raises(HostCannotServeError, match=r"sk.finish\(\) after a step that sk.step_end\(\) never ended"):
        steps_without_step_end(1).finish()
    # with step_end, finish leaves EMA's average of the trained weights
    model, start = toy_model(), toy_model().state_dict()
    _, sk, _ = plain_loop(model, train, [EMA(half_life="2ba")], steps=4)
    sk.finish()
    assert not all(torch.equal(value, start[name]) for name, value in model.state_dict().items())


def test_a_loop_that_calls_backward_twice_in_a_step_is_refused():
    train, _ = toy_loaders(batch_size=32, n=64)
    model = toy_model()
    sk = Speedkit([GradientClipping(clipping_type="norm", clipping_threshold=1.0)], max_duration="2ba",
                  train_dataloader=train)
    sk.prepare_optimizer(torch.optim.SGD(sk.prepare_model(model).parameters(), lr=0.1))
    x, y = next(iter(train))
    sk.backward(sk.loss(model(x), (x, y)))
    with pytest.raises(HostCannotServeError, match=r"sk.backward\(loss\) was called again before sk.step_end"):
        sk.backward(sk.loss(model(x), (x, y)))


def test_the_loss_on_the_labels_from_before_mixup_is_refused():
    """MixUp with num_classes mixes the labels when it mixes the inputs: a loss given the loader's batch (its
    unmixed labels) beside mixed inputs trained on the wrong labels without a word."""
    train, _ = toy_loaders(batch_size=32, n=64)
    model = toy_model()
    classes = model(next(iter(train))[0]).shape[-1]
    sk = Speedkit([MixUp(num_classes=classes)], max_duration="2ba", train_dataloader=train)
    sk.prepare_optimizer(torch.optim.SGD(sk.prepare_model(model).parameters(), lr=0.1))
    raw = next(iter(train))
    mixed = sk.batch(raw)
    assert mixed[1] is not raw[1]  # the labels were replaced
    with pytest.raises(HostCannotServeError, match=r"labels from before the batch methods replaced them \(mixup\)"):
        sk.loss(model(mixed[0]), raw)
    x, y = mixed  # unpacked and packed again: the same labels, so taken
    assert torch.isfinite(sk.loss(model(x), (x, y)))


def _mixup_loop(model, train):
    classes = model(next(iter(train))[0]).shape[-1]
    sk = Speedkit([MixUp(num_classes=classes)], max_duration="3ba", train_dataloader=train)
    model = sk.prepare_model(model)
    return sk, sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))


def test_a_forward_given_the_inputs_from_before_the_batch_methods_is_refused():
    """`x, y = batch; batch = sk.batch(batch); model(x)`: the model saw the unmixed images while the loss scored
    them against mixed labels, and trained on wrong pairs without a word. Refused at that forward; a loop that
    forwards what sk.batch returned trains on, and the check leaves no hook on the model."""
    train, _ = toy_loaders(batch_size=32, n=64, shuffle=False)
    model = toy_model()
    sk, _ = _mixup_loop(model, train)
    raw = next(iter(train))
    mixed = sk.batch(raw)
    assert mixed[0] is not raw[0]  # the inputs were replaced
    with pytest.raises(HostCannotServeError, match=r"forward was given the inputs from before the batch methods "
                                                   r"replaced them \(mixup\)"):
        model(raw[0])

    model = toy_model()
    classes = model(raw[0]).shape[-1]
    plain_loop(model, train, [MixUp(num_classes=classes)], steps=2)
    assert not model._forward_pre_hooks


def test_the_forward_check_costs_a_compiled_model_no_recompile():
    """Compiled after sk.prepare_model, the model traces the check's hook as a no-op and keeps it: removing it
    after the first step would change what the compiled graph guards on and compile the model again."""
    train, _ = toy_loaders(batch_size=32, n=64, shuffle=False)
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    model = toy_model()
    sk, optimizer = _mixup_loop(model, train)
    compiled = torch.compile(model, backend=backend)
    for _ in range(2):
        for batch in train:
            if sk.done:
                break
            batch = sk.batch(batch)
            sk.backward(sk.loss(compiled(batch[0]), batch))
            optimizer.step()
            optimizer.zero_grad()
            sk.step_end()
    assert sk.state.timestamp.batch == 3 and len(graphs) == 1
    assert sk.session._replaced_inputs is None  # no batch held past its step


def test_stepping_the_optimizer_given_instead_of_the_one_returned_is_refused():
    """`sk.prepare_optimizer(optimizer)` without taking what it returns: the loop stepped the user's optimizer,
    and the hidden matrices Muon had taken never trained, without a word."""
    train, _ = toy_loaders(batch_size=32, n=64)
    model = toy_model()
    sk = Speedkit([Muon()], max_duration="2ba", train_dataloader=train)
    optimizer = torch.optim.SGD(sk.prepare_model(model).parameters(), lr=0.1)
    returned = sk.prepare_optimizer(optimizer)
    batch = sk.batch(next(iter(train)))
    sk.backward(sk.loss(model(batch[0]), batch))
    optimizer.step()
    with pytest.raises(HostCannotServeError, match=r"step the one it returns, `optimizer = sk.prepare_optimizer"):
        sk.step_end()
    # the returned group steps both, and a step skipped whole (a GradScaler's after an overflow) is taken
    for step in ("stepped", "skipped"):
        batch = sk.batch(next(iter(train)))
        sk.backward(sk.loss(model(batch[0]), batch))
        if step == "stepped":
            returned.step()
        returned.zero_grad()
        sk.step_end()
    assert sk.done


def small_convnet() -> torch.nn.Module:
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 3))


@pytest.mark.parametrize("method, what", [
    (SqueezeExcite(min_channels=32), r"[1-9][\d,]* parameter values the surgery added would never train and 0 "),
    (Factorize(min_channels=32), r"[1-9][\d,]* parameter values .* and [1-9][\d,]* it replaced would be stepped")])
def test_an_optimizer_built_before_the_surgery_is_refused_before_the_first_step(method, what, tmp_path):
    """Built on the model's parameters before `sk.prepare_model` (or handed to the Trainer as an object), the
    optimizer never trained squeeze_excite's new blocks, or stepped the layers factorize had replaced, without a
    word. Built after the surgery (a function of the parameters, for the Trainer), it is taken."""
    images = torch.randn(32, 3, 8, 8)
    train = [(images, torch.randint(0, 3, (32,)))] * 2
    model = small_convnet()
    early = torch.optim.SGD(model.parameters(), lr=0.1)
    sk = Speedkit([copy.deepcopy(method)], max_duration="2ba", train_dataloader=train)
    model = sk.prepare_model(model)
    with pytest.raises(ValueError, match=rf"before speedkit's surgery \({method.name}\): {what}.*after model = "
                                         r"sk.prepare_model\(model\)"):
        sk.prepare_optimizer(early)
    sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))

    model = small_convnet()
    with pytest.raises(ValueError, match=r"pass optimizers= a function of the parameters"):
        Trainer(model, train, max_duration="2ba", methods=[copy.deepcopy(method)], run_dir=tmp_path,
                optimizers=torch.optim.SGD(model.parameters(), lr=0.1), save_checkpoints=False)
    trainer = Trainer(small_convnet(), train, max_duration="2ba", methods=[copy.deepcopy(method)], run_dir=tmp_path,
                      optimizers=lambda params: torch.optim.SGD(params, lr=0.1), save_checkpoints=False)
    held = {id(p) for group in trainer.state.optimizers[0].param_groups for p in group["params"]}
    assert held == {id(p) for p in trainer.state.model.parameters()}


def test_a_second_model_prepared_by_one_session_is_refused():
    """A notebook cell that builds the model again and prepares it with the session an earlier cell built: the
    surgery had run once, on the first model, so the second came back without squeeze-excite's blocks (38,915
    parameters where the first has 55,555) and trained without them. Refused; the same model again is taken as
    it is, not operated on twice."""
    train = [(torch.randn(8, 3, 8, 8), torch.randint(0, 3, (8,)))] * 2
    sk = Speedkit([SqueezeExcite(min_channels=32)], max_duration="2ba", train_dataloader=train)
    first = sk.prepare_model(small_convnet())
    grown = sum(p.numel() for p in first.parameters())
    assert grown > sum(p.numel() for p in small_convnet().parameters())
    with pytest.raises(ValueError, match=r"already prepared another model: its methods \(squeeze_excite\) hold on "
                                         r"to it, and its surgery .* build Speedkit\(...\) again"):
        sk.prepare_model(small_convnet())
    assert sk.prepare_model(first) is first and sum(p.numel() for p in first.parameters()) == grown


def test_a_second_optimizer_prepared_by_one_session_is_refused():
    """A notebook cell run again with another learning rate: the session gave back the optimizer it had prepared
    first, so the new one (and its rate) never stepped. Refused; the same optimizer again is taken."""
    train = [(torch.randn(8, 3, 8, 8), torch.randint(0, 3, (8,)))] * 2
    sk = Speedkit([Muon()], max_duration="2ba", train_dataloader=train)
    model = sk.prepare_model(small_convnet())
    given = torch.optim.SGD(model.parameters(), lr=0.1)
    first = sk.prepare_optimizer(given)
    with pytest.raises(HostCannotServeError, match=r"already prepared other optimizers.*would never step"):
        sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.05))
    assert sk.prepare_optimizer(given).optimizers == first.optimizers


class OwnLossNet(torch.nn.Module):
    """A classifier that computes its own loss when given labels, as a Hugging Face model does."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 3)

    def forward(self, inputs, labels=None):
        logits = self.linear(inputs)
        loss = None if labels is None else F.cross_entropy(logits, labels)
        return SimpleNamespace(loss=loss, logits=logits)


@pytest.mark.parametrize("method", [LabelSmoothing(0.3), MixUp(alpha=1.0)], ids=["label_smoothing", "mixup"])
def test_a_models_own_loss_beside_a_method_that_changes_the_labels_is_refused(method):
    """Called with the loader's labels, the model computes its loss from them: the smoothed or mixed labels never
    reach it, and sk.loss took that loss as it was (label smoothing did nothing; mixup scored mixed inputs against
    unmixed labels). Refused at the first sk.loss; the model called without labels, or a loss_fn, is taken."""
    inputs, labels = torch.randn(16, 8), torch.randint(0, 3, (16,))

    def first_loss(methods, with_labels: bool, **loss_kwargs):
        torch.manual_seed(0)
        sk = Speedkit(copy.deepcopy(methods), max_duration="2ba", train_dataloader=[(inputs, labels)] * 2)
        model = sk.prepare_model(OwnLossNet())
        sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        batch = sk.batch((inputs, labels))
        outputs = model(batch[0], labels=labels) if with_labels else model(batch[0])
        return sk.loss(outputs, batch, **loss_kwargs), outputs

    with pytest.raises(ValueError, match=rf"a loss of its own .* not from those {method.name} made of the batch's.*"
                                         r"call the model without its labels \(model\(inputs\)\)"):
        first_loss([method], with_labels=True)
    soft, outputs = first_loss([method], with_labels=False)  # the logits against the changed labels
    assert soft.item() != pytest.approx(F.cross_entropy(outputs.logits, labels).item())
    criterion, _ = first_loss([method], with_labels=True, loss_fn=F.cross_entropy)
    assert criterion.item() == pytest.approx(soft.item())
    # no method changes the labels: the model's own loss is the loss, as a Hugging Face model's is
    own, outputs = first_loss([EMA(half_life="0.1dur")], with_labels=True)
    assert own is outputs.loss


def test_a_model_wrapped_in_ddp_before_the_surgery_is_refused(tmp_path):
    """Wrapped first, DDP had registered the model's parameters: the squeeze-excite blocks a surgery then added were
    never averaged across processes, so each rank trained its own (tests/train/test_distributed.py shows two ranks
    drift apart; wrapped after the surgery, they stay equal). Refused in the loop and in the Trainer, naming
    the order that works, and so is a model FSDP sharded first; a DDP model given methods without a surgery (EMA)
    is taken."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    from speedkit.methods.squeeze_excite import SqueezeExcite2d

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        train = [(torch.randn(8, 3, 8, 8), torch.randint(0, 3, (8,)))] * 2
        sk = Speedkit([SqueezeExcite(min_channels=32)], max_duration="2ba", train_dataloader=train)
        with pytest.raises(ValueError, match=r"already wrapped in DistributedDataParallel, and speedkit's surgery "
                                             r"\(squeeze_excite\).*model = sk.prepare_model\(model\)\) and wrap "
                                             r"what it returns after: DDP\(model\)"):
            sk.prepare_model(DDP(small_convnet()))
        with pytest.raises(ValueError, match=r"already wrapped in DistributedDataParallel.*pass the model itself"):
            Trainer(DDP(small_convnet()), train, max_duration="2ba", methods=[SqueezeExcite(min_channels=32)],
                    run_dir=tmp_path, save_checkpoints=False, parallel=None)
        sharded = small_convnet()
        fully_shard(sharded, mesh=init_device_mesh("cpu", (1,)))
        with pytest.raises(ValueError, match=r"already wrapped in FSDP \(FSDPSequential\).*fully_shard\(model\)"):
            sk = Speedkit([SqueezeExcite(min_channels=32)], max_duration="2ba", train_dataloader=train)
            sk.prepare_model(sharded)
        wrapped = DDP(Speedkit([SqueezeExcite(min_channels=32)], max_duration="2ba", train_dataloader=train)
                      .prepare_model(small_convnet()))  # the order that works
        assert any(isinstance(m, SqueezeExcite2d) for m in wrapped.modules())
        losses, _, _ = plain_loop(DDP(small_convnet()), train, [EMA(half_life="0.1dur")], steps=2)
        assert len(losses) == 2
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("accumulation, steps, message", [
    (1, 2, "ran twice before one sk.step_end"), (2, 1, r"on a batch that closes no step \(accumulation=2\)")])
def test_more_optimizer_steps_than_the_clock_counts_are_refused(accumulation, steps, message):
    train, _ = toy_loaders(batch_size=16, n=64)
    model = toy_model()
    sk = Speedkit([EMA(half_life="1ba")], max_duration="4ba", train_dataloader=train, accumulation=accumulation)
    optimizer = sk.prepare_optimizer(torch.optim.SGD(sk.prepare_model(model).parameters(), lr=0.1))
    batch = sk.batch(next(iter(train)))
    sk.backward(sk.loss(model(batch[0]), batch))
    for _ in range(steps):
        optimizer.step()
    with pytest.raises(HostCannotServeError, match=message):
        sk.step_end()


def test_accumulating_gradients_without_telling_speedkit_is_refused():
    """Stepping the optimizer every other batch and calling sk.step_end() after each, without accumulation=2: the
    clock counted each batch as a step, so schedules ran twice as fast and EMA averaged unmoved weights."""
    train, _ = toy_loaders(batch_size=16, n=64)
    model = toy_model()
    sk = Speedkit([EMA(half_life="1ba")], max_duration="4ba", train_dataloader=train)
    optimizer = sk.prepare_optimizer(torch.optim.SGD(sk.prepare_model(model).parameters(), lr=0.1))
    batch = sk.batch(next(iter(train)))
    sk.backward(sk.loss(model(batch[0]), batch))
    with pytest.raises(HostCannotServeError, match=r"pass Speedkit\(accumulation=k\)"):
        sk.step_end()
    # a step skipped after an overflow (a GradScaler's) is taken, whether the loop zeroes the gradients after the
    # step or before the next one (then they are still there, and not finite)
    for skipped_grads in (torch.zeros_like, lambda grad: torch.full_like(grad, float("inf"))):
        batch = sk.batch(next(iter(train)))
        sk.backward(sk.loss(model(batch[0]), batch))
        for p in model.parameters():
            p.grad = skipped_grads(p.grad)
        sk.step_end()


def test_a_loss_divided_by_the_accumulation_steps_before_sk_backward_is_refused():
    """A hand-written accumulation divides the loss by k; ported to Speedkit(accumulation=k), whose sk.backward
    divides it too, the division left in made every gradient k times too small. Refused at the first backward;
    the loss as sk.loss gives it (or another loss built on it) goes through."""
    train, _ = toy_loaders(batch_size=16, n=64)

    def first_backward(change):
        sk = Speedkit([LabelSmoothing(0.1)], max_duration="2ba", train_dataloader=train, accumulation=2)
        model = sk.prepare_model(toy_model())
        sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        batch = sk.batch(next(iter(train)))
        sk.backward(change(sk.loss(model(batch[0]), batch)))

    with pytest.raises(HostCannotServeError, match=r"divided by 2.*pass sk.loss's loss as it is"):
        first_backward(lambda loss: loss / 2)
    first_backward(lambda loss: loss)
    first_backward(lambda loss: loss + 0.01 * loss.detach())  # an extra term: not the division


@pytest.mark.parametrize("set_to_none", [True, False])
def test_gradients_zeroed_between_the_batches_of_an_accumulated_step_are_refused(set_to_none):
    """A loop that zeroes after every batch, as it did before Speedkit(accumulation=2): each step trained on its
    last batch alone. Refused at the second batch's sk.backward; zeroed after the step, it trains on."""
    train, _ = toy_loaders(batch_size=16, n=64)

    def run(zero_every_batch):
        sk = Speedkit([LabelSmoothing(0.1)], max_duration="2ba", train_dataloader=train, accumulation=2)
        model = sk.prepare_model(toy_model())
        optimizer = sk.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        for batch in train:
            batch = sk.batch(batch)
            sk.backward(sk.loss(model(batch[0]), batch))
            if sk.step_due:
                optimizer.step()
            if zero_every_batch or sk.step_due:
                optimizer.zero_grad(set_to_none=set_to_none)
            sk.step_end()
        return sk

    with pytest.raises(HostCannotServeError, match=r"zeroed before its second \(accumulation=2\).*zero them "
                                                   r"after optimizer.step\(\), when sk.step_due"):
        run(zero_every_batch=True)
    assert run(zero_every_batch=False).state.timestamp.batch == 2


def test_sk_batch_inside_an_evaluation_is_refused():
    """sk.batch on evaluation data would mix and resize it as training data, and open a training step."""
    train, _ = toy_loaders(batch_size=32, n=64)
    _, sk, _ = plain_loop(toy_model(), train, [LabelSmoothing(0.1)], steps=1)
    with sk.evaluating():
        with pytest.raises(HostCannotServeError, match=r"evaluation batches go through `batch = "
                                                       r"sk.eval_batch\(batch\)`"):
            sk.batch(next(iter(train)))


def test_a_step_past_max_duration_is_refused():
    """Schedules and half-lives are shares of max_duration; a loop that trains on past it (epochs counted by
    itself) went on at the schedule's end value without a word."""
    train, _ = toy_loaders(batch_size=32, n=128)  # 4 batches
    losses, sk, optimizer = plain_loop(toy_model(), train, [EMA(half_life="1ba")], steps=2)
    assert sk.done and len(losses) == 2
    with pytest.raises(RuntimeError, match=r"sk.batch\(batch\) after the run reached max_duration='2ba'"):
        sk.batch(next(iter(train)))


def test_an_lr_scheduler_built_after_prepare_optimizer_beside_speedkits_schedules_is_refused():
    """One built before sk.prepare_optimizer is refused there; one built after it stepped the lr, and speedkit's
    cosine set it again before the next forward: neither schedule was the one trained with."""
    train, _ = toy_loaders(batch_size=32, n=128)
    model = toy_model()
    sk = Speedkit([], max_duration="4ba", train_dataloader=train, schedules="cosine")
    optimizer = sk.prepare_optimizer(torch.optim.SGD(sk.prepare_model(model).parameters(), lr=0.1))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    batch = sk.batch(next(iter(train)))
    sk.backward(sk.loss(model(batch[0]), batch))
    optimizer.step()
    scheduler.step()
    with pytest.raises(HostCannotServeError, match=r"learning rate changed between sk.batch and sk.step_end\(\)"):
        sk.step_end()


def test_speedkit_schedules_in_a_step_without_sk_batch_are_refused():
    """The schedule is set where the step begins, in sk.batch: a loop without it trained at the first rate."""
    train, _ = toy_loaders(batch_size=32, n=128)
    model = toy_model()
    sk = Speedkit([LabelSmoothing(0.1)], max_duration="4ba", train_dataloader=train, schedules="cosine")
    optimizer = sk.prepare_optimizer(torch.optim.SGD(sk.prepare_model(model).parameters(), lr=0.1))
    x, y = next(iter(train))
    sk.backward(sk.loss(model(x), (x, y)))
    optimizer.step()
    with pytest.raises(HostCannotServeError, match=r"sets the learning rate in sk.batch\(batch\), which this step"):
        sk.step_end()
