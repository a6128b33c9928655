"""A missing dataset, browser or package skips a test locally and fails it under CI=true; the set-up script
and `make system` say what is missing and fail where CI needs them; skips are counted by reason at the end."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

INNER_TESTS = '''
import pytest
import prerequisites

# as if the data were not installed: the check is replaced before any test's setup asks for it
prerequisites.PREREQUISITES["fashion-mnist"] = (lambda: False, "Fashion-MNIST", "apt-get install the-data")


@pytest.mark.prerequisite("fashion-mnist")
def test_marked():
    pass


@pytest.mark.prerequisite("fashion-mnist")
def test_marked_too():
    pass


def test_imports():
    prerequisites.import_or_missing("speedkit_no_such_module", "pip install the-module")


def test_plain_importorskip():
    pytest.importorskip("speedkit_no_such_module_either")


def test_plain_skip():
    pytest.skip("not on this device")


def test_passes():
    pass
'''


def run_inner(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "test_inner.py").write_text(INNER_TESTS)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(PYTHONPATH=str(ROOT / "tests" / "support"), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "prerequisites", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-q", str(tmp_path / "test_inner.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_missing_prerequisites_skip_locally_with_the_install_command_counted_by_reason(tmp_path):
    result = run_inner(tmp_path, ci=None)
    assert result.returncode == 0, result.stdout
    assert "1 passed, 5 skipped" in result.stdout
    summary = result.stdout[result.stdout.index("5 skipped, by reason"):]
    assert "    2  Fashion-MNIST is missing: apt-get install the-data" in summary
    assert "    1  the Python package speedkit_no_such_module is missing: pip install the-module" in summary
    assert "    1  not on this device" in summary


@pytest.mark.parametrize("ci", ["true", "1"])
def test_under_ci_a_missing_prerequisite_fails_with_what_to_install(tmp_path, ci):
    result = run_inner(tmp_path, ci=ci)
    assert result.returncode == 1, result.stdout
    # the two marked tests fail in setup (before fixtures), the import in the test; a plain skip stays a skip
    assert "2 errors" in result.stdout and "2 failed" in result.stdout and "1 skipped" in result.stdout
    assert result.stdout.count("Fashion-MNIST is missing: apt-get install the-data. CI=true: tests that need "
                               "it must run, not skip") >= 2
    assert "speedkit_no_such_module is missing: pip install the-module. CI=true" in result.stdout
    # plain pytest.importorskip too (tests that do not use import_or_missing)
    assert "could not import 'speedkit_no_such_module_either'" in result.stdout
    assert "CI=true: tests that need speedkit_no_such_module_either must run, not skip" in result.stdout


def test_ci_false_means_local(tmp_path):
    assert "1 passed, 5 skipped" in run_inner(tmp_path, ci="false").stdout


# -- scripts/setup-system.sh and `make system` ------------------------------------------------------
@pytest.fixture
def no_system_packages(tmp_path):
    """An empty root to check for the packages in, and an apt-get that fails and leaves a note that it ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    apt = bin_dir / "apt-get"
    apt.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'apt-calls'}\nexit 100\n")
    apt.chmod(0o755)
    env = {**os.environ, "SPEEDKIT_SETUP_CHECK_ROOT": str(tmp_path / "root"),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("CI", None)
    return env, tmp_path


def test_setup_script_fails_naming_what_it_could_not_install(no_system_packages):
    env, folder = no_system_packages
    result = subprocess.run(["bash", str(ROOT / "scripts" / "setup-system.sh")], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1
    assert "missing: dataset-fashion-mnist python3.11-doc chromium" in result.stderr
    assert "sudo apt-get install dataset-fashion-mnist" in result.stderr
    if os.geteuid() == 0:  # as root it tried apt-get first, and said that it failed
        assert (folder / "apt-calls").read_text().startswith("update")
        assert "apt-get could not install dataset-fashion-mnist python3.11-doc chromium" in result.stderr


def test_setup_script_succeeds_without_apt_when_everything_is_there(no_system_packages):
    env, folder = no_system_packages
    root = folder / "root"
    (root / "usr/share/datasets/fashion-mnist").mkdir(parents=True)
    (root / "usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").touch()
    (root / "usr/share/doc/python3.11/html/_sources").mkdir(parents=True)
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/chromium").write_text("#!/bin/sh\n")
    (root / "usr/bin/chromium").chmod(0o755)
    result = subprocess.run(["bash", str(ROOT / "scripts" / "setup-system.sh")], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert not (folder / "apt-calls").exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_system_stops_only_under_ci(no_system_packages):
    env, _ = no_system_packages
    local = subprocess.run(["make", "-s", "-C", str(ROOT), "system"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert local.returncode == 0 and "setup: continuing without them" in local.stdout
    ci = subprocess.run(["make", "-s", "-C", str(ROOT), "system"], env={**env, "CI": "true"}, capture_output=True,
                        text=True, timeout=60)
    assert ci.returncode != 0 and "continuing" not in ci.stdout
    assert "missing: dataset-fashion-mnist" in ci.stderr


def test_ci_script_sets_ci_for_a_run_by_hand():
    text = (ROOT / ".ci" / "run").read_text()
    assert 'export CI="${CI:-true}"' in text and text.index("export CI") < text.index("make test")
