"""Methods of the "optim" group: weights (ema, swa, lookahead, layer_freezing), optimizers (sam, muon),
gradients (gradient_clipping), precision and compile (autocast, torch_compile) and schedules
(budget_schedule). Each test would fail if its method were switched off or wrong."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
from method_harness import run_steps, tiny_language, tiny_vision

from speedkit.core import Callback, Event
from speedkit.core.method import NothingToChangeError
from speedkit.methods.autocast import Autocast
from speedkit.methods.budget_schedule import BudgetSchedule, StepBudgetSchedule, make_budget_schedule
from speedkit.methods.ema import EMA, compute_ema_smoothing, ema_update, init_ema
from speedkit.methods.gradient_clipping import GradientClipping, apply_gradient_clipping
from speedkit.methods.layer_freezing import LayerFreezing, freezable_layers, freeze_fraction, freeze_layers
from speedkit.methods.lookahead import Lookahead
from speedkit.methods.muon import Muon, muon_parameter_names, split_for_muon
from speedkit.methods.sam import SAM
from speedkit.methods.swa import SWA, swa_update, update_batchnorm_statistics
from speedkit.methods.torch_compile import TorchCompile
from speedkit.models import get_model
from speedkit.optim.lookahead import Lookahead as LookaheadOptimizer
from speedkit.optim.lookahead import lookahead_sync
from speedkit.optim.muon import Muon as MuonOptimizer
from speedkit.optim.muon import CPU_BF16_MIN_ENTRIES, newton_schulz_dtype, zeropower_via_newtonschulz
from speedkit.optim.sam import SAM as SAMOptimizer


class Spy(Callback):
    """Calls ``fn(event, state)`` at the given events (callbacks run after the methods of an event)."""

    def __init__(self, fn, *events):
        self.fn, self.events = fn, set(events)

    def run_event(self, event, state, logger):
        if event in self.events:
            self.fn(event, state)


def params_of(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_acted_at(trainer, method, expected):
    """The method acted exactly at ``expected``, all of them declared on its card."""
    fired = set(trainer.engine.events_of(method.name))
    assert set(expected) <= set(method.CARD.events)
    assert fired == set(expected), f"{method.name} acted at {fired}, expected {set(expected)}"


# -- ema ---------------------------------------------------------------------------------------------
def test_ema_update_follows_the_recurrence_for_weights_and_batchnorm_statistics():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))

    def snapshot():
        return {**params_of(model), "1.running_mean": model[1].running_mean.clone(),
                "1.running_var": model[1].running_var.clone()}

    ema = init_ema(model)
    history = [snapshot()]
    for _ in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        model(torch.randn(8, 3))  # moves the BatchNorm running statistics
        ema_update(ema, model, smoothing=0.9)
        history.append(snapshot())
    for name in history[0]:
        expected = history[0][name]
        for state in history[1:]:
            expected = 0.9 * expected + 0.1 * state[name]
        torch.testing.assert_close(ema[name], expected)
    assert ema["1.num_batches_tracked"] == model[1].num_batches_tracked == 3  # counters are copied
    assert compute_ema_smoothing(50) ** 50 == pytest.approx(0.5)
    assert compute_ema_smoothing(10, update_interval=5) ** 2 == pytest.approx(0.5)


def test_ema_method_averages_at_batch_end_and_swaps_for_eval(tmp_path):
    weights, eval_weights = [], []
    spy = Spy(lambda e, s: (weights if e is Event.FIT_START or e is Event.BATCH_END else eval_weights)
              .append(params_of(s.model)), Event.FIT_START, Event.BATCH_END, Event.EVAL_BATCH_START)
    method = EMA(smoothing=0.5, final_weights="model")
    trainer = run_steps(tiny_vision(), [method], steps=3, tmp_path=tmp_path, callbacks=[spy])
    assert_acted_at(trainer, method, [Event.FIT_START, Event.BATCH_END, Event.EVAL_START, Event.EVAL_END])
    expected = dict(weights[0])
    for snapshot in weights[1:]:
        expected = {n: 0.5 * expected[n] + 0.5 * snapshot[n] for n in expected}
    for name, value in expected.items():
        torch.testing.assert_close(method.ema[name], value)
        torch.testing.assert_close(eval_weights[0][name], value)  # evaluation saw the average
        torch.testing.assert_close(trainer.state.model.get_parameter(name), weights[-1][name])  # swapped back
    saved = method.state_dict()
    fresh = EMA()
    fresh.load_state_dict(saved)
    assert fresh.updates == 3 and torch.equal(fresh.ema["fc.weight"], method.ema["fc.weight"])


def test_ema_final_weights_and_half_life_on_language(tmp_path):
    method = EMA(half_life="2ba")
    trainer = run_steps(tiny_language(), [method], steps=2, tmp_path=tmp_path)
    assert method.smoothing == pytest.approx(0.5 ** 0.5)
    assert Event.FIT_END in trainer.engine.events_of("ema")
    for name, p in trainer.state.model.named_parameters():
        torch.testing.assert_close(p.detach(), method.ema[name])


# -- swa ---------------------------------------------------------------------------------------------
def test_swa_update_is_an_equal_weight_mean():
    model = nn.Linear(2, 2)
    snapshots = []
    average, count = None, 0
    for i in range(4):
        with torch.no_grad():
            model.weight.fill_(float(i * i))
        snapshots.append(model.weight.detach().clone())
        if average is None:
            average, count = init_ema(model), 1
        else:
            count = swa_update(average, model, count)
    torch.testing.assert_close(average["weight"], torch.stack(snapshots).mean(0))
    assert count == 4


def test_update_batchnorm_statistics_averages_batch_means():
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    batches = [(torch.randn(16, 3) + i, None) for i in range(3)]
    seen = update_batchnorm_statistics(model, batches, max_batches=2)
    assert seen == 2
    with torch.no_grad():
        means = [model[0](x).mean(0) for x, _ in batches[:2]]
    torch.testing.assert_close(model[1].running_mean, torch.stack(means).mean(0), atol=1e-5, rtol=1e-5)
    assert model[1].momentum == 0.1  # restored


def test_swa_method_sets_lr_averages_and_loads_the_average(tmp_path):
    lrs, after_step = [], []
    spy = Spy(lambda e, s: lrs.append(s.optimizers[0].param_groups[0]["lr"]) if e is Event.BATCH_START
              else after_step.append(params_of(s.model)), Event.BATCH_START, Event.AFTER_TRAIN_BATCH)
    method = SWA(swa_start=0.5, swa_lr=0.01, bn_update_batches=2)
    # 2 batches per epoch, 3 epochs: averages at the end of epoch 2 (batch 4) and at the last batch (6)
    trainer = run_steps(tiny_vision(batch_size=32), [method], steps=6, tmp_path=tmp_path, callbacks=[spy])
    assert_acted_at(trainer, method, [Event.FIT_START, Event.BATCH_START, Event.BATCH_END, Event.EPOCH_END,
                                      Event.FIT_END])
    assert lrs[:3] == [0.05] * 3 and lrs[3:] == [0.01] * 3  # constant swa_lr from half way
    assert method.count == 2
    for name, p in trainer.state.model.named_parameters():
        torch.testing.assert_close(p.detach(), (after_step[3][name] + after_step[5][name]) / 2)
    assert "2 batches" in trainer.record.notes["swa"]
    restored = SWA()
    restored.load_state_dict(method.state_dict())
    assert restored.count == 2 and restored.finished


def test_swa_every_n_batches(tmp_path):
    method = SWA(swa_start=0.0, update_interval=1, bn_update_batches=0)
    trainer = run_steps(tiny_language(), [method], steps=3, tmp_path=tmp_path)
    assert_acted_at(trainer, method, [Event.FIT_START, Event.BATCH_END, Event.FIT_END])
    assert method.count == 3


# -- sam ---------------------------------------------------------------------------------------------
A = torch.tensor([[3.0, 0.5], [0.5, 1.0]])


def _quadratic_closure(w):
    def closure():
        loss = 0.5 * w @ A @ w
        loss.backward()
        return loss
    return closure


def _sam_by_hand(w, lr, rho):
    g = A @ w
    e = rho * g / g.norm()
    return w - lr * (A @ (w + e))


@pytest.mark.parametrize("interval", [1, 2])
def test_sam_two_steps_match_a_hand_computation(interval):
    w = nn.Parameter(torch.tensor([1.0, -2.0]))
    optimizer = SAMOptimizer(torch.optim.SGD([w], lr=0.1), rho=0.05, interval=interval)
    closure = _quadratic_closure(w)
    expected = w.detach().clone()
    for step in range(2):
        closure()  # the caller's forward/backward, as the Trainer does before step
        optimizer.step(closure)
        optimizer.zero_grad()
        sam_step = step % interval == 0
        expected = _sam_by_hand(expected, 0.1, 0.05) if sam_step else expected - 0.1 * (A @ expected)
    torch.testing.assert_close(w.detach(), expected)
    assert optimizer.steps_taken == 2


def test_sam_joint_wrappers_use_one_norm_and_one_closure_call():
    w = nn.Parameter(torch.tensor([1.0, -2.0]))
    a, b = nn.Parameter(w.detach()[:1].clone()), nn.Parameter(w.detach()[1:].clone())
    calls = []

    def closure():
        calls.append(1)
        loss = 0.5 * torch.cat([a, b]) @ A @ torch.cat([a, b])
        loss.backward()
        return loss
    wrappers = SAMOptimizer.wrap_jointly([torch.optim.SGD([a], lr=0.1), torch.optim.SGD([b], lr=0.1)], rho=0.05)
    closure()
    calls.clear()
    for opt in wrappers:
        opt.step(closure)
    assert len(calls) == 1
    torch.testing.assert_close(torch.cat([a, b]).detach(), _sam_by_hand(w.detach(), 0.1, 0.05))
    assert wrappers[0].param_groups is wrappers[0].base_optimizer.param_groups
    assert wrappers[0].state_dict() == wrappers[0].base_optimizer.state_dict()


def test_sam_method_wraps_every_optimizer_including_muons(tmp_path):
    forwards = []
    spy = Spy(lambda e, s: forwards.append(s.timestamp.batch), Event.BEFORE_FORWARD)
    method = SAM(interval=2)
    trainer = run_steps(tiny_vision(), [method, Muon()], steps=3, tmp_path=tmp_path, callbacks=[spy])
    assert_acted_at(trainer, method, [Event.FIT_START])
    optimizers = trainer.state.optimizers
    assert len(optimizers) == 2 and all(isinstance(o, SAMOptimizer) for o in optimizers)
    assert isinstance(optimizers[1].base_optimizer, MuonOptimizer)
    assert forwards == [0, 0, 1, 2, 2]  # the second pass on steps 1 and 3 only (interval=2)


def test_sam_refuses_fp16_loss_scaling():
    class FakeState:
        grad_scaler = object()
        optimizers = []
    with pytest.raises(ValueError, match="fp16"):
        SAM().apply(Event.FIT_START, FakeState(), None)


# -- lookahead ---------------------------------------------------------------------------------------
def test_lookahead_sync_and_optimizer_wrapper():
    slow, fast = [torch.zeros(3)], [torch.full((3,), 4.0)]
    lookahead_sync(slow, fast, alpha=0.25)
    assert torch.equal(slow[0], torch.ones(3)) and torch.equal(fast[0], torch.ones(3))

    w = nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = LookaheadOptimizer(torch.optim.SGD([w], lr=0.1), k=2, alpha=0.5)
    slow, fast = w.detach().clone(), w.detach().clone()
    for step in range(1, 5):
        _quadratic_closure(w)()
        opt.step()
        opt.zero_grad()
        fast = fast - 0.1 * (A @ fast)
        if step % 2 == 0:
            slow = slow + 0.5 * (fast - slow)
            fast = slow.clone()
    torch.testing.assert_close(w.detach(), fast)
    saved = opt.state_dict()
    assert saved["fast_steps"] == 4 and torch.equal(saved["slow"][0], slow)


def test_lookahead_method_pulls_back_every_k_steps(tmp_path):
    plain = run_steps(tiny_vision(), [], steps=2, tmp_path=tmp_path / "plain")
    start = params_of(tiny_vision()[0])
    method = Lookahead(k=2, alpha=0.5)
    trainer = run_steps(tiny_vision(), [method], steps=2, tmp_path=tmp_path / "la")
    assert_acted_at(trainer, method, [Event.FIT_START, Event.AFTER_TRAIN_BATCH])
    assert trainer.engine.events_of("lookahead")[Event.AFTER_TRAIN_BATCH] == 1  # at step 2 only
    fast = params_of(plain.state.model)
    for name, p in trainer.state.model.named_parameters():
        torch.testing.assert_close(p.detach(), start[name] + 0.5 * (fast[name] - start[name]))
        torch.testing.assert_close(method.state_dict()["slow"][name], p.detach())


# -- muon --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(64, 32), (32, 64), (2, 96, 48)])
def test_newton_schulz_output_is_near_orthogonal(shape):
    torch.manual_seed(0)
    g = torch.randn(*shape) * torch.logspace(-1, 0, shape[-1])  # columns of different scales
    spread_in = torch.linalg.svdvals(g)
    assert (spread_in.max(-1).values / spread_in.min(-1).values).min() > 8  # far from orthogonal
    out = zeropower_via_newtonschulz(g, steps=5)
    singular = torch.linalg.svdvals(out)
    assert out.shape == g.shape
    # the quintic iteration lands the singular values in about [0.68, 1.13], not exactly at 1
    assert singular.min() > 0.6 and singular.max() < 1.2, singular
    one_step = torch.linalg.svdvals(zeropower_via_newtonschulz(g, steps=1))
    assert one_step.min() < 0.5  # it is the iterations that get there


def test_muon_step_is_an_orthogonalized_scaled_update():
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(16, 2, 2, 2))  # conv filters: [16, 8] after flattening
    before = w.detach().clone()
    opt = MuonOptimizer([w], lr=0.1, nesterov=False)
    w.grad = torch.randn_like(w)
    opt.step()
    update = (before - w.detach()).reshape(16, 8) / (0.1 * math.sqrt(16 / 8))  # lr * max(1, rows/cols) ** 0.5
    singular = torch.linalg.svdvals(update)
    assert singular.min() > 0.6 and singular.max() < 1.25
    with pytest.raises(ValueError, match="1-D"):
        MuonOptimizer([nn.Parameter(torch.zeros(3))])


def test_muon_steps_every_parameter_as_the_formula_says():
    """Two filters of different shapes, Nesterov momentum and weight decay, over two steps, against the
    docstring's formula applied one parameter at a time."""
    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(8, 3, 3, 3)), nn.Parameter(torch.randn(20, 6))]
    expected = [p.detach().clone() for p in params]
    buffers = [torch.zeros_like(p) for p in params]
    lr, momentum, wd = 0.05, 0.9, 0.1
    opt = MuonOptimizer(params, lr=lr, momentum=momentum, nesterov=True, weight_decay=wd)
    for _ in range(2):
        grads = [torch.randn_like(p) for p in params]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        for i, g in enumerate(grads):
            buffers[i] = momentum * buffers[i] + g
            matrix = (g + momentum * buffers[i]).reshape(g.size(0), -1)
            rows, cols = matrix.shape
            ortho = zeropower_via_newtonschulz(matrix).view_as(g)
            expected[i] = expected[i] * (1 - lr * wd) - lr * max(1.0, rows / cols) ** 0.5 * ortho
    for p, want in zip(params, expected):
        torch.testing.assert_close(p.detach(), want)


