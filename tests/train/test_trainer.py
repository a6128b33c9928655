"""The Trainer on small synthetic problems: records, stopping, resume, schedules, precision, guards."""
from __future__ import annotations

import threading
import time

import pytest
import torch
from helpers import needs_fmnist, toy_loaders, toy_model

from speedkit import RunRecord, Trainer
from speedkit.callbacks import Callback, NonFiniteLossError
from speedkit.optim import Cosine, Linear
from speedkit.train.checkpoint import CheckpointError, load_checkpoint


def fit(tmp_path, **kwargs):
    train, test = toy_loaders()
    options = dict(eval_dataloader=test, max_duration="2ep", device="cpu", run_dir=tmp_path, run_name="r",
                   log_interval=1)
    options.update(kwargs)
    trainer = Trainer(options.pop("model", None) or toy_model(), options.pop("train", train), **options)
    return trainer, trainer.fit()


def test_a_run_writes_a_complete_record(tmp_path):
    trainer, record = fit(tmp_path, schedulers=Cosine())
    assert record.status == "completed"
    loaded = RunRecord.load(tmp_path / "r")
    assert loaded.run_id == record.run_id and loaded.status == "completed"
    assert len(loaded.steps) == 16 and len(loaded.evals) == 2  # 8 batches x 2 epochs, log every batch
    assert loaded.steps[-1]["batch"] == 16 and loaded.steps[-1]["sample"] == 512
    walls = [s["wall_s"] for s in loaded.steps]
    assert walls == sorted(walls) and walls[0] > 0
    assert loaded.evals[-1]["eval/accuracy"] > 0.6  # the toy problem is learnable
    assert loaded.config["max_duration"] == "2ep" and loaded.config["optimizer"]["name"] == "SGD"
    assert loaded.environment["torch"] == torch.__version__ and loaded.environment["cpu"]
    assert "throughput/samples_per_s" in loaded.steps[-1] and "lr" in loaded.steps[-1]
    # Evaluation is timed apart and not counted as training time.
    assert loaded.timings["eval_s"] > 0
    assert loaded.timings["train_s"] == pytest.approx(trainer.state.timestamp.wall_s, abs=0.05)
    assert (tmp_path / "r" / "checkpoints" / "latest.ckpt").exists()


def test_eval_time_is_excluded_from_training_clock(tmp_path):
    class SlowMetric:
        def reset(self):
            pass

        def update(self, outputs, targets):
            time.sleep(0.3)

        def compute(self):
            return 0.0

    from speedkit import Evaluator

    _, test = toy_loaders()
    _, record = fit(tmp_path, max_duration="4ba", evaluators=[Evaluator(test, {"slow": SlowMetric()})],
                    eval_interval="1ba", save_checkpoints=False)
    assert record.timings["eval_s"] >= 4 * 0.3
    assert record.timings["train_s"] < record.timings["eval_s"]  # the sleeps are not training time


class StopFromThreadAt(Callback):
    """Calls trainer.stop() from another thread once a batch is reached, like the explorer's Stop button."""

    def __init__(self, batch):
        self.batch, self.trainer = batch, None

    def batch_end(self, state, logger):
        if state.timestamp.batch == self.batch:
            t = threading.Thread(target=self.trainer.stop)
            t.start()
            t.join()


def test_stop_from_another_thread_leaves_checkpoint_and_record(tmp_path):
    train, test = toy_loaders()
    stopper = StopFromThreadAt(5)
    trainer = Trainer(toy_model(), train, eval_dataloader=test, max_duration="3ep", callbacks=[stopper],
                      device="cpu", run_dir=tmp_path, run_name="s")
    stopper.trainer = trainer
    record = trainer.fit()
    assert record.status == "stopped" and trainer.state.timestamp.batch == 5
    on_disk = RunRecord.load(tmp_path / "s")
    assert on_disk.status == "stopped" and on_disk.evals and on_disk.evals[-1]["batch"] == 5
    payload = load_checkpoint(tmp_path / "s" / "checkpoints" / "latest.ckpt")
    assert payload["timestamp"]["batch"] == 5


def _losses(record):
    return [(s["batch"], s["loss"]) for s in record.steps]


