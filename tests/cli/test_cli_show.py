"""Issue 41.10's rough edges at the command line: a method's card as text with its class, warnings as one
``speedkit: warning:`` line, "did you mean" for a misspelt task, and ``speedkit env`` on a torchvision that
does not import."""
from __future__ import annotations

import pytest

from speedkit.cli import env
from speedkit.cli.main import main


def test_a_methods_card_reads_as_text_with_the_class_to_import(capsys):
    assert main(["methods", "muon"]) == 0
    out = capsys.readouterr().out
    assert "class:        speedkit.methods.Muon(lr=0.02" in out and "null" not in out and "{" not in out
    assert "lr (float, default 0.02 in [0.001, 0.2]): Muon's learning rate" in out
    assert main(["methods", "low_precision_layernorm"]) == 0
    assert "speedkit.methods.LowPrecisionLayerNorm(" in capsys.readouterr().out  # the name to import
    assert main(["methods", "muon", "--json"]) == 0
    assert '"name": "muon"' in capsys.readouterr().out


def test_each_methods_card_names_the_class_that_spells_the_method():
    from speedkit.cli.show import method_card_text
    from speedkit.methods import METHODS

    for cls in METHODS:
        assert f"  class:        speedkit.methods.{cls.__name__}(" in method_card_text(cls.CARD.name), cls.CARD.name
    assert "speedkit.methods.ReLUSquared(" in method_card_text("relu_squared")
    assert "speedkit.methods.QKNorm(" in method_card_text("qk_norm")


def test_warnings_print_as_one_speedkit_line():
    """Through the command's main(): whatever warns while a command runs prints as one line."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-W", "always", "-c",
                           "import warnings, sys\n"
                           "from speedkit.cli import main as cli\n"
                           "cli._dispatch = lambda args, argv: warnings.warn('ema: the fix is X') or 0\n"
                           "sys.exit(cli.main(['methods']))"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "speedkit: warning: ema: the fix is X\n"  # no UserWarning, no file:line, no source line


def test_a_misspelt_task_gets_a_did_you_mean(capsys):
    assert main(["train", "--task", "fashon-mnist"]) == 2
    assert "unknown task 'fashon-mnist' (did you mean 'fashion-mnist'?)" in capsys.readouterr().err


def test_env_says_when_an_installed_torchvision_does_not_import(monkeypatch):
    pytest.importorskip("torchvision")
    monkeypatch.setitem(env.IMPORT_CHECKED, "torchvision", "speedkit_no_such_module_here")
    assert "(installed, but does not import: ModuleNotFoundError" in env._version("torchvision")
    monkeypatch.setitem(env.IMPORT_CHECKED, "torchvision", "torchvision")
    assert "does not import" not in env._version("torchvision")


# -- a run says what it trains (issue 55.11) ------------------------------------------------------------
def _what_trains(out: str) -> list[str]:
    """The block a run starts with, checked to come before its first evaluation line."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("what trains: "))
    first_eval = next((i for i, line in enumerate(lines) if line.startswith("[ep ")), len(lines))
    assert start < first_eval, out
    return lines[start:start + 6]


@pytest.mark.prerequisite("fashion-mnist")
def test_a_run_starts_by_saying_what_it_trains_and_the_record_holds_the_same(tmp_path, capsys, monkeypatch):
    """``speedkit train``'s first lines: the model with its size, the input size used, the precision as resolved,
    the methods, the data and its share, the budget; drawn from the record, which holds the same."""
    from speedkit.record.runs import RunRecord

    monkeypatch.chdir(tmp_path)
    assert main(["train", "--recipe", "plain", "--duration", "2ba", "--data-fraction", "0.01", "--eval-fraction",
                 "0.02", "--batch-size", "32", "--no-progress", "--run-name", "r", "--precision", "fp32"]) == 0
    block = _what_trains(capsys.readouterr().out)
    record = RunRecord.load(tmp_path / "runs" / "r" / "record.json")
    assert block[0] == f"what trains: resnet8 ({record.config['parameters']:,} parameters), task fashion-mnist, recipe plain"
    assert block[1] == "  inputs:    28 px" and record.config["inputs"] == {"train": 28, "eval": 28, "unit": "px"}
    assert block[2] == "  precision: fp32"
    assert block[4] == "  data:      task fashion-mnist's own data, training on a 0.01 share of it, evaluating on a 0.02 share"
    assert block[5].startswith("  budget:    2ba at batch 32")
    assert "\n".join(block) == record.what_trains()