def test_newton_schulz_runs_large_cpu_matrices_in_bf16_only_where_bf16_is_fast(monkeypatch):
    import speedkit.optim.muon as muon_module
    small, large = torch.randn(64, 288), torch.randn(128, CPU_BF16_MIN_ENTRIES // 128)
    monkeypatch.setattr(muon_module, "cpu_has_fast_bf16", lambda: True)
    assert newton_schulz_dtype(small) == torch.float32 and newton_schulz_dtype(large) == torch.bfloat16
    out = zeropower_via_newtonschulz(large)
    assert out.dtype == torch.float32  # the result comes back in the input's dtype
    singular = torch.linalg.svdvals(out)
    assert singular.min() > 0.6 and singular.max() < 1.25
    monkeypatch.setattr(muon_module, "cpu_has_fast_bf16", lambda: False)
    assert newton_schulz_dtype(large) == torch.float32


def test_the_bf16_probe_runs_from_inside_an_optimizer_step():
    """Muon steps under no_grad; the first large matrix asks whether bf16 is fast, which times a backward."""
    from speedkit.core.devices import cpu_bf16_speedup
    cpu_bf16_speedup.cache_clear()
    w = nn.Parameter(torch.randn(128, CPU_BF16_MIN_ENTRIES // 128))
    w.grad = torch.randn_like(w)
    MuonOptimizer([w], lr=0.1).step()
    assert cpu_bf16_speedup.cache_info().currsize == 1


def test_muon_partition_on_resnet8_gpt_and_torchvision():
    resnet = get_model("resnet8")
    names = muon_parameter_names(resnet)
    convs = [n for n, p in resnet.named_parameters() if p.dim() == 4]
    assert names == convs and "fc.weight" not in names
    gpt = tiny_language()[0]
    names = muon_parameter_names(gpt)
    assert names and all(n.endswith(("qkv.weight", "proj.weight", "fc.weight")) for n in names)
    assert not any("wte" in n or "wpe" in n or "lm_head" in n or "ln" in n for n in names)
    untied = get_model("gpt-nano", tie_weights=False)
    assert "lm_head.weight" not in muon_parameter_names(untied)
    resnet18 = get_model("resnet18", in_channels=3, small_input=True)
    assert len(muon_parameter_names(resnet18)) == sum(p.dim() == 4 for p in resnet18.parameters())


def test_split_for_muon_moves_parameters_and_reports():
    model = get_model("resnet8")
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    muon, report = split_for_muon(model, [sgd])
    moved = {id(p) for p in muon.param_groups[0]["params"]}
    kept = {id(p) for p in sgd.param_groups[0]["params"]}
    assert not moved & kept and len(moved | kept) == len(list(model.parameters()))
    assert report.total == len(moved) and "Muon" in str(report)
    with pytest.raises(NothingToChangeError):
        split_for_muon(nn.Linear(4, 2), [torch.optim.SGD(nn.Linear(4, 2).parameters(), lr=0.1)])
    head = nn.Linear(4, 2)
    assert split_for_muon(head, [torch.optim.SGD(head.parameters(), lr=0.1)], allow_empty=True)[0] is None


@pytest.mark.parametrize("setup", [tiny_vision, tiny_language])
def test_muon_method_trains_with_two_optimizers(tmp_path, setup):
    method = Muon()
    trainer = run_steps(setup(), [method], steps=2, tmp_path=tmp_path)
    assert_acted_at(trainer, method, [Event.FIT_START])
    sgd, muon = trainer.state.optimizers
    assert isinstance(muon, MuonOptimizer) and muon.state  # it stepped (momentum buffers exist)
    assert "muon: changed" in " ".join(trainer.record.notes["surgery"])


# -- gradient clipping -------------------------------------------------------------------------------
def _with_grads(seed=0):
    torch.manual_seed(seed)
    params = [nn.Parameter(torch.randn(4, 3)), nn.Parameter(torch.randn(4))]
    for p in params:
        p.grad = torch.randn_like(p) * 10
    return params


def test_clipping_by_norm_value_and_adaptive():
    params = _with_grads()
    apply_gradient_clipping(params, "norm", 1.0)
    assert torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in params])) == pytest.approx(1.0, rel=1e-4)
    params = _with_grads()
    apply_gradient_clipping(params, "value", 0.5)
    assert all(p.grad.abs().max() <= 0.5 for p in params)
    params = _with_grads()
    params[0].grad[0] = params[0].detach()[0] * 1e-3  # a small unit that must stay as it is
    small_unit = params[0].grad[0].clone()
    apply_gradient_clipping(params, "adaptive", 0.1)
    ratio = params[0].grad.norm(dim=1) / params[0].detach().norm(dim=1)
    assert (ratio <= 0.1 + 1e-5).all() and ratio[1:].allclose(torch.full((3,), 0.1), rtol=1e-4)
    assert torch.equal(params[0].grad[0], small_unit)
    assert (params[1].grad.norm() / params[1].detach().norm()).item() == pytest.approx(0.1, rel=1e-4)
    with pytest.raises(ValueError):
        apply_gradient_clipping(params, "mean", 1.0)


