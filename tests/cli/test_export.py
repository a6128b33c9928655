"""Export: a run's weights read back by safetensors' and torch's own loaders into a fresh model, which then
computes what the trained model computed (EMA/SWA averages included, and after surgery)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import toy_loaders, toy_model
from prerequisites import import_or_missing
from torch.utils.data import DataLoader, TensorDataset

import speedkit.functional as sf
from speedkit import Trainer
from speedkit.cli.export import export_weights
from speedkit.cli.main import main as cli
from speedkit.methods import EMA, SWA, BlurPool, ChannelsLast, IdentityInit, SqueezeExcite
from speedkit.models import get_model
from speedkit.train.checkpoint import load_checkpoint, read

SAFETENSORS_INSTALL = "pip install 'torch-speedkit[export]'"


def read_back(result) -> dict:
    if result.format == "safetensors":
        return import_or_missing("safetensors.torch", SAFETENSORS_INSTALL).load_file(result.path)
    return torch.load(result.path, weights_only=True)


def fit(tmp_path, model, methods=(), loaders=None, **kwargs):
    train, test = loaders or toy_loaders()
    trainer = Trainer(model, train, eval_dataloader=test, max_duration="2ep", eval_interval="1ep",
                      methods=list(methods), device="cpu", run_dir=tmp_path, run_name="run", **kwargs)
    trainer.fit()
    return trainer, tmp_path / "run"


def same_outputs(a: torch.nn.Module, b: torch.nn.Module, x: torch.Tensor) -> None:
    a.eval(), b.eval()
    with torch.no_grad():
        torch.testing.assert_close(a(x), b(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("format", ["safetensors", "pt"])
def test_exported_weights_load_into_a_fresh_model_and_compute_the_same(tmp_path, format):
    trainer, folder = fit(tmp_path, toy_model())
    result = export_weights(folder, format=format)
    assert result.path == folder / f"model.{format}" and result.weights == "model"

    fresh = toy_model(seed=1)
    fresh.load_state_dict(read_back(result))  # strict: every name present, no extra ones
    same_outputs(trainer.state.model, fresh, torch.randn(16, 8))


def test_a_finished_ema_run_exports_its_average_which_the_model_holds_after_fit_end(tmp_path):
    trainer, folder = fit(tmp_path, toy_model(), [EMA(half_life="4ba")])
    ema = trainer.state.methods[0].ema
    exported = read_back(export_weights(folder))
    for name, tensor in exported.items():
        torch.testing.assert_close(tensor, ema[name], rtol=0, atol=0)


def test_a_checkpoint_from_before_fit_end_exports_the_average_not_the_raw_weights(tmp_path):
    # Interval checkpoints hold the raw weights with the averages beside them; FIT_END has not swapped them in.
    fit(tmp_path, toy_model(), [EMA(half_life="4ba"), SWA(swa_start=0.25, update_interval=2)], save_interval="8ba")
    mid_run = tmp_path / "run" / "checkpoints" / "ba000000008.ckpt"
    payload = load_checkpoint(mid_run)
    assert payload["methods"]["swa"]["average"]  # the case this test is about: an average exists mid-run

    result = export_weights(mid_run, out=tmp_path / "mid.safetensors")
    assert result.weights == "swa"  # SWA wins over EMA, as at FIT_END
    exported = read_back(result)
    raw = payload["model"]
    assert any(not torch.equal(exported[k], raw[k]) for k in raw)
    for name, tensor in exported.items():
        torch.testing.assert_close(tensor, payload["methods"]["swa"]["average"][name], rtol=0, atol=0)

    ema = read_back(export_weights(mid_run, out=tmp_path / "ema.pt", format="pt", weights="ema"))
    for name, tensor in ema.items():
        torch.testing.assert_close(tensor, payload["methods"]["ema"]["ema"][name], rtol=0, atol=0)
    with pytest.raises(ValueError, match="no swa average"):
        export_weights(fit(tmp_path / "plain", toy_model())[1], weights="swa")


def image_loaders():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 1, 16, 16, generator=g), torch.randint(0, 3, (32,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True), DataLoader(TensorDataset(x, y), batch_size=32)


def small_cnn():
    torch.manual_seed(0)
    return get_model("resnet8", num_classes=3, in_channels=1, width=8)


def test_after_surgery_a_fresh_model_with_the_same_methods_applied_loads_the_weights_exactly(tmp_path):
    methods = [SqueezeExcite(min_channels=8, latent_channels=4), BlurPool(), ChannelsLast(), IdentityInit()]
    trainer, folder = fit(tmp_path, small_cnn(), methods, loaders=image_loaders())
    result = export_weights(folder)
    # not the memory layout, nor identity_init, which sets initial values only
    assert [m["name"] for m in result.model_methods] == ["blurpool", "squeeze_excite"]
    assert "apply the same methods" in result.instructions()

    fresh = small_cnn()
    with pytest.raises(RuntimeError, match="Unexpected key"):  # squeeze_excite's layers have nowhere to go
        fresh.load_state_dict(read_back(result))
    for method in result.model_methods:  # the recipe the result states: functional forms, the run's parameters
        getattr(sf, f"apply_{method['name']}")(fresh, **method["params"])
    fresh.load_state_dict(read_back(result))
    same_outputs(trainer.state.model, fresh, torch.randn(4, 1, 16, 16))


def test_the_cli_exports_a_run_and_refuses_a_folder_without_a_checkpoint(tmp_path, capsys):
    _, folder = fit(tmp_path, toy_model())
    assert cli(["export", str(folder), "--format", "pt", "--out", str(tmp_path / "w.pt")]) == 0
    assert "wrote" in capsys.readouterr().out
    fresh = toy_model(seed=1)
    fresh.load_state_dict(torch.load(tmp_path / "w.pt", weights_only=True))

    (tmp_path / "empty").mkdir()
    assert cli(["export", str(tmp_path / "empty")]) == 2
    assert "has no checkpoint" in capsys.readouterr().err


def test_tied_weights_are_written_under_both_names_and_stay_tied_in_the_fresh_model(tmp_path):
    # safetensors refuses tensors that share memory; the GPT ties its embedding and output weights
    from speedkit.record.runs import RunRecord
    from speedkit.train.checkpoint import save_checkpoint

    torch.manual_seed(0)
    trained = get_model("gpt-nano")
    with torch.no_grad():
        trained.lm_head.weight.add_(0.5)  # "training" moved the shared tensor
    checkpoint = save_checkpoint(tmp_path / "ba000000001.ckpt", {
        "model": trained.state_dict(), "methods": {}, "record": RunRecord(status="completed").to_json()})
    exported = read_back(export_weights(checkpoint, out=tmp_path / "gpt.safetensors"))
    assert {"transformer.wte.weight", "lm_head.weight"} <= set(exported)

    torch.manual_seed(1)
    fresh = get_model("gpt-nano")
    fresh.load_state_dict(exported)
    assert fresh.lm_head.weight is fresh.transformer.wte.weight  # still one tensor
    same_outputs(trained, fresh, torch.randint(0, 256, (2, 16)))


# -- a run folder exports its own checkpoint -----------------------------------------------------------------
CHECKOUT = Path(__file__).resolve().parents[2]


def speedkit_command(*args: str, cwd: Path) -> None:
    """``python -m speedkit ARGS`` in a child process, running this checkout's code."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CHECKOUT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "speedkit", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"speedkit {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"


