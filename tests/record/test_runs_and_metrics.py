"""RunRecords on disk, metrics, devices and the smaller callbacks."""
from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import toy_loaders, toy_model

from speedkit import RunRecord, Trainer
from speedkit.callbacks import SpeedMonitor, count_training_flops_per_sample
from speedkit.core.devices import resolve_device, resolve_precision
from speedkit.record.metrics import Accuracy, BitsPerByte, CrossEntropy, Perplexity
from speedkit.record.runs import load_records, lower_is_better


def test_record_round_trip_and_time_to(tmp_path):
    record = RunRecord(name="a", target={"metric": "eval/accuracy", "value": 0.9})
    record.add_step({"batch": 1, "wall_s": 0.5}, {"loss": 2.0})
    record.add_step({"batch": 1, "wall_s": 0.5}, {"lr": 0.1})  # same batch: one row
    record.add_step({"batch": 2, "wall_s": 1.0}, {"loss": float("nan")})
    for batch, wall, acc in [(10, 5.0, 0.8), (20, 10.0, 0.91), (30, 15.0, 0.95)]:
        record.add_eval({"batch": batch, "wall_s": wall}, {"eval/accuracy": acc, "eval/loss": 1 - acc})
    assert record.steps[0] == {"batch": 1, "wall_s": 0.5, "loss": 2.0, "lr": 0.1}
    assert record.steps[1]["loss"] is None  # nan is not JSON; it becomes null
    assert record.time_to_target == 10.0
    assert record.time_to("eval/loss", 0.06) == 15.0  # lower is better for losses
    assert record.time_to("eval/accuracy", 0.99) is None
    assert record.best("eval/accuracy") == 0.95 and record.best("eval/loss") == pytest.approx(0.05)
    path = record.save(tmp_path / "a" / "record.json")
    loaded = RunRecord.load(tmp_path / "a")
    assert loaded == record
    assert json.loads(path.read_text())["time_to_target_s"] == 10.0
    assert loaded.series("eval/accuracy") == ([5.0, 10.0, 15.0], [0.8, 0.91, 0.95])


def test_load_records_skips_other_json_and_reports_bad_records(tmp_path):
    RunRecord(name="one").save(tmp_path / "one" / "record.json")
    RunRecord(name="two").save(tmp_path / "two.json")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "record.json").write_text('{"run_id": ')
    assert sorted(r.name for r in load_records(tmp_path)) == ["one", "two"]
    with pytest.raises(ValueError, match="not valid JSON"):
        RunRecord.load(tmp_path / "broken")
    with pytest.raises(ValueError, match="newer"):
        RunRecord.from_dict({"run_id": "x", "version": 99})


@pytest.mark.parametrize("name, lower", [("eval/accuracy", False), ("eval/loss", True), ("eval/bpb", True),
                                         ("eval/perplexity", True), ("eval/top5", False)])
def test_metric_direction(name, lower):
    assert lower_is_better(name) is lower


def test_metrics_on_known_values():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [0.0, 1.0, 4.0], [5.0, 0.0, 1.0]])
    targets = torch.tensor([0, 2, 2, 1])
    acc, top2 = Accuracy(), Accuracy(topk=2)
    for m in (acc, top2):
        m.update(logits[:2], targets[:2])
        m.update(logits[2:], targets[2:])
    assert acc.compute() == 0.5 and top2.compute() == 0.75
    ce, ppl, bpb = CrossEntropy(), Perplexity(), BitsPerByte()
    for m in (ce, ppl, bpb):
        m.update(logits, targets)
    expected = torch.nn.functional.cross_entropy(logits, targets).item()
    assert ce.compute() == pytest.approx(expected)
    assert ppl.compute() == pytest.approx(math.exp(expected))
    assert bpb.compute() == pytest.approx(expected / math.log(2))
    seq = CrossEntropy()  # [B, T, V] logits of a language model
    seq.update(logits.reshape(2, 2, 3), targets.reshape(2, 2))
    assert seq.compute() == pytest.approx(expected)