def test_gradient_clipping_acts_once_per_step_after_the_last_microbatch(tmp_path):
    norms = []
    spy = Spy(lambda e, s: norms.append((s.microbatch_index, torch.linalg.vector_norm(torch.stack(
        [p.grad.norm() for p in s.model.parameters() if p.grad is not None])).item())), Event.AFTER_BACKWARD)
    method = GradientClipping(clipping_type="norm", clipping_threshold=1e-3)
    trainer = run_steps(tiny_vision(), [method], steps=2, tmp_path=tmp_path, microbatch_size=8, callbacks=[spy])
    assert_acted_at(trainer, method, [Event.AFTER_BACKWARD])
    assert trainer.engine.events_of("gradient_clipping")[Event.AFTER_BACKWARD] == 2
    last = [n for i, n in norms if i == 1]
    first = [n for i, n in norms if i == 0]
    assert all(n == pytest.approx(1e-3, rel=1e-3) for n in last) and all(n > 1e-2 for n in first)


# -- layer freezing ----------------------------------------------------------------------------------
def test_freeze_layers_on_resnets_and_gpt():
    resnet = get_model("resnet8")
    layers = freezable_layers(resnet)
    assert layers[0][0] == "stem.0" and "fc" not in [n for n, _ in layers]
    frozen = freeze_layers(resnet, 0.5)
    assert len(frozen) == len(layers) // 2 and frozen == [n for n, _ in layers[:len(frozen)]]
    assert not resnet.stem[0].weight.requires_grad and resnet.fc.weight.requires_grad
    freeze_layers(resnet, 1.0)
    assert resnet.fc.weight.requires_grad  # never the last layer
    gpt = tiny_language()[0]
    freeze_layers(gpt, 1.0)
    assert gpt.lm_head.weight.requires_grad  # tied to the embedding, so the embedding stays trainable too
    resnet18 = get_model("resnet18", in_channels=3, small_input=True)
    assert freeze_layers(resnet18, 0.25)[0] == "conv1"
    assert freeze_fraction(0.4) == 0.0 and freeze_fraction(0.75) == 0.5 and freeze_fraction(1.0, 0.5, 0.8) == 0.8