def write_noise_images(root: Path, per_class: int = 10, size: int = 8) -> Path:
    """Two class folders of random grey PNGs: enough for an image-folder run of a few batches."""
    from PIL import Image

    noise = np.random.default_rng(0)
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = noise.integers(0, 256, (size, size), dtype=np.uint8)
            Image.fromarray(pixels, mode="L").save(root / name / f"{i}.png")
    return root


def test_export_of_a_copied_run_folder_writes_that_folders_weights_not_the_originals(tmp_path):
    """``cp -a runs/A runs/B``, train A again, ``speedkit export runs/B``: B's own weights (issue 25, item 4)."""
    data = write_noise_images(tmp_path / "images")
    train = ["train", "--task", "image-folder", "--data", str(data), "--image-size", "8", "--duration", "2ba",
             "--batch-size", "8", "--device", "cpu", "--run-dir", "runs", "--run-name", "A", "--no-progress"]
    speedkit_command(*train, cwd=tmp_path)
    runs = tmp_path / "runs"
    shutil.copytree(runs / "A", runs / "B")
    shutil.rmtree(runs / "A")  # A trained again from scratch: other weights under the same paths
    speedkit_command(*train, "--seed", "1", cwd=tmp_path)
    speedkit_command("export", "runs/B", "--format", "pt", cwd=tmp_path)

    exported = torch.load(runs / "B" / "model.pt", weights_only=True)
    own = read(runs / "B" / "checkpoints" / "latest.ckpt").model
    original = read(runs / "A" / "checkpoints" / "latest.ckpt").model
    assert exported.keys() == own.keys()
    for name, tensor in exported.items():
        assert torch.equal(tensor, own[name]), name
    assert any(not torch.equal(exported[name], original[name]) for name in exported)  # A's are other weights


