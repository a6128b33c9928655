"""The prepared GPU check (scripts/gpu_check.py) runs its steps on a CPU at tiny scale, so it cannot rot."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from prerequisites import require

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_check():
    from helpers import load_script

    return load_script("gpu_check")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_a_gpu_it_says_so_and_exits_non_zero(gpu_check, tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path / "out")]) == 2
    assert "no CUDA GPU here" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_its_steps_run_on_a_cpu_and_write_one_results_folder(gpu_check, tmp_path, capsys):
    """The sync step runs in full at tiny scale; the notebook and bench steps are `speedkit notebooks run` and
    `speedkit bench` commands (tested in tests/cli/test_notebooks.py and tests/experiments/test_bench.py;
    minutes each on 2 cores), checked here for what they run, and one stand-in command runs through the
    same runner."""
    require("fashion-mnist")
    require("python-docs")
    out = tmp_path / "check"
    assert gpu_check.main(["--device", "cpu", "--tiny", "--steps", "syncs", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and set(summary["syncs"]) == {"fashion-mnist", "pydocs"}
    for task in summary["syncs"].values():
        assert task["waits_in_quiet_steps"] == 0 and task["fraction_of_peak"] is not None
    assert "host waits" in (out / "summary.md").read_text()
    ran = gpu_check.run_commands([gpu_check.speedkit_command("--help")], out / "commands.log")
    assert ran[0]["exit"] == 0 and "speedkit --help" in (out / "commands.log").read_text()
    # a second check into the same folder is refused before it starts, not after its runs are refused
    before = (out / "summary.json").read_text()
    with pytest.raises(SystemExit):
        gpu_check.main(["--device", "cpu", "--tiny", "--steps", "syncs", "--out", str(out)])
    assert "holds an earlier check" in capsys.readouterr().err and (out / "summary.json").read_text() == before


def test_the_notebook_step_runs_the_gpu_sets_of_00_02_t7_and_t10(gpu_check, tmp_path):
    commands = gpu_check.notebook_commands(tmp_path, tiny=False)
    names = [c[c.index("--only") + 1] for c in commands]
    assert names == ["00_quickstart", "02_vision_benchmark", "t7_gpu_precision_and_compile", "t10_language_model"]
    assert all(c[c.index("--params") + 1] == "gpu" for c in commands)
    for name in names:
        assert (ROOT / "params" / "gpu" / f"{name}.yaml").is_file()
    assert "-p" in commands[1]  # 02 shortened
    bench = gpu_check.bench_commands("cuda", tmp_path, tiny=False)
    assert [c[c.index("--recipes") + 1] + ":" + c[c.index("--baselines") + 1] for c in bench] == \
        ["hot:plain-bf16", "hot:tuned"] and all("gpu" in c for c in bench)


def test_every_command_the_check_runs_is_one_the_cli_accepts(gpu_check, tmp_path):
    """The steps run ``speedkit`` commands in subprocesses, where a renamed flag would only show on a GPU."""
    from speedkit.cli.main import _parser

    for tiny in (False, True):
        commands = [*gpu_check.notebook_commands(tmp_path, tiny), *gpu_check.bench_commands("cuda", tmp_path, tiny)]
        for command in commands:
            assert command[:3] == [sys.executable, "-m", "speedkit"]
            _parser().parse_args(command[3:])  # argparse exits (a test error) on what it does not accept


def test_the_seed_step_runs_resnet50_at_224_and_gpt2_124m_at_1024_on_a_gpu(gpu_check):
    """What the seed step runs on a GPU (the CPU proof at those sizes: tests/tasks/test_seed_scale_step.py)."""
    options = dict((task, opts) for task, opts, _ in gpu_check.SEED_TASKS)
    assert options["imagenet"] == {"image_size": 224, "eval_image_size": 224} and options["gpt2"] == {}
    assert {task: kind for task, _, kind in gpu_check.SEED_TASKS} == {"imagenet": "images_per_s",
                                                                      "gpt2": "tokens_per_s"}
    gpu = gpu_check.SEED_SIZES["gpu"]
    assert gpu["steps"] % gpu["log_interval"] == 0 and gpu["steps"] > gpu["log_interval"]


@pytest.mark.slow
def test_the_seed_step_runs_every_seed_preset_at_tiny_scale_and_reports_throughput(gpu_check, tmp_path, monkeypatch):
    pytest.importorskip("litdata")
    pytest.importorskip("tokenizers")
    monkeypatch.setenv("SPEEDKIT_SHARDS", str(tmp_path / "cache"))
    out = tmp_path / "check"
    assert gpu_check.main(["--device", "cpu", "--tiny", "--steps", "seed", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    seed = summary["seed"]
    assert {name.split(":")[0] for name in seed} == {"imagenet", "gpt2"} and len(seed) >= 8
    for name, result in seed.items():
        assert result["ok"] and result["waits_in_quiet_steps"] == 0, (name, result)
        assert result["images_per_s" if name.startswith("imagenet") else "tokens_per_s"] > 0
        assert result["fraction_of_measured_peak"] > 0
    assert "the seed's workloads" in (out / "summary.md").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the tiny scale is a CPU's")
def test_the_seed_step_with_phases_says_where_each_presets_time_went(gpu_check, tmp_path, monkeypatch):
    pytest.importorskip("litdata")
    pytest.importorskip("tokenizers")
    monkeypatch.setenv("SPEEDKIT_SHARDS", str(tmp_path / "cache"))
    out = tmp_path / "check"
    assert gpu_check.main(["--device", "cpu", "--tiny", "--steps", "seed", "--presets", "imagenet:hot,gpt2:composer",
                           "--phases", "2", "--out", str(out)]) == 0
    seed = json.loads((out / "summary.json").read_text())["seed"]
    assert set(seed) == {"imagenet:hot", "gpt2:composer"}
    for name, result in seed.items():
        phases = result["phases"]
        assert phases["steps"] == 2 and phases["under_torch_profiler"], name
        assert sum(p["share"] for p in phases["phases"].values()) == pytest.approx(1, abs=0.01)
        assert phases["phases"]["forward"]["s"] > 0 and phases["top_operators"], name
    # the composer preset's attention (ALiBi's bias) runs in SDPA's fused kernel, not its math one
    operators = {op["name"] for op in seed["gpt2:composer"]["phases"]["top_operators"]}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in operators
    assert "aten::_scaled_dot_product_attention_math" not in operators
    text = (out / "summary.md").read_text()
    assert "## where the seed presets' time went" in text and "- imagenet:hot: 2 steps" in text

    def broken(*args, **kwargs):
        raise RuntimeError("the profiler broke")

    monkeypatch.setattr("speedkit.callbacks.phase_timer.profile_steps", broken)
    out = tmp_path / "again"  # (into the same --out, the runs' folders would refuse to be replaced)
    assert gpu_check.main(["--device", "cpu", "--tiny", "--steps", "seed", "--presets", "gpt2:composer",
                           "--phases", "2", "--out", str(out)]) == 1  # the check fails ...
    result = json.loads((out / "summary.json").read_text())["seed"]["gpt2:composer"]
    assert result["tokens_per_s"] > 0 and "the profiler broke" in result["phases"]["error"]  # ... its figures kept
    assert "- gpt2:composer: RuntimeError: the profiler broke" in (out / "summary.md").read_text()