def test_layer_freezing_method_freezes_progressively(tmp_path):
    method = LayerFreezing(freeze_start=0.5)
    model, train, test = tiny_vision(batch_size=32)  # 2 batches per epoch, 4 epochs
    trainer = run_steps((model, train, test), [method], steps=8, tmp_path=tmp_path)
    assert_acted_at(trainer, method, [Event.EPOCH_END])
    total = len(freezable_layers(model))
    assert method.frozen == [n for n, _ in freezable_layers(model)]  # all eligible layers by the end
    assert trainer.record.notes["layer_freezing"] == method.frozen
    assert model.fc.weight.requires_grad and not model.stem[0].weight.requires_grad
    assert method.state_dict() == {"frozen": method.frozen} and len(method.frozen) == total


def test_layer_freezing_freezes_again_after_a_checkpoint_loads(tmp_path):
    method = LayerFreezing(freeze_start=0.9)
    method.load_state_dict({"frozen": ["stem.0", "stem.1"]})  # as _load_payload does, after FIT_START
    model, train, test = tiny_vision()
    trainer = run_steps((model, train, test), [method], steps=2, tmp_path=tmp_path)
    assert_acted_at(trainer, method, [Event.BATCH_START])
    assert trainer.engine.events_of("layer_freezing")[Event.BATCH_START] == 1
    assert not model.stem[0].weight.requires_grad and not model.stem[1].bias.requires_grad
    assert model.stages[0][0].branch[0].weight.requires_grad


