"""Notebooks and tutorials as regression tests.

Every notebook with a ``params/cpu-smoke`` file runs headlessly through the runner; those with
``# NBVAL_CHECK_OUTPUT`` cells also run under ``pytest --nbval-lax``, which compares those cells'
outputs with the ones committed in ``expected_outputs/<name>.json``. Every notebook is committed
clean. A new notebook is picked up as soon as it has a parameter file.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from prerequisites import import_or_missing  # noqa: E402

import_or_missing("papermill")
import_or_missing("nbval")
nbformat = import_or_missing("nbformat")

from helpers import needs_fmnist  # noqa: E402
from notebook_checks import (NBVAL_NOTEBOOK, NOTEBOOKS, ROOT, SMOKE, assert_runs_with_smoke_parameters,  # noqa: E402
                             smoke_in)

from speedkit.cli.main import main  # noqa: E402
from speedkit.cli.notebook_checks import (check_cell_differences, check_committed,  # noqa: E402
                                          is_check_cell, load_expected_outputs, parameterized_copy)
from speedkit.cli.notebooks import declared_parameters, format_summary, load_params, param_sets, run_notebooks  # noqa: E402

SMOKE_NOTEBOOKS = smoke_in("notebooks")
TUTORIALS = [p for p in NOTEBOOKS if p.parent.name == "tutorials"]
# nbval on a notebook without check cells would only repeat the runner's test, at the same cost.
CHECKED = [p for p in SMOKE if any(is_check_cell(c) for c in nbformat.read(str(p), as_version=4).cells)]


@pytest.fixture(autouse=True)
def one_thread_kernels(monkeypatch):
    """Kernels inherit this environment. The notebooks' small models run faster on one thread, and on a
    busy machine several times faster (two threads each in several processes wait on one another)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _ids(paths):
    return [p.stem for p in paths]


# -- every notebook, executed (the tutorials in test_tutorials.py: two files, so make test's two workers share them)
# The quickstart's smoke run is shared with its speed check below (the unslowed side of the comparison), so that
# the notebook is executed once for both.
QUICKSTART = "00_quickstart"


@pytest.fixture(scope="module")
def quickstart_smoke_run(tmp_path_factory):
    """The quickstart run once with its cpu-smoke parameters: its output folder, after the smoke checks passed."""
    out = tmp_path_factory.mktemp("quickstart")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        assert_runs_with_smoke_parameters(ROOT / "notebooks" / f"{QUICKSTART}.ipynb", out)
    return out


@needs_fmnist
@pytest.mark.parametrize("path", SMOKE_NOTEBOOKS, ids=_ids(SMOKE_NOTEBOOKS))
def test_notebook_runs_with_its_smoke_parameters(path, tmp_path, request):
    if path.stem == QUICKSTART:
        request.getfixturevalue("quickstart_smoke_run")  # its checks are assert_runs_with_smoke_parameters'
        return
    assert_runs_with_smoke_parameters(path, tmp_path)


def test_a_check_cell_that_prints_something_else_is_reported(tmp_path):
    [path] = [p for p in CHECKED if p.stem == NBVAL_NOTEBOOK]
    nb = nbformat.read(str(path), as_version=4)
    expected = load_expected_outputs(path)
    for cell in nb.cells:
        if cell.cell_type == "code" and is_check_cell(cell):
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)
                            for text in ("".join(o.get("text", "")) for o in expected[cell.id])]
    nbformat.write(nb, tmp_path / "as_expected.ipynb")
    assert check_cell_differences(path, tmp_path / "as_expected.ipynb") == []
    first = next(c for c in nb.cells if c.cell_type == "code" and is_check_cell(c))
    first.outputs = [nbformat.v4.new_output("stream", name="stdout", text="something else\n")]
    nbformat.write(nb, tmp_path / "changed.ipynb")
    [problem] = check_cell_differences(path, tmp_path / "changed.ipynb")
    assert problem.startswith(f"check cell {first.id} printed ['something else\\n']")


# nbval itself, as a user runs it (pytest --nbval-lax on a parameterized copy), on one notebook: the runner
# test above already compares every check cell's output, so running each notebook twice would only cost time.
# This run is also that notebook's smoke run (test_tutorials.py leaves it out).


@needs_fmnist
@pytest.mark.parametrize("path", [p for p in CHECKED if p.stem == NBVAL_NOTEBOOK], ids=[NBVAL_NOTEBOOK])
def test_nbval_lax_passes_on_the_parameterized_notebook(path, tmp_path):
    """nbval runs a copy with the smoke parameters injected, every cell without an error, and compares the check
    cells' outputs; the notebook writes its RunRecords into out_dir."""
    copy = parameterized_copy(path, {**load_params("cpu-smoke", path, ROOT), "out_dir": str(tmp_path / "out")},
                      tmp_path / path.name)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "--nbval-lax", "--nbval-current-env",
                           "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(copy)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert list((tmp_path / "out").rglob("record.json")), f"{path.name} wrote no RunRecord into out_dir"


