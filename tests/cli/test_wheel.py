"""The wheel as a user gets it: built from the sources, installed into a fresh venv with no checkout on the path,
and run from an empty folder: ``speedkit --version``, a 3-batch ``speedkit train`` and a tiny ``speedkit demo``
(which runs the quickstart notebook and parameters shipped inside the package).

Installing torch into a fresh venv would cost minutes and gigabytes, so the venv gets the dev environment's
third-party packages through a ``.pth`` line naming its site-packages as a plain path: such a line adds the
folder to ``sys.path`` without running that folder's own ``.pth`` files, so the dev install's editable finder
for speedkit stays off, and ``speedkit`` can only come from the wheel (each test asserts where it came from).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
import yaml

from helpers import needs_fmnist

ROOT = Path(__file__).resolve().parents[2]
# what a build needs, as an sdist carries it (MANIFEST.in): building from a copy keeps the checkout's build/ out
SOURCES = ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "speedkit", "notebooks", "tutorials", "params",
           "bench/results/summary.json"]
TINY_DEMO = {"device": "cpu", "duration": "4ba", "eval_interval": "2ba", "target": 0.0, "data_fraction": 0.02,
             "eval_fraction": 0.05, "repeats": 1, "min_speedup": 0.0}  # too short to time: it must run, not win


def _copy_sources(dest: Path) -> Path:
    for name in SOURCES:
        source, target = ROOT / name, dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
        else:
            shutil.copy2(source, target)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    source = _copy_sources(tmp / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(tmp / "dist"), str(source)], check=True, capture_output=True, text=True)
    [built] = (tmp / "dist").glob("*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> dict:
    """A venv with the wheel installed (no dependencies), the dev venv's packages visible, run from an empty cwd."""
    tmp = tmp_path_factory.mktemp("venv")
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=False, symlinks=os.name != "nt")
    python = env_dir / ("Scripts" if os.name == "nt" else "bin") / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    dev = sysconfig.get_paths()  # the interpreter running the tests: the dev environment
    (site / "dev_packages.pth").write_text("".join(f"{p}\n" for p in dict.fromkeys([dev["purelib"], dev["platlib"]])))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, capture_output=True, text=True)
    cwd = tmp / "elsewhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the tests put the checkout first there
    # the dev packages' data files too (nbconvert's HTML templates live in <prefix>/share/jupyter, which a real
    # install of torch-speedkit[demo] puts in the venv's own prefix)
    env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(Path(sys.prefix) / "share" / "jupyter"),
                                                         env.get("JUPYTER_PATH")]))
    return {"python": python, "speedkit": python.parent / "speedkit", "site": site, "cwd": cwd, "env": env}


def _run(installed, *args, timeout=300) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in args], cwd=installed["cwd"], env=installed["env"], capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result


def test_the_wheel_is_torch_speedkit_and_carries_the_notebooks_and_parameter_sets(wheel):
    assert wheel.name.startswith("torch_speedkit-")
    names = set(zipfile.ZipFile(wheel).namelist())
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "Name: torch-speedkit\n" in text and "Provides-Extra: demo" in text
    entry_points = zipfile.ZipFile(wheel).read(metadata.replace("METADATA", "entry_points.txt")).decode()
    assert "speedkit = speedkit.cli.main:main" in entry_points
    shipped = {n.removeprefix("speedkit/shipped/") for n in names if n.startswith("speedkit/shipped/")}
    for folder, pattern in [("notebooks", "*.ipynb"), ("tutorials", "*.ipynb"), ("tutorials", "expected_outputs/*.json"),
                            ("params", "*/*.yaml")]:
        expected = {str(p.relative_to(ROOT)) for p in (ROOT / folder).glob(pattern)}
        assert expected and expected <= shipped, f"missing from the wheel: {sorted(expected - shipped)}"
    assert "bench/results/summary.json" in shipped
    presets = {str(p.relative_to(ROOT)) for p in (ROOT / "speedkit" / "tasks" / "presets").glob("*.*")}
    assert presets and presets <= names, f"presets missing from the wheel: {sorted(presets - names)}"
    assert not any(n.startswith(("tests/", "build/")) for n in names)


def test_the_installed_command_prints_its_version_from_the_wheel(installed):
    from speedkit.version import __version__

    assert _run(installed, installed["speedkit"], "--version").stdout.strip() == f"speedkit {__version__}"
    where = _run(installed, installed["python"], "-c", "import speedkit; print(speedkit.__file__)").stdout.strip()
    assert Path(where).is_relative_to(installed["site"]), f"speedkit came from {where}, not the wheel"


@needs_fmnist
def test_the_installed_command_trains_three_batches(installed):
    _run(installed, installed["speedkit"], "train", "--duration", "3ba", "--batch-size", "32", "--data-fraction",
         "0.01", "--eval-fraction", "0.02", "--device", "cpu", "--run-dir", "runs", "--run-name", "wheel",
         "--no-progress")
    from speedkit import RunRecord

    record = RunRecord.load(installed["cwd"] / "runs" / "wheel")
    assert record.status == "completed" and record.steps[-1]["batch"] == 3


@needs_fmnist
def test_the_installed_demo_runs_the_shipped_quickstart_from_any_folder(installed):
    params = installed["cwd"] / "tiny"
    params.mkdir()
    (params / "00_quickstart.yaml").write_text(yaml.safe_dump(TINY_DEMO))
    out = _run(installed, installed["speedkit"], "demo", "--params", params, "--out", "demo", timeout=600).stdout
    shipped = installed["site"] / "speedkit" / "shipped"
    assert f"running {shipped / 'notebooks' / '00_quickstart.ipynb'} headlessly" in out
    # the kernel imported the wheel's speedkit too: it read the benchmark summary shipped with it
    assert f"{shipped / 'bench' / 'results' / 'summary.json'})" in out
    folder = installed["cwd"] / "demo" / "00_quickstart"
    for name in ("00_quickstart.ipynb", "00_quickstart.html", "00_quickstart.png"):
        assert (folder / name).exists(), f"the demo wrote no {name} into {folder}"
    assert not list(shipped.rglob("record.json")) and not (shipped / "runs").exists()  # nothing written into it