def test_methods_with_state_resume_from_a_checkpoint(tmp_path):
    first = run_steps(tiny_vision(), [EMA(), Muon(), SAM(), Lookahead(k=3)], steps=2, tmp_path=tmp_path,
                      save_checkpoints=True, run_name="first")
    checkpoint = first.record.last_checkpoint
    ema, lookahead = EMA(), Lookahead(k=3)
    resumed = run_steps(tiny_vision(), [ema, Muon(), SAM(), lookahead], steps=4, tmp_path=tmp_path,
                        load_path=checkpoint, run_name="second")
    assert resumed.state.timestamp.batch == 4 and ema.updates == 4
    assert resumed.engine.events_of("lookahead")[Event.AFTER_TRAIN_BATCH] == 1  # step 3 only


# -- autocast ----------------------------------------------------------------------------------------
def test_autocast_runs_the_forward_in_bf16_on_cpu(tmp_path):
    dtypes = []
    model, train, test = tiny_vision()
    model.fc.register_forward_hook(lambda module, inputs, output: dtypes.append(output.dtype))
    method = Autocast(dtype="bf16")
    trainer = run_steps((model, train, test), [method], steps=2, tmp_path=tmp_path)
    assert_acted_at(trainer, method, [Event.FIT_START])
    assert dtypes and all(d == torch.bfloat16 for d in dtypes)
    assert trainer.state.precision == "bf16" and trainer.state.grad_scaler is None
    assert model.fc.weight.dtype == torch.float32  # weights stay fp32


