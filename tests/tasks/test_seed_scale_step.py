"""The seed-scale step, proven on a CPU (issue 43 item 5): torchvision ResNet-50 at 224 px and GPT-2 124M at 1,024
tokens (the ``gpu`` profiles of tasks ``imagenet`` and ``gpt2``) each run a few steps with every preset's methods,
with no host wait between logging steps and FLOP/s against the measured peak reported. It runs the GPU check's
own step (``scripts/gpu_check.py``'s ``seed_check``), so the check a GPU runs is the one proven here."""
from __future__ import annotations


import pytest

pytest.importorskip("litdata")
pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def gpu_check():
    from helpers import load_script

    return load_script("gpu_check")


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
def test_resnet50_at_224_and_gpt2_124m_at_1024_run_every_preset_without_host_waits(gpu_check, tmp_path):
    data = gpu_check.make_seed_data(tmp_path / "data", images_per_class=2, classes=3, docs=6, words_per_doc=1500)
    # fp32: bf16 autocast is emulated on most CPUs; the methods, the sizes and the step are the presets'
    results = gpu_check.seed_check("cpu", tmp_path / "out", "gpu", sizes=gpu_check.SEED_SIZES["cpu"], data=data,
                                   precision="fp32")
    from speedkit.tasks import TASKS

    assert set(results) == {f"imagenet:{r}" for r in TASKS["imagenet"].recipes} | \
        {f"gpt2:{r}" for r in TASKS["gpt2"].recipes}
    for name, result in results.items():
        assert result["status"] == "completed", name
        assert result["waits_in_quiet_steps"] == 0, name
        assert result["flops_per_s"] > 0 and 0 < result["fraction_of_measured_peak"], name
        assert "matmul" in result["peak"]
    assert all(results[f"imagenet:{r}"]["images_per_s"] > 0 for r in TASKS["imagenet"].recipes)
    assert all(results[f"gpt2:{r}"]["tokens_per_s"] > 0 for r in TASKS["gpt2"].recipes)
    config = TASKS["gpt2"].model("gpt2-124m").config  # GPT-2 124M's sizes, the shards' vocabulary
    assert (config.n_layer, config.n_head, config.n_embd, config.block_size) == (12, 12, 768, 1024)
    assert TASKS["imagenet"].models[0] == "resnet50" and "at 224 px, evaluated at 224 px" in TASKS["imagenet"].summary