@pytest.mark.parametrize("microbatch_size", [None, 16])
def test_resume_mid_epoch_is_exact(tmp_path, microbatch_size):
    """Stop mid-epoch, resume from the checkpoint: the same per-step losses as a run never stopped."""
    common = dict(max_duration="3ep", deterministic=True, model=None, schedulers=Linear(warmup="2ba"),
                  microbatch_size=microbatch_size)
    _, full = fit(tmp_path / "full", **{**common, "model": toy_model(dropout=0.2)})

    train, test = toy_loaders()
    stopper = StopFromThreadAt(11)  # epoch 1, batch 3 of 8
    first = Trainer(toy_model(dropout=0.2), train, eval_dataloader=test, callbacks=[stopper], log_interval=1,
                    device="cpu", run_dir=tmp_path / "part", run_name="r", **{k: v for k, v in common.items()
                                                                               if k != "model"})
    stopper.trainer = first
    first.fit()
    train, test = toy_loaders()
    second = Trainer(toy_model(dropout=0.2, seed=123), train, eval_dataloader=test, log_interval=1,
                     device="cpu", run_dir=tmp_path / "part", run_name="r", autoresume=True,
                     **{k: v for k, v in common.items() if k != "model"})
    resumed = second.fit()
    assert resumed.notes["resumed_from"].endswith("latest.ckpt")
    assert _losses(resumed) == _losses(full)
    assert resumed.final_metrics == full.final_metrics


def _write_good_checkpoint(tmp_path):
    trainer, _ = fit(tmp_path, max_duration="2ba")
    return tmp_path / "r" / "checkpoints" / "latest.ckpt"


class DeterminismSeen(Callback):
    """Whether torch ran deterministic kernels at each step and evaluation."""

    def __init__(self):
        self.seen = []

    def batch_end(self, state, logger):
        self.seen.append(torch.are_deterministic_algorithms_enabled())

    def eval_end(self, state, logger):
        self.seen.append(torch.are_deterministic_algorithms_enabled())


def test_deterministic_kernels_hold_for_the_run_and_the_process_gets_its_settings_back(tmp_path, monkeypatch):
    """A later run in the same process (a notebook's next one) must not run deterministic kernels, nor go without
    cuDNN's autotuner, because an earlier one asked for them."""
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    assert not torch.are_deterministic_algorithms_enabled()
    train, test = toy_loaders()
    seen = DeterminismSeen()
    trainer = Trainer(toy_model(), train, eval_dataloader=test, max_duration="2ba", deterministic=True, device="cpu",
                      callbacks=[seen], run_dir=tmp_path, save_checkpoints=False)
    trainer.fit()
    trainer.eval()
    assert len(seen.seen) == 4 and all(seen.seen)  # two steps, the final evaluation and the one after the run
    assert not torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.benchmark is True

    torch.use_deterministic_algorithms(True, warn_only=True)  # the user's own (tests/conftest.py turns it off after)
    Trainer(toy_model(), train, max_duration="1ba", device="cpu", run_dir=tmp_path / "second",
            save_checkpoints=False).fit()
    assert torch.are_deterministic_algorithms_enabled()


def test_truncated_or_edited_checkpoint_is_refused(tmp_path):
    path = _write_good_checkpoint(tmp_path)
    data = path.read_bytes()
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(truncated)
    edited = tmp_path / "edited.ckpt"
    edited.write_bytes(data[:-100] + bytes([data[-100] ^ 0xFF]) + data[-99:])
    with pytest.raises(CheckpointError, match="checksum"):
        load_checkpoint(edited)
    with pytest.raises(CheckpointError, match="not a speedkit checkpoint"):
        plain = tmp_path / "plain.pt"
        torch.save({"a": 1}, plain)
        load_checkpoint(plain)
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing.ckpt")


class _Exploit:
    def __reduce__(self):
        import os

        return (os.system, ("touch EXPLOITED_MARKER",))


def test_checkpoint_with_code_is_not_executed_even_with_a_valid_checksum(tmp_path, monkeypatch):
    import hashlib
    import io

    from speedkit.train.checkpoint import MAGIC

    monkeypatch.chdir(tmp_path)
    buffer = io.BytesIO()
    torch.save({"format_version": 1, "model": _Exploit()}, buffer)
    data = buffer.getvalue()
    path = tmp_path / "evil.ckpt"
    path.write_bytes(MAGIC + hashlib.sha256(data).hexdigest().encode() + b"\n" + data)
    with pytest.raises(CheckpointError, match="will not unpickle"):
        load_checkpoint(path)
    assert not (tmp_path / "EXPLOITED_MARKER").exists()