def test_autocast_refuses_fp16_on_cpu(tmp_path):
    with pytest.raises(ValueError, match="bf16"):
        run_steps(tiny_vision(), [Autocast(dtype="fp16")], steps=1, tmp_path=tmp_path)


# -- torch.compile -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_torch_compile_keeps_state_dict_keys_and_records_compile_time(tmp_path):
    _, train, _ = tiny_vision(size=8)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 4))  # the smallest graph: a compile of a few seconds
    keys = list(model.state_dict())
    method = TorchCompile()
    # no evaluation: in eval mode the model would be compiled a second time
    trainer = run_steps((model, train, None), [method], steps=2, tmp_path=tmp_path)
    assert_acted_at(trainer, method, [Event.FIT_START, Event.BATCH_START, Event.BATCH_END])
    assert trainer.engine.events_of("torch_compile")[Event.BATCH_START] == 1  # only the first batch is timed
    assert list(trainer.state.model.state_dict()) == keys
    assert trainer.record.timings["compile_s"] > 0


@pytest.mark.slow
def test_torch_compile_compiles_muons_update_whichever_order_the_methods_are_given_in(tmp_path):
    _, train, _ = tiny_vision(size=8)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 4))  # a hidden matrix for Muon
    trainer = run_steps((model, train, None), [TorchCompile(), Muon()], steps=2, tmp_path=tmp_path)
    (muon,) = [optimizer for optimizer in trainer.state.optimizers if isinstance(optimizer, MuonOptimizer)]
    assert muon.compiled
    assert not any(isinstance(optimizer, MuonOptimizer) and optimizer.compiled
                   for optimizer in run_steps(tiny_vision(), [Muon()], steps=1, tmp_path=tmp_path / "eager")
                   .state.optimizers)


