"""The two prepared GPU checks (scripts/gpu_check.py, gpu_throughput.py, gpu_time_to_target.py) run every part on a
CPU at tiny scale, so they cannot rot between leases of a GPU; and their timed runs are clean: nothing attached to
torch while timed, compiled runs really compiled."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from prerequisites import import_or_missing, require

ROOT = Path(__file__).resolve().parents[2]
TIMED = ("step_s", "instruments_at_timing", "nothing_attached")


@pytest.fixture(scope="module")
def gpu_check():
    from helpers import load_script

    sys.path.insert(0, str(ROOT / "scripts"))  # the checks import each other as the scripts folder's modules
    return load_script("gpu_check")


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEEDKIT_GPU_CHECK_WORK", str(tmp_path / "work"))
    monkeypatch.setenv("SPEEDKIT_SHARDS", str(tmp_path / "shard-cache"))
    monkeypatch.delenv("OUT", raising=False)
    yield tmp_path
    # the checks compile many models (GPTs among them) and leave their graphs cached; a later test's compile of the
    # same code would meet TorchDynamo's recompile limit
    torch._dynamo.reset()


def assert_clean_timing(run: dict, where: str) -> None:
    """A timed run: timed steps, and no dispatch mode, torch-function mode or profiler while they ran."""
    assert run["timed_steps"] >= 1 and run["step_s"] > 0, where
    assert run["nothing_attached"], (where, run["instruments_at_timing"])
    assert run["instruments_at_timing"] == {"torch_function_mode": False, "dispatch_modes": [], "profiler": False}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_a_gpu_it_says_so_and_exits_non_zero(gpu_check, work, capsys):
    assert gpu_check.main(["throughput", "--out", str(work / "out")]) == 2
    assert "no CUDA GPU here" in capsys.readouterr().err
    assert not (work / "out").exists()


def test_the_throughput_check_runs_every_part_on_a_cpu_with_clean_timed_runs(gpu_check, work):
    import_or_missing("litdata")
    import_or_missing("tokenizers")
    out = work / "out"
    assert gpu_check.main(["throughput", "--device", "cpu", "--tiny", "--out", str(out)]) == 0
    result = json.loads((out / "throughput.json").read_text())
    assert result["finished"] and result["ok"] and result["tiny"] and result["code"]["code_hash"]
    parts = result["parts"]
    assert list(parts) == ["peak", "data", "vision-compiled", "language-compiled", "preset imagenet:hot",
                           "preset gpt2:hot", "vision-eager", "language-eager", "loader", "counts", "muon"]
    assert parts["peak"]["flops_per_s"] > 0 and parts["data"]["vocab_size"] > 256
    for name in ("vision-eager", "vision-compiled", "language-eager", "language-compiled"):
        compiled = name.endswith("compiled")
        for size, runs in parts[name]["sizes"].items():
            for side in ("bare", "trainer"):
                run = runs[side]
                assert_clean_timing(run, f"{name} {size} {side}")
                assert run["samples_per_s"] > 0 and run["fraction_of_peak"] > 0
                assert (run["dynamo"]["frames"] > 0) == compiled, (name, size, side, run["dynamo"])
        if name.startswith("language"):  # the tiny vocabulary is not a multiple of 64, as GPT-2's 50,257 is not
            vocab = parts[name]["vocab"]
            assert vocab["vocab_size"] % 64 and vocab["head_rows"] % 64 == 0 and vocab["head_rows"] > vocab["vocab_size"]
        if name.startswith("vision"):  # 176 -> 224 on a GPU: what a new input shape costs
            new_shape = parts[name]["new_shape"]
            assert new_shape["cost_s"] is not None
            assert new_shape["recompiled_graphs"] == (1 if compiled else None)
    compiled_trainer = next(iter(parts["vision-compiled"]["sizes"].values()))["trainer"]
    assert compiled_trainer["compile_s"] > 0  # the Trainer's TorchCompile reported its compile apart
    loader = parts["loader"]
    assert loader["cpu_workers"]["images_per_s"] > 0 and not loader["cpu_workers"]["decode_on_device"]
    assert "skipped" in loader["task_loader_on_device"] and "skipped" in loader["gpu_decode"]
    import gpu_throughput  # the GPU's decode path, run on the CPU so that it cannot rot either

    decoded = gpu_throughput.decode_batches(Path(parts["data"]["image_folder"]) / "train", gpu_throughput.TINY, "cpu")
    assert decoded["images_per_s"] > 0 and decoded["batch_shape"] == [4, 3, 32, 32]
    for preset in ("preset imagenet:hot", "preset gpt2:hot"):
        assert_clean_timing(parts[preset], preset)
        assert parts[preset]["samples_per_s"] > 0 and parts[preset]["fraction_of_peak"] > 0
        assert parts[preset]["status"] == "stopped"  # after its timed steps, on its own schedule
        assert parts[preset]["evaluations"] == 0  # no final evaluation (compiled, a graph of its own)
        assert parts[preset]["kernels_per_step"]["kernels"] > 0  # profiled after the timed steps, apart
        # compiled as at the gpu sizes (here with the eager backend), in whole graphs
        assert parts[preset]["dynamo"]["frames"] > 0 and parts[preset]["dynamo"]["graph_breaks"] == 0, preset
        assert "torch_compile" in parts[preset]["methods"]
    assert parts["preset gpt2:hot"]["tokens_per_s"] > 0
    for preset, counted in parts["counts"]["presets"].items():  # counted apart, in runs of their own
        assert counted["steps"] >= 3 and "waits_in_quiet_steps" in counted and "by_kind" in counted, preset
        ops, launches = counted["quiet_step_ops"], counted["quiet_step_launches"]
        assert ops and ops.keys() == launches.keys() and all(0 < launches[b] < ops[b] for b in ops), preset
    for model, plans in parts["muon"]["models"].items():  # ResNet-8's ten filters, each of a shape of its own
        for plan in ("planned", "by_shape", "one_batch"):
            assert_clean_timing(plans[plan], f"muon {model} {plan}")
        assert plans["one_batch"]["batches"] <= plans["planned"]["batches"] <= plans["by_shape"]["batches"], model
        compiled = plans["planned_compiled"]  # the update as torch_compile runs it, one graph a plan
        assert_clean_timing(compiled, f"muon {model} compiled")
        assert compiled["batches"] == plans["planned"]["batches"] and "dynamo" not in plans["planned"]
        assert compiled["dynamo"]["unique_graphs"] == 1 and compiled["dynamo"]["graph_breaks"] == 0, model
    assert parts["muon"]["models"]["resnet8"]["by_shape"]["batches"] == 10
    assert "- **preset gpt2:hot** (" in (out / "throughput.md").read_text()
    assert result["unmet"] == {}  # no graph break, no host wait in a quiet step (no baseline here to hold ops to)
    # the eager backend the tiny check compiled with is torch's default again once it is done
    assert "backend" not in getattr(torch.nn.Module.__dict__["compile"], "keywords", {})
    assert "backend" not in getattr(torch.compile, "keywords", {})


def test_a_rerun_on_a_warm_machine_reuses_the_data_it_made_and_makes_other_settings_anew(gpu_check, work):
    import dataclasses

    import_or_missing("litdata")
    import_or_missing("tokenizers")
    import gpu_throughput

    folder = work / "made"
    first = gpu_throughput.make_data(folder, "cpu", gpu_throughput.TINY)
    shards = sorted((folder / "image-shards").iterdir())
    again = gpu_throughput.make_data(folder, "cpu", gpu_throughput.TINY)  # prepare would refuse JPEGs made anew
    assert again["reused"] and again["imagenet"] == first["imagenet"] and again["gpt2"] == first["gpt2"]
    assert sorted((folder / "image-shards").iterdir()) == shards
    other = gpu_throughput.make_data(folder, "cpu", dataclasses.replace(gpu_throughput.TINY, images=30))
    assert "reused" not in other and other["jpegs"] == 30


def test_a_counter_attached_while_timing_is_seen(gpu_check):
    """What the checks record at timing time is what is attached: a SyncCounter shows as a dispatch mode."""
    from speedkit.callbacks import SyncCounter

    clock = gpu_check.StepClock("cpu", warmup=1)
    with SyncCounter():
        for _ in range(3):
            torch.ones(2).sum()
            clock.tick()
    timed = clock.result()
    assert not timed["nothing_attached"] and timed["instruments_at_timing"]["dispatch_modes"]
    clean = gpu_check.StepClock("cpu", warmup=1)
    for _ in range(3):
        clean.tick()
    assert clean.result()["nothing_attached"]


def test_a_preset_that_fails_while_profiled_leaves_no_profiler_on_for_the_parts_after_it(gpu_check, tmp_path,
                                                                                          monkeypatch):
    import importlib

    from helpers import toy_loaders, toy_model

    from speedkit.core.engine import Callback
    from speedkit.train.trainer import Trainer

    throughput = importlib.import_module("gpu_throughput")  # as gpu_check imports it, from the scripts folder

    class FailsWhileProfiled(Callback):
        def batch_end(self, state, logger):
            if torch._C._autograd._profiler_enabled():
                raise RuntimeError("a step failed while it was profiled")

    def toy_trainer(preset, data, s, device, work, callbacks, run_name, log_interval=10_000, compiled=False):
        return Trainer(toy_model(), toy_loaders()[0], max_duration="20ba", device="cpu", run_dir=work / run_name,
                       save_checkpoints=False, callbacks=[*callbacks, FailsWhileProfiled()])

    monkeypatch.setattr(throughput, "preset_trainer", toy_trainer)
    with pytest.raises(RuntimeError, match="failed while it was profiled"):
        throughput.preset_throughput("toy:preset", {}, throughput.TINY, "cpu", tmp_path, None)
    assert not torch._C._autograd._profiler_enabled()


def test_the_time_to_target_check_runs_every_part_on_a_cpu(gpu_check, work, monkeypatch):
    require("fashion-mnist")
    require("python-docs")
    import_or_missing("litdata")
    import_or_missing("tokenizers")
    import gpu_throughput as throughput  # (scripts/ is on sys.path: the gpu_check fixture)

    from speedkit.data.streaming.prepare import prepare_images

    # a tiny shard set, as the carried one is for a GPU
    throughput.write_jpegs(work / "images" / "train", 12, 2, (40, 64), "cpu", seed=0)
    throughput.write_jpegs(work / "images" / "val", 4, 2, (40, 64), "cpu", seed=1)
    prepare_images(work / "images", work / "imagenet-shards", short_side=48, progress=False)
    monkeypatch.setenv("SPEEDKIT_GPU_CHECK_IMAGENET", str(work / "imagenet-shards"))
    out = work / "out"
    assert gpu_check.main(["time-to-target", "--device", "cpu", "--tiny", "--out", str(out)]) == 0
    parts = json.loads((out / "time-to-target.json").read_text())["parts"]
    assert list(parts) == ["fashion-mnist", "pydocs", "gpt2", "imagenet"]
    for task, baseline in (("fashion-mnist", "plain-bf16"), ("pydocs", "tuned")):
        assert parts[task]["ok"] and set(parts[task]["arms"]) == {baseline, "hot"}, parts[task]
        assert parts[task]["seeds"] == [0] and parts[task]["target"]["metric"]
        assert "--recipes hot" in parts[task]["command"] and f"--baselines {baseline}" in parts[task]["command"]
        assert "--profile gpu" in parts[task]["command"]  # the device's profile, compiled arms and all
    assert parts["fashion-mnist"]["arms"]["plain-bf16"]["compile_s"][0] > 0  # the gpu profile compiles it (a seed)
    arm = parts["fashion-mnist"]["arms"]["plain-bf16"]  # the time to target with and without its compile
    reached, compiling = arm["time_to_target_s"][0], arm["compile_s"][0]
    less = parts["fashion-mnist"]["time_to_target_less_compile_s"]["plain-bf16"][0]
    assert less == (None if reached is None else pytest.approx(reached - compiling))
    assert len(parts["fashion-mnist"]["speedup_less_compile_by_seed"]) == 1
    for task, baseline, recipe in (("gpt2", "baseline", "hot"), ("imagenet", "plain-bf16", "mild")):
        part = parts[task]
        assert part["ok"] and set(part["arms"]) == {baseline, recipe} and part["rule"], part
        assert part["arms"][baseline]["time_to_target_s"] is not None  # the baseline holds its own target
        assert all(arm["status"] == "completed" for arm in part["arms"].values())
    assert parts["gpt2"]["corpus"]["vocab_size"] > 256
    for task in ("gpt2", "imagenet"):  # compiled as at the gpu sizes
        assert all("torch_compile" in arm["methods"] for arm in parts[task]["arms"].values()), task


def test_the_devices_stand_ins_for_boto3_let_litdata_stream_local_shards(gpu_check, work):
    """The device lacks boto3, which litdata imports for its S3 client; carrying botocore would cost 17 MiB of a
    call's 64. scripts/gpu_check.sh writes stand-ins there instead: local shards stream through them, and any
    use of S3 raises, naming why."""
    import subprocess

    import_or_missing("litdata")
    import gpu_throughput as throughput  # (scripts/ is on sys.path: the gpu_check fixture)

    from speedkit.data.streaming.prepare import prepare_images

    throughput.write_jpegs(work / "images" / "train", 8, 2, (40, 64), "cpu", seed=0)
    throughput.write_jpegs(work / "images" / "val", 4, 2, (40, 64), "cpu", seed=1)
    prepare_images(work / "images", work / "shards", short_side=32, progress=False)
    subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "s3-stand-ins", str(work / "site")], check=True)
    streams = f"""