def test_checkpoint_for_another_model_gives_a_clear_error(tmp_path):
    path = _write_good_checkpoint(tmp_path)
    train, _ = toy_loaders()
    other = torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    trainer = Trainer(other, train, load_path=path, device="cpu", run_dir=tmp_path, run_name="other")
    with pytest.raises(CheckpointError, match="does not fit this model"):
        trainer.fit()


def test_stop_at_target_ends_the_run_and_records_time_to_target(tmp_path):
    trainer, record = fit(tmp_path, max_duration="20ep", eval_interval="2ba", stop_at=("eval/accuracy", 0.7),
                          optimizers=lambda p: torch.optim.Adam(p, lr=0.01))
    assert record.status == "target_reached"
    assert record.target == {"metric": "eval/accuracy", "value": 0.7}
    assert record.evals[-1]["eval/accuracy"] >= 0.7
    assert all(e["eval/accuracy"] < 0.7 for e in record.evals[:-1])
    assert record.time_to_target == record.evals[-1]["wall_s"]
    assert trainer.state.timestamp.epoch < 20


def nan_after(batches):
    calls = {"n": 0}

    def loss(outputs, targets):
        calls["n"] += 1
        value = torch.nn.functional.cross_entropy(outputs, targets)
        return value * float("nan") if calls["n"] > batches else value

    return loss


def test_nan_guard_stops_before_the_weights_change_and_keeps_the_checkpoint(tmp_path):
    train, _ = toy_loaders()
    trainer = Trainer(toy_model(), train, max_duration="3ep", loss_fn=nan_after(10), save_interval="1ep",
                      device="cpu", run_dir=tmp_path, run_name="n")
    with pytest.raises(NonFiniteLossError, match="batch 10"):
        trainer.fit()
    weights = {k: v.clone() for k, v in trainer.state.model.state_dict().items()}
    assert all(torch.isfinite(v).all() for v in weights.values())
    record = RunRecord.load(tmp_path / "n")
    assert record.status == "failed" and "NonFiniteLossError" in record.error
    payload = load_checkpoint(tmp_path / "n" / "checkpoints" / "latest.ckpt")  # the epoch-1 checkpoint
    assert payload["timestamp"]["batch"] == 8


def test_nan_guard_skip_policy_lowers_lr_and_carries_on(tmp_path):
    from speedkit.callbacks import NaNGuard

    train, _ = toy_loaders()
    calls = {"n": 0}

    def loss(outputs, targets):
        calls["n"] += 1
        value = torch.nn.functional.cross_entropy(outputs, targets)
        return value * float("nan") if calls["n"] == 3 else value

    guard = NaNGuard(policy="skip", lr_factor=0.5)
    trainer = Trainer(toy_model(), train, max_duration="1ep", loss_fn=loss, nan_policy=None, callbacks=[guard],
                      optimizers=lambda p: torch.optim.SGD(p, lr=0.1), device="cpu", run_dir=tmp_path)
    record = trainer.fit()
    assert record.status == "completed" and guard.skips == 1
    assert trainer.state.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.05)
    assert all(torch.isfinite(p).all() for p in trainer.state.model.parameters())


def test_microbatches_accumulate_to_the_full_batch_gradient(tmp_path):
    def one_step(microbatch_size):
        train, _ = toy_loaders(shuffle=False)
        trainer = Trainer(toy_model(), train, max_duration="1ba", microbatch_size=microbatch_size,
                          optimizers=lambda p: torch.optim.SGD(p, lr=0.5), device="cpu", run_dir=tmp_path,
                          save_checkpoints=False)
        trainer.fit()
        return [p.detach().clone() for p in trainer.state.model.parameters()]

    for full, micro in zip(one_step(None), one_step(8)):
        torch.testing.assert_close(full, micro, rtol=1e-5, atol=1e-6)