# -- budget schedule ---------------------------------------------------------------------------------
@pytest.mark.parametrize("duration, steps", [("5ba", 5), ("7ba", 7), ("2ep", 8)])
@pytest.mark.parametrize("shape, end", [("linear_to_zero", 0.0), ("one_cycle", 1e-4)])
def test_budget_schedule_ends_exactly_at_the_budget(tmp_path, duration, steps, shape, end):
    lrs = []
    spy = Spy(lambda e, s: lrs.append(s.optimizers[0].param_groups[0]["lr"]), Event.BATCH_START)
    method = BudgetSchedule(shape=shape, warmup=0.0 if shape == "one_cycle" else 0.2)
    model, train, test = tiny_vision()  # 4 batches per epoch
    trainer = run_steps((model, train, test), [method], steps=steps, tmp_path=tmp_path, max_duration=duration,
                        schedulers="cosine", callbacks=[spy])
    assert_acted_at(trainer, method, [Event.FIT_START])
    assert len(lrs) == steps
    assert lrs[-1] == pytest.approx(0.05 * end, abs=1e-12)
    assert max(lrs) == pytest.approx(0.05, rel=0.2) and lrs[-2] > lrs[-1]
    assert isinstance(trainer.state.schedulers[0], StepBudgetSchedule)


