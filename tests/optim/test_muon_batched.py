"""Muon orthogonalises all the matrices of one shape in one batched Newton-Schulz iteration, and small matrices of
different shapes padded with zeros to one where that costs less than their dispatches: the same numbers as one
iteration per matrix, a handful of iterations per step instead of one per matrix, and the same state layout (a
momentum buffer per parameter), so checkpoints written before still load."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

import speedkit.optim.muon as muon_module
from speedkit.callbacks.sync_counter import foreach_fast_path
from speedkit.optim.muon import (DISPATCHES_WORTH_FLOPS, PAD_SHARE, Muon, orthogonalize_together, plan_batches,
                                 zeropower_via_newtonschulz)

SHAPES = [(24, 16), (8, 3, 3, 3), (24, 16), (16, 24), (8, 3, 3, 3), (24, 16)]
SMALL_FILTERS = [(16, 1, 3, 3), (32, 16, 1, 1), (64, 32, 1, 1)]  # ResNet-8's three smallest


def _params(shapes=SHAPES):
    torch.manual_seed(0)
    return [nn.Parameter(torch.randn(*shape)) for shape in shapes]


def test_batched_steps_match_one_iteration_per_matrix():
    params = _params()
    expected = [p.detach().clone() for p in params]
    buffers = [torch.zeros_like(p) for p in params]
    lr, momentum, wd = 0.05, 0.9, 0.1
    opt = Muon(params, lr=lr, momentum=momentum, nesterov=True, weight_decay=wd)
    for _ in range(3):
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
        torch.testing.assert_close(p.detach(), want, rtol=1e-4, atol=1e-5)


def _iterations_of_a_step(monkeypatch, shapes=SHAPES) -> list[tuple]:
    calls = []

    def counted(G, *args, **kwargs):
        calls.append(tuple(G.shape))
        return zeropower_via_newtonschulz(G, *args, **kwargs)

    monkeypatch.setattr(muon_module, "zeropower_via_newtonschulz", counted)
    params = _params(shapes)
    opt = Muon(params, lr=0.02)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    return sorted(calls)


def test_one_newton_schulz_iteration_per_shape_where_padding_is_worth_nothing(monkeypatch):
    monkeypatch.setitem(DISPATCHES_WORTH_FLOPS, "cpu", 0)
    # [24, 16] and [16, 24] are one shape once turned wide
    assert _iterations_of_a_step(monkeypatch) == [(2, 8, 27), (4, 16, 24)]
    assert _iterations_of_a_step(monkeypatch, SMALL_FILTERS) == [(16, 9), (32, 16), (64, 32)]  # alone: unbatched


def test_small_matrices_of_different_shapes_run_one_iteration_padded_to_one_wide_shape(monkeypatch):
    assert _iterations_of_a_step(monkeypatch, SMALL_FILTERS) == [(3, 32, 64)]  # turned wide, padded to the largest
    assert _iterations_of_a_step(monkeypatch) == [(2, 8, 27), (4, 16, 24)]  # six to pad cost as much as an iteration


def test_a_padded_iteration_gives_each_matrix_its_own_iterations_result():
    torch.manual_seed(0)
    padded = [torch.randn(24, 16), torch.randn(8, 27), torch.randn(16, 24), torch.randn(5, 3)]
    transposed_shapes = [torch.randn(24, 16), torch.randn(16, 24), torch.randn(16, 2, 3, 4)]  # one wide shape: no pad
    for matrices in (padded, transposed_shapes):
        together = orthogonalize_together(matrices, dtype=torch.float32)
        for matrix, ortho in zip(matrices, together):
            assert ortho.shape == matrix.shape
            alone = zeropower_via_newtonschulz(matrix.reshape(matrix.size(0), -1), dtype=torch.float32)
            torch.testing.assert_close(ortho, alone.view_as(matrix), rtol=1e-4, atol=1e-5)


# [rows, cols] of Muon's matrices in ResNet-8 (conv filters flattened), in GPT-2 124M's layers and gpt-nano's.
RESNET8 = [(16, 9), (32, 144), (32, 288), (32, 16), (64, 288), (64, 576), (64, 32), (128, 576), (128, 1152),
           (128, 64)]
GPT2_LAYER = [(2304, 768), (768, 768), (3072, 768), (768, 3072)]
GPT_NANO_LAYER = [(384, 128), (128, 128), (512, 128), (128, 512)]
ON = {device: (DISPATCHES_WORTH_FLOPS[kind], PAD_SHARE[kind])  # a plan's costs, by device
      for device, kind in (("cpu", "cpu"), ("gpu", "accelerator"))}


def test_a_gpu_pads_a_conv_nets_filters_into_one_iteration_and_a_cpu_only_the_small_ones():
    on_gpu = plan_batches(RESNET8, *ON["gpu"])
    assert on_gpu == [list(range(len(RESNET8)))]
    on_cpu = plan_batches(RESNET8, *ON["cpu"])
    assert 1 < len(on_cpu) < len(RESNET8)
    largest = RESNET8.index((128, 1152))
    assert [largest] in on_cpu  # padding anything to it would cost more arithmetic than a CPU's dispatches


def test_a_transformers_matrices_stay_one_iteration_per_shape_where_padding_would_cost_more():
    wide = [tuple(sorted(shape)) for shape in GPT2_LAYER * 12]  # the MLP's two matrices are one shape turned wide
    for costs in ON.values():
        batches = plan_batches(wide, *costs)
        assert sorted({wide[i] for i in batch}.pop() for batch in batches) == [(768, 768), (768, 2304), (768, 3072)]
        assert all(len({wide[i] for i in batch}) == 1 for batch in batches)


def test_a_gpu_pads_a_small_transformers_matrices_into_one_iteration_where_a_cpu_keeps_one_per_shape():
    # five layers of [128, 128] and [128, 384] padded to [128, 512] add less arithmetic than two iterations' launches
    shapes = GPT_NANO_LAYER * 5
    assert plan_batches(shapes, *ON["gpu"]) == [list(range(len(shapes)))]
    on_cpu = plan_batches(shapes, *ON["cpu"])
    assert sorted({tuple(sorted(shapes[i])) for i in batch}.pop() for batch in on_cpu) == [(128, 128), (128, 384),
                                                                                          (128, 512)]


def test_a_compiled_update_gives_the_eager_numbers_and_compiles_once_while_a_schedule_changes_the_lr():
    import torch._dynamo
    from torch._dynamo.utils import counters

    params = _params(SHAPES + SMALL_FILTERS)
    copies = [nn.Parameter(p.detach().clone()) for p in params]
    eager = Muon(params, lr=0.02, weight_decay=0.1)
    compiled = Muon(copies, lr=0.02, weight_decay=0.1)
    compiled.compile_update()
    assert compiled.compiled and not eager.compiled
    torch._dynamo.reset()
    graphs = counters["stats"]["unique_graphs"]
    for step in range(4):
        for opt in (eager, compiled):
            opt.param_groups[0]["lr"] = 0.02 * (1 - step / 4)  # as a schedule sets it
        for p, q in zip(params, copies):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        eager.step()
        compiled.step()
    assert counters["stats"]["unique_graphs"] - graphs == 1
    for p, q in zip(params, copies):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)


def test_state_layout_is_a_momentum_buffer_per_parameter_and_resumes_exactly():
    params = _params()
    opt = Muon(params, lr=0.02)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    saved = opt.state_dict()
    assert sorted(saved["state"]) == list(range(len(SHAPES)))
    assert all(set(s) == {"momentum_buffer"} and s["momentum_buffer"].shape == p.shape
               for s, p in zip(saved["state"].values(), params))
    copies = [nn.Parameter(p.detach().clone()) for p in params]
    resumed = Muon(copies, lr=0.02)
    resumed.load_state_dict(copy.deepcopy(saved))  # a checkpoint's copy, not the live buffers
    grads = [torch.randn_like(p) for p in params]
    for p, q, g in zip(params, copies, grads):
        p.grad, q.grad = g.clone(), g.clone()
    opt.step()
    resumed.step()
    for p, q in zip(params, copies):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_muon_follows_a_tensor_learning_rate_without_reading_it_on_the_host():
    """A capturable, fused or compiled optimizer keeps its rate as a tensor (on the GPU, where reading it as a
    number waits for the device): Muon's groups follow it as a tensor, with the same numbers as a float rate."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from speedkit.optim.follow import FollowSchedule

    class HostReads(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:  # float(tensor), tensor.item()
                HostReads.count += 1
            return func(*args, **(kwargs or {}))

    def train(lr):
        params = _params()
        user = torch.optim.SGD([nn.Parameter(torch.zeros(3))], lr=0.1)  # the user's, whose rate Muon follows
        muon = Muon(params, lr=0.02, weight_decay=0.1)
        follow = FollowSchedule((user, 0), [muon])
        user.param_groups[0]["lr"] = lr(0.1)
        torch.manual_seed(1)
        for step in range(3):
            user.param_groups[0]["lr"] = user.param_groups[0]["lr"] * 0.5 if step else user.param_groups[0]["lr"]
            for p in params:
                p.grad = torch.randn_like(p)
            with HostReads():
                follow()
                muon.step()
        return params, muon.param_groups[0]["lr"]

    as_float, float_lr = train(float)
    as_tensor, tensor_lr = train(torch.tensor)
    assert HostReads.count == 0 and isinstance(tensor_lr, torch.Tensor)
    torch.testing.assert_close(tensor_lr, torch.tensor(float_lr))  # 0.02 x a quarter of the reference's rate
    for a, b in zip(as_float, as_tensor):
        torch.testing.assert_close(a, b)


def test_the_batches_are_planned_once_for_a_groups_shapes(monkeypatch):
    """A plan made at every step would cost the host about a millisecond a step for ResNet-50's filters."""
    planned = []
    monkeypatch.setattr(muon_module, "plan_batches",
                        lambda *args, **kwargs: planned.append(args) or plan_batches(*args, **kwargs))
    params = _params()
    opt = Muon(params, lr=0.02)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn_like(p)
        opt.step()
    assert len(planned) == 1
    params[0].grad = None  # a step without one of them is another set of shapes: planned for it
    opt.step()
    assert len(planned) == 2


def test_the_results_of_a_shape_batch_are_laid_out_as_the_weights_they_update():
    """CUDA's multi-tensor add runs as one kernel only where each result has its weight's strides; a tall matrix's
    result is iterated transposed, a channels_last filter's as a contiguous matrix, and either would send the whole
    add down the slow path of a kernel per matrix."""
    tall = [torch.randn(96, 32) for _ in range(3)]  # iterated as their 32 x 96 transposes
    filters = [torch.randn(16, 8, 3, 3).contiguous(memory_format=torch.channels_last) for _ in range(3)]
    for weights in (tall, filters):
        for dtype in (torch.bfloat16, torch.float32):
            orthos = orthogonalize_together([w.clone() for w in weights], dtype=dtype)
            assert all(o.dtype == torch.float32 for o in orthos)
            assert foreach_fast_path([weights, orthos]), [o.stride() for o in orthos]
            one_by_one = [zeropower_via_newtonschulz(w.reshape(16, -1) if w.dim() == 4 else w, dtype=dtype)
                          for w in weights]
            assert all(torch.allclose(o.reshape(m.shape), m, atol=1e-6) for o, m in zip(orthos, one_by_one))


def test_a_padded_batch_is_one_fill_and_a_copy_a_matrix():
    """Each matrix is copied (cast and flattened on the way) into its corner of a batch of zeros: a pad would be a
    fill and a copy each, a channels_last filter's flattening another copy, and the stack one more."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(func)
            return func(*args, **(kwargs or {}))

    filters = [torch.randn(*shape).contiguous(memory_format=torch.channels_last) for shape in SMALL_FILTERS]
    with Ops() as ops:
        orthogonalize_together(filters, dtype=torch.bfloat16)
    aten = torch.ops.aten
    assert aten.constant_pad_nd.default not in ops.seen and aten.clone.default not in ops.seen
    assert ops.seen.count(aten.copy_.default) == len(filters) and ops.seen.count(aten.new_zeros.default) == 1