def test_schedule_scale_stretches_duration_and_schedule(tmp_path):
    def lrs(scale):
        trainer, record = fit(tmp_path / str(scale), max_duration="8ba", schedule_scale=scale,
                              schedulers=Linear(warmup="2ba"), save_checkpoints=False)
        return trainer, [s["lr"] for s in record.steps]

    t1, base = lrs(1.0)
    t2, stretched = lrs(2.0)
    assert t1.state.timestamp.batch == 8 and t2.state.timestamp.batch == 16
    # The LR of base batch b (set at fraction (b-1)/8) equals that of stretched batch 2b-1 ((2b-2)/16).
    assert stretched[0::2] == pytest.approx(base)
    assert stretched[1::2] != pytest.approx(base)  # and the points between are new ones


def test_wall_clock_budget_ends_the_run(tmp_path):
    train, _ = toy_loaders()

    class Slow(Callback):
        def batch_end(self, state, logger):
            time.sleep(0.05)

    trainer = Trainer(toy_model(), train, max_duration="0.5s", callbacks=[Slow()], device="cpu",
                      run_dir=tmp_path, save_checkpoints=False)
    record = trainer.fit()
    assert record.status == "completed"
    assert 0.5 <= trainer.state.timestamp.wall_s < 2.0


def test_bf16_precision_trains_on_cpu(tmp_path):
    trainer, record = fit(tmp_path, precision="bf16", save_checkpoints=False)
    assert record.config["precision_resolved"] == "bf16"
    assert record.evals[-1]["eval/accuracy"] > 0.6


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_duration="3 parsecs"), "parsecs"),
    (dict(max_duration="0.5dur"), "fraction"),
    (dict(precision="fp8"), "precision must be one of"),
    (dict(device="tpu"), "device must be one of"),
    (dict(grad_accum=0), "grad_accum"),
    (dict(eval_interval="often"), "often"),
])
def test_bad_arguments_name_the_problem(tmp_path, kwargs, message):
    train, test = toy_loaders()
    with pytest.raises((ValueError, TypeError), match=message):
        Trainer(toy_model(), train, eval_dataloader=test, run_dir=tmp_path, **kwargs)


def test_model_without_trainable_parameters_is_refused(tmp_path):
    train, _ = toy_loaders()
    with pytest.raises(ValueError, match="no trainable parameters"):
        Trainer(torch.nn.Flatten(), train, run_dir=tmp_path)


def test_empty_dataloader_is_refused(tmp_path):
    empty = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(0, 8),
                                                                       torch.zeros(0, dtype=torch.long)))
    with pytest.raises(ValueError, match="empty"):
        Trainer(toy_model(), empty, device="cpu", run_dir=tmp_path).fit()


@pytest.mark.parametrize("interval, expected_batches", [("1ep", [8, 16]), ("0.5ep", [4, 8, 12, 16]),
                                                        ("3ba", [3, 6, 9, 12, 15, 16]), ("0.25dur", [4, 8, 12, 16])])
def test_eval_interval_units(tmp_path, interval, expected_batches):
    _, record = fit(tmp_path, eval_interval=interval, save_checkpoints=False)
    assert [e["batch"] for e in record.evals] == expected_batches  # 16 is the final evaluation


class ComposerStyle(torch.nn.Module):
    """A model that brings its own loss and metrics, as Composer's models do."""

    def __init__(self):
        super().__init__()
        self.net = toy_model()

    def forward(self, x):
        return self.net(x)

    def loss(self, outputs, batch):
        return torch.nn.functional.cross_entropy(outputs, batch[1]) * 2.0

    def metrics(self):
        from speedkit.record.metrics import Accuracy

        return {"top2": Accuracy(topk=2)}


def test_model_with_its_own_loss_and_metrics(tmp_path):
    model = ComposerStyle()
    trainer, record = fit(tmp_path, model=model, max_duration="2ba", save_checkpoints=False)
    assert list(record.final_metrics) == ["eval/top2"]
    x, y = next(iter(toy_loaders(shuffle=False)[0]))
    assert trainer.state.loss_fn(model(x), (x, y)).item() == pytest.approx(
        2 * torch.nn.functional.cross_entropy(model(x), y).item())