def test_budget_schedule_shape():
    assert make_budget_schedule("linear_to_zero")(0.5) == pytest.approx(0.5)
    stretched = StepBudgetSchedule(make_budget_schedule("linear_to_zero"), 4)
    assert [stretched(i / 4) for i in range(4)] == pytest.approx([1.0, 2 / 3, 1 / 3, 0.0])


# -- parameters --------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls, params", [
    (EMA, {"smoothing": 1.5}), (EMA, {"update_interval": 0}), (EMA, {"final_weights": "last"}),
    (SWA, {"swa_start": 1.5}), (SWA, {"swa_lr": -0.1}), (SAM, {"rho": 0.0}), (SAM, {"interval": 0}),
    (Lookahead, {"k": 0}), (Lookahead, {"alpha": 1.5}), (Muon, {"lr": 1.0}), (Muon, {"momentum": 1.0}),
    (GradientClipping, {"clipping_type": "l1"}), (GradientClipping, {"clipping_threshold": 0.0}),
    (LayerFreezing, {"freeze_start": 1.0}), (Autocast, {"dtype": "fp8"}), (TorchCompile, {"mode": "fast"}),
    (BudgetSchedule, {"warmup": 0.5}), (BudgetSchedule, {"shape": "cosine"}),
])
def test_parameters_outside_the_card_are_refused(cls, params):
    with pytest.raises(ValueError, match=f"{cls.CARD.name}\\."):
        cls(**params)


def test_muon_leaves_qk_norm_gains_and_marked_or_norm_owned_scales_with_the_users_optimizer():
    """Issue 41.5: QK-norm's per-head gains are [H, D] but gains, not matrices; what decides is what a
    parameter is (owned by a norm module, or marked), not its number of dimensions."""
    from speedkit.methods.qk_norm import apply_qk_norm
    from speedkit.optim.muon import mark_not_a_matrix

    gpt = get_model("gpt-nano")
    before = muon_parameter_names(gpt)
    apply_qk_norm(gpt)
    names = muon_parameter_names(gpt)
    assert names == before and len(names) == 20  # the shipped hot preset's model: 20 matrices, not 30
    assert not any("qk_norm" in n for n in names)

    class ScaleNorm(nn.Module):  # a user's norm with a matrix-shaped scale: owned by a norm, so not a matrix
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(2, 4))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden, self.norm, self.head = nn.Linear(8, 8), ScaleNorm(), nn.Linear(8, 2)
            self.gain = mark_not_a_matrix(nn.Parameter(torch.ones(2, 4)))

    net = Net()
    assert muon_parameter_names(net) == ["hidden.weight"]
    adamw = torch.optim.AdamW(net.parameters(), lr=1e-3)
    muon, _ = split_for_muon(net, [adamw])
    assert [p is net.hidden.weight for p in muon.param_groups[0]["params"]] == [True]
    kept = {id(p) for p in adamw.param_groups[0]["params"]}
    assert {id(net.gain), id(net.norm.weight)} <= kept