@needs_fmnist
def test_a_bad_parameter_fails_with_the_librarys_message(tmp_path):
    [result] = run_notebooks("cpu-smoke", out=tmp_path, root=ROOT, only=["t4_schedules_and_durations"],
                             overrides={"duration": "3 parsecs"})
    assert result.failed
    assert result.error.startswith("ValueError: unknown time unit 'parsecs' in '3 parsecs'; accepted units: ep, ba")
    assert "ValueError: unknown time unit 'parsecs'" in format_summary([result])
    assert result.html.exists()  # a failed run is exported too, to be read where it failed


def _quickstart_ratio(out: Path, monkeypatch, slowdown: str) -> float:
    """The quickstart's measured speed-up with ``slowdown``, read from the check it fails at an unreachable
    threshold."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT / "tests" / "support" / "slowdown"),
                                                                     os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("SPEEDKIT_TEST_SLOWDOWN", slowdown)
    [result] = run_notebooks("cpu-smoke", out=out, root=ROOT, only=[QUICKSTART], overrides={"min_speedup": 1e6})
    found = re.search(r"only ([0-9.]+)x faster than the baseline \(expected >=", result.error or "")
    assert result.failed and found, result.error
    return float(found.group(1))


def _printed_ratio(out: Path) -> float:
    """The speed-up an executed quickstart printed (speedup_summary's line, before its check cell)."""
    nb = nbformat.read(str(out / QUICKSTART / f"{QUICKSTART}.ipynb"), as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    [found] = re.findall(r"([0-9.]+)x sooner than the baseline", text)
    return float(found)


@needs_fmnist
def test_the_quickstart_speed_check_sees_a_2x_slower_speed_up_path(quickstart_smoke_run, tmp_path, monkeypatch):
    """The speed-up check has teeth: with every training step of the recipe's run (the one with methods) taking
    twice as long, as a regression in the methods' path would make it, the measured ratio falls well below the
    unslowed one. Compared within the test, since the ratio itself depends on the CPU (0.63-0.83 on an AMD EPYC
    that trains in fp32, 1.04-1.10 on a Xeon whose AMX makes bf16 fast; 0.47 and 0.59-0.62 slowed), which no
    single threshold in params/cpu-smoke separates on both. The unslowed ratio is the smoke run's (the same
    parameters; its own check passed at the smoke threshold). Each ratio times a baseline and then the recipe
    while the suite's other worker loads the machine as it happens to: where the pair disagrees, it is measured
    again side by side (a slowed path read 0.88 of the smoke run's on a noisy machine, 0.56-0.75 elsewhere), and a
    check without teeth fails both pairs."""
    plain = _printed_ratio(quickstart_smoke_run)
    slowed = _quickstart_ratio(tmp_path / "slowed", monkeypatch, "2")
    if slowed >= 0.8 * plain:
        plain = _quickstart_ratio(tmp_path / "plain-again", monkeypatch, "1")
        slowed = _quickstart_ratio(tmp_path / "slowed-again", monkeypatch, "2")
    assert slowed < 0.8 * plain, (plain, slowed)


# -- as committed -------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_is_committed_clean(path):
    """No outputs, no execution counts, a parameters cell first, expected outputs for every check cell."""
    assert check_committed(path) == []


def test_every_tutorial_has_smoke_and_gpu_parameters():
    assert len(TUTORIALS) >= 7
    for param_set in ("cpu-smoke", "gpu"):
        missing = [p.stem for p in TUTORIALS if load_params(param_set, p, ROOT) is None]
        assert not missing, f"tutorials without params/{param_set}/<name>.yaml: {missing}"


def test_parameter_files_name_real_notebooks_and_parameters():
    """A typo in a parameter file (the gpu set runs only on GPU machines) is caught here."""
    stems = {p.stem: p for p in NOTEBOOKS}
    for param_set in param_sets(ROOT):
        for file in sorted((ROOT / "params" / param_set).glob("*.yaml")):
            assert file.stem in stems, f"{file} names no notebook in notebooks/ or tutorials/"
            unknown = set(load_params(param_set, file.stem, ROOT)) - set(declared_parameters(stems[file.stem]))
            assert not unknown, f"{file} sets {sorted(unknown)}, which {file.stem} does not declare"


# -- the checks at their defaults, against the committed benchmark results ---------------------------------
SUMMARY = ROOT / "bench" / "results" / "summary.json"


def _defaults_and_cells(name: str) -> tuple[dict, list]:
    """A notebook's parameters at their defaults (its parameters cell executed) and its code cells."""
    nb = nbformat.read(str(ROOT / "notebooks" / f"{name}.ipynb"), as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    defaults: dict = {}
    exec(code[0], defaults)
    return defaults, code


@pytest.mark.parametrize("name, task", [("02_vision_benchmark", "vision"), ("03_language_benchmark", "language")])
def test_benchmark_notebook_checks_pass_at_their_defaults_on_the_committed_results(name, task):
    """The last cell's checks, at the notebook's default thresholds, accept the committed summary (so the
    notebook run as it ships passes where the benchmark's figures hold) and refuse it a little below them."""
    import types

    defaults, code = _defaults_and_cells(name)
    entry = json.loads(SUMMARY.read_text())[task]
    run_checks = lambda e: exec("import statistics\nfrom speedkit.record.runs import lower_is_better\n" + code[-1],  # noqa: E731
                                {**defaults, "entry": e, "result": types.SimpleNamespace(paths={"summary_json": str(SUMMARY)})})
    run_checks(entry)
    with pytest.raises(AssertionError, match="median speed-up"):
        run_checks({**entry, "speedup_median": defaults["min_speedup"] * 0.95})
    finals = entry["baselines"][entry["strongest_baseline"]]["final_metric"]
    lower_better = task == "language"  # bits per byte; a final just past the strongest baseline's, the wrong way:
    best = {**entry["recipes"][entry["best_recipe"]],
            "final_metric": [max(finals) + 0.01 if lower_better else min(finals) - 0.01]}
    with pytest.raises(AssertionError, match="the best recipe"):
        run_checks({**entry, "recipes": {**entry["recipes"], entry["best_recipe"]: best}})


def test_ablation_notebook_asks_at_its_defaults_for_what_the_committed_leave_one_out_found():
    defaults, _ = _defaults_and_cells("04_ablation")
    table = json.loads(SUMMARY.read_text())[defaults["task"]]["leave_one_out"]
    assert table["recipe"] == defaults["recipe"]
    assert defaults["must_pay_off"], "04_ablation checks no part at its defaults"
    assert all(table["parts"][part]["pays_off"] for part in defaults["must_pay_off"]), table["parts"]


# -- the runner on small notebooks made here ------------------------------------------------------------
def _tiny_root(tmp_path: Path, notebooks: dict[str, str], params: dict[str, str]) -> Path:
    """A root with tutorials/<name>.ipynb (a parameters cell, then ``body``) and params/smoke/<name>.yaml."""
    (tmp_path / "tutorials").mkdir(parents=True)
    (tmp_path / "params" / "smoke").mkdir(parents=True)
    for name, body in notebooks.items():
        nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                              "language": "python"}})
        nb.cells = [nbformat.v4.new_code_cell('device = "cpu"\nout_dir = "."\nsize = 1', metadata={"tags": ["parameters"]}),
                    nbformat.v4.new_code_cell(body)]
        nbformat.write(nb, tmp_path / "tutorials" / f"{name}.ipynb")
    for name, text in params.items():
        (tmp_path / "params" / "smoke" / f"{name}.yaml").write_text(text)
    return tmp_path