@needs_fmnist
def test_resume_is_exact_with_the_in_memory_loader_and_its_augmentation(tmp_path):
    """Real Fashion-MNIST images through BatchLoader (crop + flip drawn per epoch), resumed via iter_from."""
    from speedkit.data import Augment, fashion_mnist_loaders
    from speedkit.models import get_model

    def run(folder, stop_at=None, resume=False):
        train, test = fashion_mnist_loaders(batch_size=100, data_fraction=0.02, eval_fraction=0.05,
                                            augment=Augment(crop_pad=2, flip="random"))
        torch.manual_seed(0)
        callbacks = [StopFromThreadAt(stop_at)] if stop_at else []
        trainer = Trainer(get_model("resnet8", width=8), train, eval_dataloader=test, max_duration="2ep",
                          callbacks=callbacks, deterministic=True, log_interval=1, device="cpu",
                          run_dir=folder, run_name="r", autoresume=resume)
        for cb in callbacks:
            cb.trainer = trainer
        return trainer.fit()

    full = run(tmp_path / "full")
    run(tmp_path / "part", stop_at=17)  # epoch 1, batch 5 of 12
    resumed = run(tmp_path / "part", resume=True)
    assert _losses(resumed) == _losses(full)
    assert resumed.final_metrics == full.final_metrics


def test_recipe_parts_fill_what_was_not_given(tmp_path):
    from method_harness import tiny_vision

    from speedkit.tasks import recipe_parts
    from speedkit.tasks import get_recipe

    model, train, test = tiny_vision()
    mild = get_recipe("fashion-mnist", "mild")
    trainer = Trainer(model, train, eval_dataloader=test, **recipe_parts("mild", model, max_duration="2ba",
                                                                         precision="fp32"),
                      device="cpu", run_dir=tmp_path, save_checkpoints=False)
    assert [a.name for a in trainer.state.methods] == sorted(mild.methods, key=lambda n: n != "channels_last")
    assert trainer.state.optimizers[0].defaults["lr"] == mild.optimizer["lr"]
    assert str(trainer.state.max_duration) == "2ba" and trainer.state.precision == "fp32"  # explicit wins
    assert trainer.record.config["recipe"] == "mild"
    trainer.fit()
    with pytest.raises(ValueError, match="fashion-mnist:baseline"):
        recipe_parts("hot-sauce", model)


def test_durations_in_tokens_need_batches_with_tokens(tmp_path):
    """The first batch is checked against every duration, the checkpoint saver's included (it says which
    durations it counts in: Callback.durations), and a duck-typed callback without that method is fine."""

    class DuckCallback:
        def run_event(self, event, state, logger):
            pass

    with pytest.raises(ValueError, match=r"save_interval=100tok counts tokens"):
        fit(tmp_path, max_duration="2ba", save_interval="100tok")
    _, record = fit(tmp_path / "duck", max_duration="2ba", callbacks=[DuckCallback()], save_checkpoints=False)
    assert record.status == "completed"


def test_the_checkpointer_follows_its_parallel_plan(tmp_path):
    """The Checkpointer writes ``latest.ckpt`` only when the plan wrote a checkpoint (an FSDP run that lost its
    ranks writes none), and otherwise keeps the last one and the record's note of it."""
    import dataclasses

    from speedkit.train.parallel import SingleProcess

    trainer, record = fit(tmp_path, max_duration="2ba")
    folder = tmp_path / "r" / "checkpoints"
    latest, note = (folder / "latest.ckpt").read_bytes(), record.notes["last_checkpoint"]

    class WritesNothing(SingleProcess):
        def gather_checkpoint(self, state, logger, rng, last_checkpoint):
            return None

    checkpointer = trainer.checkpointer
    checkpointer.plan = WritesNothing(torch.device("cpu"))
    trainer.state.timestamp = dataclasses.replace(trainer.state.timestamp, batch=3)
    path = checkpointer.save()
    assert not path.exists() and path.name == "ba000000003.ckpt"
    assert (folder / "latest.ckpt").read_bytes() == latest and trainer.record.notes["last_checkpoint"] == note
    checkpointer.plan = SingleProcess(torch.device("cpu"))
    assert checkpointer.save() == path and path.exists()
    assert (folder / "latest.ckpt").read_bytes() == path.read_bytes()
    assert trainer.record.notes["last_checkpoint"] == "checkpoints/ba000000003.ckpt"  # relative to the run folder
