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