def test_cli_runs_notebooks_and_exits_1_when_one_fails(tmp_path, capsys):
    root = _tiny_root(tmp_path / "root", {
        "good": "assert size == 2",
        "bad": 'raise ValueError(f"size must be positive, got {size}")',
        "unparameterized": "raise AssertionError('never run: it has no parameter file')",
    }, {"good": "size: 2\n", "bad": "size: -1\n"})
    code = main(["notebooks", "run", "--params", "smoke", "--root", str(root), "--out", str(tmp_path / "out")])
    summary = capsys.readouterr().out
    assert code == 1
    assert "ValueError: size must be positive, got -1" in summary
    assert "unparameterized  no parameters" in summary and "1 passed, 1 failed, 1 without parameters" in summary
    assert (tmp_path / "out" / "good" / "good.html").exists() and not (tmp_path / "out" / "unparameterized").exists()
    assert main(["notebooks", "run", "--params", "smoke", "--root", str(root), "--out", str(tmp_path / "out"),
                 "--only", "good"]) == 0


def test_runner_refuses_unknown_sets_notebooks_and_parameters(tmp_path):
    root = _tiny_root(tmp_path, {"one": "pass"}, {"one": "size: 2\n"})
    with pytest.raises(ValueError, match=r"unknown parameter set 'gpu'; known sets under .*: \['smoke'\]"):
        run_notebooks("gpu", root=root)
    with pytest.raises(ValueError, match=r"no notebook named 'two'.*known: \['one'\]"):
        run_notebooks("smoke", root=root, only=["two"])
    # papermill would only warn about a parameter the notebook does not declare, and run it at its defaults
    [result] = run_notebooks("smoke", out=tmp_path / "out", root=root, overrides={"epochs": 3})
    assert result.failed and "does not declare ['epochs']" in result.error
