"""Optimizers built from a recipe's spec run multi-tensor (foreach) kernels on a CPU and fused ones on CUDA, with
the same numbers as torch's per-parameter loop; a spec that chooses its kernels keeps its choice."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from speedkit.optim.factory import kernel_choice, make_optimizer_factory

SPECS = [{"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4},
         {"name": "adamw", "lr": 1e-3, "weight_decay": 0.1, "betas": [0.9, 0.95]},
         {"name": "adam", "lr": 1e-3}]


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, 3))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["name"])
def test_cpu_optimizers_are_foreach_with_the_per_parameter_loops_numbers(spec):
    built, reference = _model(), _model()
    optimizer = make_optimizer_factory(spec)(built.parameters())
    assert optimizer.defaults["foreach"] is True and not optimizer.defaults.get("fused")
    options = {k: (tuple(v) if k == "betas" else v) for k, v in spec.items() if k != "name"}
    per_parameter = type(optimizer)(reference.parameters(), foreach=False, **options)
    for _ in range(3):
        x = torch.randn(5, 6)
        for model, opt in ((built, optimizer), (reference, per_parameter)):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    for p, q in zip(built.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


def test_parameter_groups_given_as_generators_keep_their_parameters():
    model = _model()
    groups = [{"params": (p for p in model[0].parameters())}, {"params": model[2].parameters(), "lr": 0.01}]
    optimizer = make_optimizer_factory(SPECS[0])(groups)
    assert [len(g["params"]) for g in optimizer.param_groups] == [2, 2]
    assert optimizer.param_groups[1]["lr"] == 0.01


def test_a_spec_that_chooses_its_kernels_keeps_its_choice():
    optimizer = make_optimizer_factory({"name": "adamw", "lr": 1e-3, "foreach": False})(_model().parameters())
    assert optimizer.defaults["foreach"] is False
    assert kernel_choice([nn.Parameter(torch.zeros(2))], {"fused": True}) == {}


def test_parameters_on_cuda_get_fused_kernels_and_the_rest_foreach():
    on_cpu = [nn.Parameter(torch.zeros(2))]
    assert kernel_choice(on_cpu, {}) == {"foreach": True}
    assert kernel_choice([{"params": on_cpu}], {}) == {"foreach": True}
    if torch.cuda.is_available():
        on_cuda = [nn.Parameter(torch.zeros(2, device="cuda"))]
        assert kernel_choice(on_cuda, {}) == {"fused": True}
        assert kernel_choice(on_cuda + on_cpu, {}) == {"foreach": True}
        optimizer = make_optimizer_factory(SPECS[1])(on_cuda)
        assert optimizer.defaults["fused"] is True
