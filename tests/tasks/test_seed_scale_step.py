"""The seed-scale step, proven on a CPU (issue 43 item 5): torchvision ResNet-50 at the presets' published sizes
(224 and 176 px) and GPT-2 124M at 1,024 tokens (the ``gpu`` sizes of tasks ``imagenet`` and ``gpt2``) each run a
few steps with every preset's methods, with no host wait between logging steps and FLOP/s against the measured
peak reported. It runs the GPU throughput check's own parts (``scripts/gpu_throughput.py``'s ``count_syncs`` and
``preset_throughput``), so the check a GPU runs is the one proven here."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

pytest.importorskip("litdata")
pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def gpu_throughput():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # the checks import each other
    import gpu_throughput

    return gpu_throughput


@pytest.fixture(autouse=True)
def cache_here(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEEDKIT_SHARDS", str(tmp_path / "cache"))


def test_mixup_steps_read_nothing_on_the_host(tmp_path):
    """Mixup's Beta weight used to be drawn with ``.item()`` in every step: a host wait on a GPU's stream."""
    from helpers import toy_loaders, toy_model

    from speedkit.callbacks import SyncCounter
    from speedkit.methods import MixUp
    from speedkit.train.trainer import Trainer

    train, _ = toy_loaders()
    counter = SyncCounter(keep_stacks=True)
    Trainer(toy_model(), train, max_duration="6ba", device="cpu", run_dir=tmp_path, log_interval=3,
            methods=[MixUp(alpha=0.2)], callbacks=[counter], save_checkpoints=False).fit()
    quiet = counter.quiet_steps()
    assert quiet and sum(quiet.values()) == 0, counter.report()


@pytest.mark.slow
def test_resnet50_at_224_and_gpt2_124m_at_1024_run_every_preset_without_host_waits(gpu_throughput, tmp_path):
    # the gpu sizes at a CPU's batch, in fp32 (bf16 autocast is emulated on most CPUs); the methods, the
    # sizes and the step are the presets'
    s = dataclasses.replace(gpu_throughput.TINY, task_sizes="gpu", context=1024, presets=gpu_throughput.SEED_PRESETS,
                            vision_batch=2, language_batch=1, warmup=1, steps=1, count_steps=4, profiled_steps=1)
    data = gpu_throughput.make_data(tmp_path / "data", "cpu", s)
    peak = gpu_throughput.measure_peak("cpu", s)["flops_per_s"]
    results = {}
    with gpu_throughput.compile_backend(s.compile_backend):  # the gpu sizes compile; TorchDynamo only, on a CPU
        for preset in s.presets:
            counted = gpu_throughput.count_syncs(preset, data, s, "cpu", tmp_path)
            timed = gpu_throughput.preset_throughput(preset, data, s, "cpu", tmp_path, peak)
            results[preset] = {**timed, "waits_in_quiet_steps": counted["waits_in_quiet_steps"]}
    from speedkit.tasks import TASKS

    assert set(results) == {f"imagenet:{r}" for r in TASKS["imagenet"].recipes} | \
        {f"gpt2:{r}" for r in TASKS["gpt2"].recipes}
    for name, result in results.items():
        assert result["status"] == "stopped" and result["nothing_attached"], name  # after its timed step
        assert result["waits_in_quiet_steps"] == 0, name
        assert result["flops_per_sample"] > 0 and 0 < result["fraction_of_peak"], name
    assert all(results[f"imagenet:{r}"]["samples_per_s"] > 0 for r in TASKS["imagenet"].recipes)
    assert all(results[f"gpt2:{r}"]["tokens_per_s"] > 0 for r in TASKS["gpt2"].recipes)
    config = TASKS["gpt2"].model("gpt2-124m").config  # GPT-2 124M's sizes, the shards' vocabulary
    assert (config.n_layer, config.n_head, config.n_embd, config.block_size) == (12, 12, 768, 1024)
    # each preset at its published size, as the GPU check runs it: the baselines at 224 px, Composer's recipes at 176
    assert TASKS["imagenet"].models[0] == "resnet50"
    assert "at 224 px (baseline, plain-bf16) and 176 px (mild, medium, hot)" in TASKS["imagenet"].summary