@pytest.mark.prerequisite("fashion-mnist")
def test_a_torch_dataloaders_input_size_is_read_from_its_first_sample(tmp_path):
    """The hand-written baseline's torchvision DataLoader states no size: its first sample, as its transforms make
    it, gives the size it trains at."""
    from speedkit.tasks import make_trainer

    trainer = make_trainer("fashion-mnist", "baseline", duration="2ba", data_fraction=0.01, eval_fraction=0.02,
                           run_dir=str(tmp_path))
    assert trainer.record.config["inputs"] == {"train": 28, "eval": 28, "unit": "px"}
    assert "  inputs:    28 px" in trainer.record.what_trains().splitlines()


def test_a_seed_task_rehearsal_says_the_sizes_it_trains_at_and_the_method_they_turned_off(tmp_path, capsys,
                                                                                               monkeypatch):
    """imagenet's cpu rehearsal of mild trains at 64 px, evaluates at 80 px and drops progressive resizing: the
    start of the run and its record say so (the published 176/224 px appear nowhere)."""
    pytest.importorskip("litdata")
    from streaming_data import make_image_folder

    from speedkit.record.runs import RunRecord

    monkeypatch.setenv("SPEEDKIT_SHARDS", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "imagenet"
    make_image_folder(data / "train", per_class=5, seed=0)
    make_image_folder(data / "val", per_class=2, seed=1)
    assert main(["train", "--task", "imagenet", "--data", str(data), "--sizes", "cpu", "--recipe", "mild",
                 "--batch-size", "4", "--duration", "1ba", "--no-progress", "--run-name", "mild"]) == 0
    block = "\n".join(_what_trains(capsys.readouterr().out))
    config = RunRecord.load(tmp_path / "runs" / "mild" / "record.json").config
    assert config["inputs"] == {"train": 64, "eval": 80, "unit": "px"}
    assert "inputs:    64 px (evaluated at 80 px)" in block and "resnet18" in block
    assert list(config["switched_off"]) == ["progressive_resizing"]
    assert "off: progressive_resizing (progressive resizing off: its smallest image, 88 px, is not below 64 px)" in block


def test_precision_says_why_it_resolved_to_what_it_did():
    """A plain-bf16 preset that imagenet's cpu sizes run as auto, on a CPU whose bf16 is slow: fp32, and why."""
    from speedkit.record.runs import RunRecord

    record = RunRecord(config={"task": "imagenet", "precision": "auto", "precision_resolved": "fp32",
                               "precision_published": "bf16", "bf16_speedup_measured": 0.62, "device": "cpu"})
    line = next(line for line in record.what_trains().splitlines() if "precision:" in line)
    assert line == ("  precision: fp32 (the preset states bf16; task imagenet runs it as auto here; this CPU has no "
                    "fast bf16: bf16 autocast measured at 0.62x fp32's speed)")
    record.config.update(precision="bf16", precision_resolved="bf16", precision_published=None)
    record.config.pop("bf16_speedup_measured")
    assert "  precision: bf16" in record.what_trains().splitlines()


def test_one_data_set_has_one_data_fingerprint(tmp_path, capsys, monkeypatch):
    """``speedkit data info`` on shards, a run on those shards and a run on the folder they were prepared from report
    the same data_fingerprint; the shards' own fingerprint is a field of its own."""
    pytest.importorskip("litdata")
    import re

    from streaming_data import make_image_folder

    from speedkit.record.runs import RunRecord

    monkeypatch.chdir(tmp_path)
    raw, shards = make_image_folder(tmp_path / "photos", per_class=6), tmp_path / "shards"
    assert main(["data", "prepare", str(raw), "--out", str(shards), "--short-side", "24"]) == 0
    capsys.readouterr()
    assert main(["data", "info", str(shards)]) == 0
    info = capsys.readouterr().out
    shown = re.search(r"data_fingerprint (\w+) .*shards_fingerprint (\w+)", info)
    assert shown, info
    common = ["--duration", "1ba", "--batch-size", "4", "--no-progress"]
    assert main(["train", "--task", "image-folder", "--data", str(shards), "--run-name", "on-shards", *common]) == 0
    assert main(["train", "--task", "image-folder", "--data", str(raw), "--image-size", "16", "--run-name", "on-raw",
                 *common]) == 0
    out = capsys.readouterr().out
    on_shards, on_raw = (RunRecord.load(tmp_path / "runs" / name / "record.json").config["data"]
                         for name in ("on-shards", "on-raw"))
    assert on_shards["fingerprint"] == on_raw["fingerprint"] == shown.group(1)
    assert on_shards["shards_fingerprint"] == shown.group(2) and "shards_fingerprint" not in on_raw
    assert out.count(f"data_fingerprint {shown.group(1)}") == 2  # each run's first lines