@pytest.fixture
def first_weights():
    """An averaging method of one's own, registered for the test: it ends the run with the weights it started from,
    and says so only through the method's own interface (Method.averaged_weights, ends_with_average)."""
    from speedkit.core import Event, Method
    from speedkit.core.method import MethodCard
    from speedkit.methods import register_method, unregister_method
    from speedkit.methods.ema import init_ema, load_weights

    class FirstWeights(Method):
        CARD = MethodCard(name="first_weights", summary="End with the starting weights.", domain="any",
                          events=(Event.FIT_START, Event.FIT_END), reads=("model",), writes=("eval",))

        def __init__(self):
            super().__init__()
            self.first = None

        def apply(self, event, state, logger):
            if event is Event.FIT_START and self.first is None:
                self.first = init_ema(state.model)
            elif event is Event.FIT_END:
                load_weights(state.model, self.first)

        def averaged_weights(self):
            return self.first

        def ends_with_average(self):
            return True

        def state_dict(self):
            return {} if self.first is None else {"first": self.first}

        def load_state_dict(self, state):
            self.first = state.get("first")

    register_method(FirstWeights)
    try:
        yield FirstWeights
    finally:
        unregister_method("first_weights")


def test_an_averaging_method_of_ones_own_is_exported_through_its_own_interface(tmp_path, first_weights):
    """Export asks a method for its average (Method.averaged_weights, ends_with_average), so a registered method
    that keeps one is exported like EMA and SWA, with no change to export."""
    start = {k: v.clone() for k, v in toy_model().state_dict().items()}
    fit(tmp_path, toy_model(), [first_weights()], save_interval="8ba")
    mid_run = tmp_path / "run" / "checkpoints" / "ba000000008.ckpt"
    for weights in ("auto", "first_weights"):
        result = export_weights(mid_run, out=tmp_path / f"{weights}.pt", format="pt", weights=weights)
        assert result.weights == "first_weights"
        for name, tensor in read_back(result).items():
            assert torch.equal(tensor, start[name]), name


def test_the_cli_takes_a_registered_averaging_methods_name_for_weights(tmp_path, capsys, first_weights):
    """`speedkit export --weights` is not a fixed list: any averaging method export_weights knows is asked for by
    name, one's own included, and a name it does not know gets export_weights' one line naming the known ones."""
    start = {k: v.clone() for k, v in toy_model().state_dict().items()}
    fit(tmp_path, toy_model(), [first_weights()], save_interval="8ba")
    mid_run = tmp_path / "run" / "checkpoints" / "ba000000008.ckpt"
    out = tmp_path / "first.pt"
    assert cli(["export", str(mid_run), "--format", "pt", "--out", str(out), "--weights", "first_weights"]) == 0
    assert f"wrote {out} (first_weights weights from {mid_run})" in capsys.readouterr().out
    for name, tensor in torch.load(out, weights_only=True).items():
        assert torch.equal(tensor, start[name]), name

    assert cli(["export", str(mid_run), "--weights", "first_weight"]) == 2
    error = capsys.readouterr().err
    assert "weights must be 'auto', 'model' or an averaging method's name" in error
    assert "first_weights" in error and "got 'first_weight'" in error