def test_devices_and_precision_choices():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_precision("fp32", torch.device("cpu")) == "fp32"
    assert resolve_precision("auto", torch.device("cpu")) in ("bf16", "fp32")
    with pytest.raises(ValueError, match="fp16.*GPUs"):
        resolve_precision("fp16", torch.device("cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")


def test_auto_precision_on_a_cpu_follows_the_measured_bf16_speed(monkeypatch):
    from speedkit.core import devices
    cpu = torch.device("cpu")
    monkeypatch.setattr(devices, "cpu_bf16_speedup", lambda threads=None: 0.3)  # emulated bf16: slower
    assert resolve_precision("auto", cpu) == "fp32"
    monkeypatch.setattr(devices, "cpu_bf16_speedup", lambda threads=None: devices.BF16_MIN_SPEEDUP - 0.01)
    assert resolve_precision("auto", cpu) == "fp32"  # a near tie is not worth bf16's rounding
    monkeypatch.setattr(devices, "cpu_bf16_speedup", lambda threads=None: 1.8)
    assert resolve_precision("auto", cpu) == "bf16"
    assert resolve_precision("fp32", cpu) == "fp32"  # asked for by name: never overridden


def test_the_bf16_probe_really_times_this_cpu_and_the_record_keeps_it(tmp_path):
    from speedkit.core.devices import cpu_bf16_speedup
    threads = torch.get_num_threads()
    ratio = cpu_bf16_speedup(threads)
    assert math.isfinite(ratio) and 0.01 < ratio < 100
    assert cpu_bf16_speedup(threads) is ratio  # measured once per process and thread count
    loader = [(torch.randn(8, 4), torch.randint(0, 3, (8,)))]
    auto = Trainer(torch.nn.Linear(4, 3), loader, precision="auto", device="cpu", max_duration="1ba",
                   run_dir=tmp_path, save_checkpoints=False)
    assert auto.record.config["bf16_speedup_measured"] == round(ratio, 3)
    assert auto.record.config["precision_resolved"] == ("bf16" if ratio >= 1.15 else "fp32")
    fixed = Trainer(torch.nn.Linear(4, 3), loader, precision="fp32", device="cpu", max_duration="1ba",
                    run_dir=tmp_path, save_checkpoints=False)
    assert "bf16_speedup_measured" not in fixed.record.config


def test_flop_count_matches_a_linear_layer():
    model = torch.nn.Linear(100, 10, bias=False)
    # Forward 2*100*10 FLOPs per sample; training counts forward + backward as 3x forward.
    assert count_training_flops_per_sample(model, torch.randn(4, 100)) == 3 * 2 * 100 * 10


def test_speed_monitor_reports_throughput_and_fraction_of_peak(tmp_path):
    train, _ = toy_loaders()
    trainer = Trainer(toy_model(), train, max_duration="1ep", device="cpu", run_dir=tmp_path, log_interval=2,
                      save_checkpoints=False)
    record = trainer.fit()
    monitor = next(cb for cb in trainer.state.callbacks if isinstance(cb, SpeedMonitor))
    assert monitor.flops_per_sample == 3 * 2 * (8 * 32 + 32 * 3)
    row = record.steps[-1]
    assert row["throughput/samples_per_s"] > 0
    assert row["throughput/flops_per_s"] == pytest.approx(row["throughput/samples_per_s"] * monitor.flops_per_sample)
    assert 0 < row["throughput/fraction_of_peak"] < 1
    assert record.environment["matmul_peak_flops"] > 1e8


class _MeanOverPositions(torch.nn.Module):
    def forward(self, x):
        return x.mean(1)


def test_flops_follow_the_input_shape_when_it_changes_during_training(tmp_path):
    """Sequence-length warmup and progressive resizing start on small inputs: FLOP/s late in the run count the
    late batches' FLOPs, not the first batch's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8, bias=False), _MeanOverPositions(), torch.nn.Linear(8, 3, bias=False))
    loader = [(torch.randn(8, length, 4), torch.randint(0, 3, (8,))) for length in [4] * 40 + [16] * 40]
    trainer = Trainer(model, loader, max_duration="1ep", device="cpu", run_dir=tmp_path, log_interval=10,
                      save_checkpoints=False)
    record = trainer.fit()
    monitor = next(cb for cb in trainer.state.callbacks if isinstance(cb, SpeedMonitor))
    per_sample = {length: 3 * (2 * 4 * 8 * length + 2 * 8 * 3) for length in (4, 16)}
    assert monitor.flops_per_sample == per_sample[16]
    last = [row for row in record.steps if "throughput/flops_per_s" in row][-1]  # its window: 20 batches of 16
    assert last["throughput/flops_per_s"] == pytest.approx(last["throughput/samples_per_s"] * per_sample[16])


def test_checkpoints_keep_the_newest_few(tmp_path):
    train, _ = toy_loaders()
    trainer = Trainer(toy_model(), train, max_duration="12ba", save_interval="2ba", keep_checkpoints=2,
                      device="cpu", run_dir=tmp_path, run_name="k")
    trainer.fit()
    folder = tmp_path / "k" / "checkpoints"
    assert sorted(p.name for p in folder.glob("ba*.ckpt")) == ["ba000000010.ckpt", "ba000000012.ckpt"]
    assert (folder / "latest.ckpt").read_bytes() == (folder / "ba000000012.ckpt").read_bytes()


def test_rng_state_round_trips_through_a_checkpoint(tmp_path):
    import random

    import numpy as np

    from speedkit.train.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state

    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.randn()  # leaves a cached gaussian in numpy's state
    save_checkpoint(tmp_path / "rng.ckpt", {"rng": rng_state()})
    expected = (random.random(), np.random.randn(3).tolist(), torch.rand(3).tolist())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    set_rng_state(load_checkpoint(tmp_path / "rng.ckpt")["rng"])
    assert (random.random(), np.random.randn(3).tolist(), torch.rand(3).tolist()) == expected