import boto3, botocore.credentials
from speedkit.data.streaming import StreamingImageLoader
assert boto3.__file__.startswith({str(work / "site")!r}), boto3.__file__
images, labels = next(iter(StreamingImageLoader({str(work / "shards")!r}, batch_size=4, image_size=32)))
assert images.shape == (4, 3, 32, 32) and labels.shape == (4,)
try:
    botocore.credentials.InstanceMetadataProvider()
except RuntimeError as e:
    print(e)
"""
    done = subprocess.run([sys.executable, "-c", streams], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": f"{work / 'site'}{os.pathsep}{ROOT}"})
    assert done.returncode == 0, done.stderr
    assert "S3 is not available in speedkit's GPU checks" in done.stdout


def test_a_part_that_cannot_be_prepared_is_skipped_with_its_reason(gpu_check, work, monkeypatch):
    monkeypatch.setenv("SPEEDKIT_GPU_CHECK_IMAGENET", str(work / "no-shards"))
    out = work / "out"
    assert gpu_check.main(["time-to-target", "--device", "cpu", "--tiny", "--only", "imagenet",
                           "--out", str(out)]) == 0
    result = json.loads((out / "time-to-target.json").read_text())
    assert "scripts/gpu_check.sh prepare" in result["parts"]["imagenet"]["skipped"] and result["finished"]
    # a second run into the same folder is refused before it starts: a run's figures are never overwritten
    with pytest.raises(SystemExit):
        gpu_check.main(["time-to-target", "--device", "cpu", "--tiny", "--only", "imagenet", "--out", str(out)])


def test_a_lease_runs_the_check_not_yet_run_on_this_code(gpu_check, tmp_path):
    code = gpu_check.code_version()["code_hash"]
    assert gpu_check.next_check(code, tmp_path) == ("throughput", None)

    def ran(check: str, folder: str, parts: dict | None = None, **result) -> None:
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / f"{check}.json").write_text(json.dumps(
            {"code": {"code_hash": code}, "finished": True, "parts": parts or {"peak": {"ok": True}}, **result}))

    ran("throughput", "gpu-h100-1", tiny=True)  # a CPU rehearsal is no run
    assert gpu_check.next_check(code, tmp_path) == ("throughput", None)
    # the time budget left two parts out; the next lease runs those, not a part that could not be prepared
    left_out = {"skipped": "about 30 s needed, 5 s of the check's 285 s budget left", "retry": True}
    ran("throughput", "gpu-h100-3", parts={"peak": {"ok": True}, "preset gpt2:hot": left_out, "loader": left_out})
    assert gpu_check.next_check(code, tmp_path) == ("throughput", {"preset gpt2:hot", "loader"})
    ran("throughput", "gpu-h100-4", parts={"loader": {"ok": True}})
    assert gpu_check.next_check(code, tmp_path) == ("throughput", {"preset gpt2:hot"})
    # a lease stopped at its limit, before the part it planned: the next one runs that part again
    ran("throughput", "gpu-h100-4b", finished=False,
        parts={"preset gpt2:hot": {"skipped": "not reached: the check stopped before this part", "retry": True}})
    assert gpu_check.next_check(code, tmp_path) == ("throughput", {"preset gpt2:hot"})
    ran("throughput", "gpu-h100-5", parts={"preset gpt2:hot": {"ok": True}})
    assert gpu_check.next_check(code, tmp_path) == ("time-to-target", None)
    ran("time-to-target", "gpu-h100-5", parts={"imagenet": {"skipped": "no shard set", "retry": False}})
    assert gpu_check.next_check(code, tmp_path) == (None, None)
    assert gpu_check.next_check("other code", tmp_path) == ("throughput", None)


def test_a_check_stopped_at_its_limit_says_which_parts_it_did_not_reach(gpu_check, tmp_path):
    results = gpu_check.Results(tmp_path, "throughput", "cpu", tiny=False, budget_s=100)
    results.plan(["peak", "data", "loader"])
    results.part("peak", lambda: {"ok": True})
    written = json.loads((tmp_path / "throughput.json").read_text())  # what a killed check leaves behind
    assert not written["finished"] and written["parts"]["peak"]["ok"]
    assert {name for name, part in written["parts"].items() if part.get("retry")} == {"data", "loader"}
    results.part("data", lambda: {"ok": True}, needs_s=1e9)  # more than the budget: left out for the next lease
    assert json.loads((tmp_path / "throughput.json").read_text())["parts"]["data"]["retry"]


def test_a_lease_runs_the_checks_at_the_issues_scale_and_every_seed_preset(gpu_check):
    """What the device runs is what issue 54 asks for: a smaller FULL would make the figures cheap and wrong."""
    import gpu_throughput as throughput
    import gpu_time_to_target as time_to_target

    from speedkit.tasks.recipes import load_presets

    full = throughput.FULL
    assert full.images >= 12_000 and full.image_sides[1] > full.image_sides[0] and full.vocab == 50_257
    assert full.sizes == (176, 224) and full.context == 1024 and full.task_sizes == "gpu" and full.workers > 0
    assert full.compile_backend == "inductor" and full.precision == "bf16"
    # every seed preset is measured, the pairs the goals compare first
    assert sorted(full.presets) == sorted(f"{task}:{name}" for task in ("imagenet", "gpt2")
                                          for name in load_presets(task))
    assert full.presets[:4] == ("imagenet:plain-bf16", "imagenet:mild", "gpt2:baseline", "gpt2:hot")
    full = time_to_target.FULL
    assert (full.bench_profile, full.bench_seeds, full.bench_scale) == ("gpu", 3, ())
    assert full.vocab == 50_257 and full.context == 1024 and full.task_sizes == "gpu"
    assert full.imagenet_durations == {"plain-bf16": "90ep", "mild": "36ep"} and full.imagenet_model == "resnet50"
    assert full.compile_backend == "inductor" and full.budget_s <= 9 * 60


def test_speed_ups_are_reported_less_each_runs_first_compile_too(gpu_check):
    import gpu_time_to_target

    arms = {"plain-bf16": {"time_to_target_s": [40.0, 38.0, 41.0], "compile_s": [30.0, 4.0, 5.0]},
            "hot": {"time_to_target_s": [34.0, None, 8.0], "compile_s": [30.0, 4.0, 4.0]}}
    apart = gpu_time_to_target.less_compile(arms, "plain-bf16", "hot")
    assert apart["time_to_target_less_compile_s"] == {"plain-bf16": [10.0, 34.0, 36.0], "hot": [4.0, None, 4.0]}
    assert apart["speedup_less_compile_by_seed"] == [2.5, None, 9.0]
    assert apart["speedup_less_compile_median"] == 5.75  # the seed that missed drops its pair
    arms["hot"]["compile_s"] = None  # an arm that did not compile: its times as they are
    assert gpu_time_to_target.less_compile(arms, "plain-bf16", "hot")["time_to_target_less_compile_s"]["hot"] == \
        [34.0, None, 8.0]


def test_what_a_part_finds_short_of_the_requirements_reaches_the_summary(gpu_check, tmp_path):
    import gpu_throughput

    def counts(ops: int, waits: int = 0) -> dict:
        return {"waits_in_quiet_steps": waits, "quiet_step_ops": {3: ops, 4: ops + 2, 5: ops}}

    counted = {"gpt2:baseline": counts(700), "gpt2:hot": counts(920), "imagenet:hot": counts(600, waits=2),
               "imagenet:mild": {"error": "RuntimeError: out of memory"}}
    unmet = gpu_throughput.unmet_in_counts(counted)
    assert unmet == ["imagenet:hot: 2 host waits or blocking host-to-device copies in quiet steps (none allowed)"]
    # eager ops are reported against the baseline's where it was counted, not judged (the gpu profiles compile)
    assert gpu_throughput.eager_ops_against_baseline(counted) == {"gpt2:baseline": 1.0, "gpt2:hot": 1.31}

    def preset(launches: float | None, cuda: bool = True) -> dict:
        key = "host_launches" if cuda else "kernels"
        return {"ok": True, "unmet": [], "kernels_per_step": {key: launches} if launches is not None else None}

    parts = {"peak": {"ok": True}, "preset gpt2:baseline": preset(200), "preset gpt2:hot": preset(262),
             "preset gpt2:composer": preset(260), "preset imagenet:mild": preset(400, cuda=False),
             "preset imagenet:hot": preset(None)}  # imagenet's baseline did not run: nothing to hold it to
    kernels = gpu_throughput.unmet_in_kernels(parts)
    assert kernels == {"preset gpt2:hot": ["1.31x its baseline's kernels a compiled step (at most 1.3x)"]}
    parts["preset imagenet:baseline"] = preset(300, cuda=False)  # a CPU rehearsal's profile counts kernels
    assert gpu_throughput.unmet_in_kernels(parts).keys() == {"preset gpt2:hot", "preset imagenet:mild"}

    results = gpu_check.Results(tmp_path, "throughput", "cpu", tiny=True, budget_s=100)
    results.part("counts", lambda: {"ok": True, "unmet": unmet, "headline": "counted"})
    results.part("peak", lambda: {"ok": True, "unmet": []})
    results.part("preset gpt2:hot", lambda: {"ok": True, "unmet": [], "headline": "timed"})
    results.add_unmet("preset gpt2:hot", kernels["preset gpt2:hot"])  # found once its baseline had run
    assert results.finish()  # every part ran: what it found short of is said apart
    summary = json.loads((tmp_path / "throughput.json").read_text())["unmet"]
    assert summary == {"counts": unmet, "preset gpt2:hot": kernels["preset gpt2:hot"]}
    markdown = (tmp_path / "throughput.md").read_text()
    assert f"counted **UNMET**: {unmet[0]}" in markdown
    assert f"timed **UNMET**: {kernels['preset gpt2:hot'][0]}" in markdown


def test_on_the_device_machine_results_land_under_OUT(gpu_check, tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    folder = gpu_check.results_folder(None, "cpu", "throughput")
    assert folder.parent == tmp_path and folder.name.endswith("-gpu-cpu")  # a dated study folder
    folder.mkdir()
    (folder / "throughput.json").write_text("{}")  # a second lease that day gets a folder of its own
    assert gpu_check.results_folder(None, "cpu", "throughput") == tmp_path / f"{folder.name}-2"
    assert gpu_check.results_folder(None, "cpu", "time-to-target") == folder
    monkeypatch.delenv("OUT")
    assert gpu_check.results_folder(None, "cpu", "throughput").parent == ROOT / "bench" / "results"
