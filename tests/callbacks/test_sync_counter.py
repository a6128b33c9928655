"""The host never waits on the device inside a training step between logging intervals, counted on a CPU.

A ``SyncCounter`` sees every read of a device value (``.item()``, ``bool()``, ``float()``), speedkit's own
deliberate reads and synchronizes, and collectives; on a CPU these cost nothing, so only a count catches
a GPU regression here. Every preset of both built-in tasks runs a few steps at tiny scale with the default
callbacks (the NaN guard, speed and LR monitors).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import toy_loaders, toy_model
from prerequisites import require

from speedkit.callbacks import Callback, SyncCounter
from speedkit.callbacks.sync_counter import kernel_launches, profiled_kernels
from speedkit.core.devices import synchronize, to_host
from speedkit.tasks import make_trainer
from speedkit.tasks import TASKS
from speedkit.tasks.task import BUILT_IN
from speedkit.train.trainer import Trainer

PRESETS = [(task, name) for task in sorted(BUILT_IN) for name in TASKS[task].recipes]
LOG_EVERY = 3


def counted_run(tmp_path, task, name, callbacks=()):
    require("fashion-mnist" if task == "fashion-mnist" else "python-docs")
    counter = SyncCounter(keep_stacks=True)
    trainer = make_trainer(task, name, duration="7ba", batch_size=8, data_fraction=0.01, eval_fraction=0.005,
                           eval_interval="3ba", log_interval=LOG_EVERY, device="cpu", run_dir=tmp_path,
                           save_checkpoints=False, callbacks=[counter, *callbacks])
    record = trainer.fit()
    assert record.status == "completed"
    return counter, record


@pytest.mark.parametrize("task, name", PRESETS, ids=[f"{t}:{n}" for t, n in PRESETS])
def test_no_host_wait_in_a_step_between_logging_intervals_and_one_per_evaluation(tmp_path, task, name):
    counter, record = counted_run(tmp_path, task, name)
    quiet = counter.quiet_steps()
    assert set(quiet) == {2, 4, 5}, counter.report()  # neither logged nor evaluated after (7 is the last)
    where = "\n".join(stack for (phase, stack) in counter.stacks if phase[1] > 1 and phase[1] in quiet)
    assert sum(quiet.values()) == 0, f"host waits in quiet steps {quiet}:\n{where}"
    # Evaluations at batches 3 and 6 and the final one: each reads its metrics once, not once per batch.
    assert len(counter.evals) == 3 and all(n <= 1 for n in counter.evals), counter.evals
    assert record.notes["syncs"]["waits_in_quiet_steps"] == 0


def test_an_item_added_to_the_step_is_counted(tmp_path):
    class ReadsTheLoss(Callback):
        def after_loss(self, state, logger):
            float(state.loss)  # the regression: one host wait per microbatch

    counter, _ = counted_run(tmp_path, "pydocs", "hot", callbacks=[ReadsTheLoss()])
    quiet = counter.quiet_steps()
    assert quiet and all(n >= 1 for n in quiet.values()), quiet
    assert counter.totals["item"] >= len(quiet)


def test_the_counter_sees_each_kind_of_wait_and_nothing_else():
    x = torch.randn(4)
    with SyncCounter() as counter:
        y = (x * 2).sum()  # device work: no wait
        y.item()
        bool(y > 0)
        float(y)
        if y:
            pass
        to_host(torch.stack([y, y]))  # speedkit's deliberate read: one wait however many values
        synchronize(torch.device("cpu"))
    assert dict(counter.totals) == {"item": 4, "host_read": 1, "device_sync": 1}
    assert counter.total == 6
    y.item()  # after the block: no longer counted
    assert counter.total == 6


def test_an_optimizers_step_count_on_the_host_is_not_a_wait():
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=False)  # reads its CPU step count with .item()
    inputs = torch.randn(3, 4)  # made before counting: the device's batch (one made on the host is a copy)
    with SyncCounter() as counter:
        for _ in range(2):
            model(inputs).sum().backward()
            optimizer.step()
    assert counter.total == 0, dict(counter.totals)


def test_a_run_that_fails_stops_counting(tmp_path):
    class Fails(Callback):
        def batch_end(self, state, logger):
            raise RuntimeError("boom")

    train, _ = toy_loaders()
    counter = SyncCounter()
    trainer = Trainer(toy_model(), train, max_duration="2ba", device="cpu", run_dir=tmp_path,
                      save_checkpoints=False, callbacks=[counter, Fails()])
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit()
    before = counter.total
    torch.ones(()).item()
    assert counter.total == before  # the dispatch mode was popped when the run ended


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

# Each copies host data to the device and, on a GPU, makes the host wait for it: made inside a step, each counts.
BLOCKING_COPIES = {
    "permutation drawn on the host, moved": lambda x: torch.randperm(x.shape[0]).to(x.device),
    "host permutation as an index": lambda x: x[torch.randperm(x.shape[0])],
    "host indices into index_select": lambda x: x.index_select(0, torch.tensor([0, 1])),
    "a Python list on the device": lambda x: torch.tensor([0.5, 0.25], device=x.device),
    "numpy data moved": lambda x: torch.as_tensor(np.ones(3)).to(x.device),
    "host data copied into a device tensor": lambda x: torch.zeros(4, device=x.device).copy_(torch.rand(4)),
    "host random numbers mixed with device data": lambda x: x + torch.rand(x.shape),
    "a device constant remade from numbers": lambda x: x * torch.tensor([[1.0], [2.0]]).reshape(1, 2, 1).to(x.device),
}
# None of these copies: device-drawn randomness, a 0-d host value (read as a number), a host-only read, a
# non-blocking copy from pinned memory, a tensor moved to where it already is.
NO_COPIES = {
    "permutation drawn on the device": lambda x: x[torch.randperm(x.shape[0], device=x.device)],
    "random numbers drawn on the device": lambda x: x * torch.rand(x.shape, device=x.device),
    "a 0-d host value as a scalar": lambda x: x * torch.distributions.Beta(1.0, 1.0).sample(),
    "a host-made value read on the host": lambda x: torch.randint(0, 4, (1,)).item(),
    "a device tensor moved to its device": lambda x: x.to(x.device),
    "dtype only": lambda x: torch.arange(3).to(torch.float32),
    "a number assigned through a mask (a masked fill)": lambda x: x.clone().__setitem__(x > 0, 0.0),
    "pinned and non-blocking": lambda x: ((torch.rand(4).pin_memory() if x.is_cuda else torch.rand(4))
                                          .to(x.device, non_blocking=True)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(BLOCKING_COPIES))
def test_each_blocking_host_to_device_copy_is_counted(case, device):
    x = torch.randn(2, 2, 3, device=device)  # the device's data, made before counting
    with SyncCounter() as counter:
        BLOCKING_COPIES[case](x)
    assert counter.totals["host_to_device"] == 1, dict(counter.totals)
    assert counter.total == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(NO_COPIES))
def test_device_side_work_and_host_only_reads_are_not_copies(case, device):
    x = torch.randn(2, 2, 3, device=device)
    with SyncCounter() as counter:
        NO_COPIES[case](x)
    assert counter.total == 0, dict(counter.totals)


def test_a_copy_added_to_the_step_is_counted(tmp_path):
    class MovesHostNumbers(Callback):
        def after_dataloader(self, state, logger):
            torch.tensor([1.0, 2.0], device=state.device)  # the regression: a constant remade every step

    counter, _ = counted_run(tmp_path, "pydocs", "baseline", callbacks=[MovesHostNumbers()])
    quiet = counter.quiet_steps()
    assert quiet and all(n == 1 for n in quiet.values()), quiet
    assert counter.totals["host_to_device"] >= len(quiet)


# Each makes an output whose size is read from the device's data: the host waits for the device to compute it.
DATA_DEPENDENT_SHAPES = {
    "nonzero": lambda x: torch.nonzero(x > 0),
    "a boolean mask as an index": lambda x: x[x > 0],
    "a boolean mask added through": lambda x: x.clone().index_put_((x > 0,), torch.ones((), device=x.device),
                                                                   accumulate=True),
    "unique": lambda x: torch.unique(x),
    "masked_select": lambda x: x.masked_select(x > 0),
    "repeat_interleave of counts": lambda x: torch.repeat_interleave((x > 0).long().flatten()),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(DATA_DEPENDENT_SHAPES))
def test_an_output_sized_by_the_data_is_a_wait(case, device):
    x = torch.randn(2, 2, 3, device=device)
    with SyncCounter() as counter:
        DATA_DEPENDENT_SHAPES[case](x)
    assert counter.totals["data_dependent"] == 1, dict(counter.totals)
    assert counter.total == 1


def test_an_output_sized_by_host_data_is_no_wait():
    with SyncCounter() as counter:
        keys = torch.randint(0, 4, (16,))  # drawn on the host, as a loader or AugMix's grouping does
        torch.unique(keys)
        keys[keys > 1]
    assert counter.total == 0, dict(counter.totals)


def test_a_steps_kernel_launches_leave_out_views_allocations_and_reads(tmp_path):
    class AddsOps(Callback):
        def __init__(self, work):
            self.work = work

        def after_dataloader(self, state, logger):
            self.work(state.batch[0])

    def launches(x):  # four ops that give the device work
        torch.stack([x * 2, x + 1]).sum()

    def views_and_allocations(x):  # eight ops, one of them work (the zeros' fill)
        x.view(-1).t(), x.detach(), torch.empty(3), x.new_empty(2), torch.empty_like(x)
        torch.zeros((), dtype=torch.int64, device="cpu").item()  # a read of a value made on the host

    def counts(work):
        counter = SyncCounter()
        Trainer(toy_model(), toy_loaders()[0], max_duration="5ba", device="cpu", run_dir=tmp_path / work.__name__,
                log_interval=3, callbacks=[counter, AddsOps(work)], save_checkpoints=False).fit()
        return counter.quiet_step_ops()[4], counter.quiet_step_launches()[4]

    (plain_ops, plain_launches), (ops, launched) = counts(lambda x: None), counts(launches)
    assert (ops - plain_ops, launched - plain_launches) == (4, 4)
    ops, launched = counts(views_and_allocations)
    assert (ops - plain_ops, launched - plain_launches) == (8, 1)


def test_a_multi_tensor_op_is_one_launch_only_where_cudas_fast_path_takes_its_lists():
    aten = torch.ops.aten
    weights = [torch.zeros(6, 4), torch.zeros(3, 3)]
    like = [torch.ones(6, 4), torch.ones(3, 3)]
    assert kernel_launches(aten._foreach_add_.List, (weights, like)) == 1
    assert kernel_launches(aten._foreach_add_.List, (weights, [torch.ones(4, 6).t(), like[1]])) == 2  # transposed
    assert kernel_launches(aten._foreach_add_.List, (weights, [t.bfloat16() for t in like])) == 2  # another dtype
    assert kernel_launches(aten._foreach_add_.List, (weights, [torch.ones(6, 8)[:, :4], like[1]])) == 2  # a slice
    bits = [torch.zeros(5, dtype=torch.int32), torch.zeros(7, dtype=torch.int32)]
    assert kernel_launches(aten._foreach_mul_.Scalar, (bits, 2)) == 1
    assert kernel_launches(aten._foreach_mul_.Scalar, (bits, 0.5)) == 2  # the product would be a float
    assert kernel_launches(aten._foreach_mul_.Tensor, (bits, torch.tensor(1, dtype=torch.int32))) == 1
    assert kernel_launches(aten._foreach_mul_.Tensor, (bits, torch.tensor(1.0))) == 2
    bf16 = [t.bfloat16() for t in like]  # the AMP check's flags are fp32 whatever the gradients' dtype
    assert kernel_launches(aten._amp_foreach_non_finite_check_and_unscale_.default,
                           (bf16, torch.zeros(()), torch.ones(()))) == 1
    assert kernel_launches(aten.add.Tensor, (like[0], like[0])) == 1
    assert kernel_launches(aten.t.default, (like[0],)) == 0


def test_a_product_added_to_a_copy_of_a_tensor_is_two_launches():
    aten = torch.ops.aten
    batch, matrix, bias = torch.ones(2, 3, 3), torch.ones(3, 3), torch.ones(3)
    assert kernel_launches(aten.baddbmm.default, (batch, batch, batch), {"beta": 0.5}) == 2  # the copy, the product
    assert kernel_launches(aten.baddbmm.default, (batch, batch, batch), {"beta": 0}) == 1  # self not read
    assert kernel_launches(aten.baddbmm_.default, (batch, batch, batch), {"beta": 0.5}) == 1  # in place
    assert kernel_launches(aten.addmm.default, (matrix, matrix, matrix)) == 2
    assert kernel_launches(aten.addmm.default, (bias, matrix, matrix)) == 1  # the epilogue adds a bias vector
    assert kernel_launches(aten.bmm.default, (batch, batch)) == 1


def test_a_cpu_profile_counts_kernels_as_a_gpu_would_launch_them():
    import torch._inductor.config as inductor_config
    from torch.profiler import ProfilerActivity, profile

    tensors = [torch.randn(8, 8) for _ in range(5)]

    def counted(work):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            work()
        return profiled_kernels(prof.events())

    # one multi-tensor op, not its five per-tensor ops on a CPU; a matmul (which calls a view); a cast (``to``, which
    # calls ``_to_copy`` and ``copy_``); no views, allocations or reads of a value
    assert counted(lambda: torch._foreach_add_(tensors, 1.0)) == {"aten::_foreach_add_": 1}
    assert counted(lambda: tensors[0] @ tensors[1]) == {"aten::mm": 1}
    assert counted(lambda: tensors[0].to(torch.bfloat16)) == {"aten::copy_": 1}
    assert counted(lambda: (tensors[0].t(), tensors[0].view(-1), torch.empty(3), tensors[0][0, 0].item())) == {}
    # a product added to a copy of a tensor: the copy CUDA makes first and the product (a CPU's profile shows only the
    # copy); none in place, nor of the bias vector that CUDA adds in the product's epilogue
    batch = torch.stack(tensors[:2])
    assert counted(lambda: torch.baddbmm(batch, batch, batch, beta=2.0)) == {"aten::baddbmm": 1, "aten::copy_": 1}
    assert counted(lambda: torch.addmm(tensors[0], tensors[1], tensors[2])) == {"aten::addmm": 1, "aten::copy_": 1}
    assert counted(lambda: batch.baddbmm_(batch.mT, batch.mT)) == {"aten::baddbmm_": 1}
    assert counted(lambda: torch.nn.functional.linear(tensors[0], tensors[1], tensors[2][0])) == {"aten::addmm": 1}
    # a compiled function's fused kernel, profiled where inductor marks its kernels
    with inductor_config.patch({"cpp.enable_kernel_profile": True}):
        fused = torch.compile(lambda x: (x * 2 + 1).relu())
        fused(tensors[0])
        assert counted(lambda: fused(tensors[0])) == {"inductor": 1}
