"""What the tests need from outside Python's own packages, and what a missing piece does to them.

On a developer's machine a test whose dataset, browser or package is missing is skipped with the
install command as its reason. Under ``CI=true`` (CI sets it; ``.ci/run`` sets it too) the same test
fails with that message: a green CI must mean that the real-data, notebook and browser tests ran.

Loaded as a pytest plugin (tests/conftest.py registers it; ``pytest -p prerequisites`` works too):
it handles the ``prerequisite(name)`` marker and prints the skipped tests grouped by reason at the end.
"""
from __future__ import annotations

import importlib
import os
from collections import Counter
from pathlib import Path

import pytest

FMNIST_INSTALL = "sudo apt-get install dataset-fashion-mnist (or run bash scripts/setup-system.sh as root)"
DOCS_INSTALL = "sudo apt-get install python3.11-doc (or run bash scripts/setup-system.sh as root)"
CHROMIUM_INSTALL = "sudo apt-get install chromium (or run bash scripts/setup-system.sh as root)"
DEV_INSTALL = "pip install -e '.[dev]' (make test does it)"


def _fashion_mnist() -> bool:
    from speedkit.data import locate_fashion_mnist

    try:
        locate_fashion_mnist()
        return True
    except FileNotFoundError:
        return False


def _python_docs() -> bool:
    from speedkit.data import text

    return text.DEFAULT_TEXT_ROOT.is_dir()


def _chromium() -> bool:
    from lab_server import CHROMIUM

    return Path(CHROMIUM).exists()


# name -> (is it there?, what it is, how to install it)
PREREQUISITES = {
    "fashion-mnist": (_fashion_mnist, "Fashion-MNIST", FMNIST_INSTALL),
    "python-docs": (_python_docs, "the text corpus (/usr/share/doc/python3.11/html/_sources)", DOCS_INSTALL),
    "chromium": (_chromium, "Chromium (/usr/bin/chromium)", CHROMIUM_INSTALL),
}
_found: dict[str, bool] = {}  # each check runs once per session


def in_ci() -> bool:
    """CI=true (or 1/yes): the way CI services and .ci/run say so."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(what: str, install: str) -> None:
    """Skip the calling test, or fail it under CI, saying what is missing and how to install it."""
    message = f"{what} is missing: {install}"
    if in_ci():
        pytest.fail(f"{message}. CI=true: tests that need it must run, not skip", pytrace=False)
    pytest.skip(message)


def is_present(name: str) -> bool:
    if name not in PREREQUISITES:
        raise ValueError(f"unknown prerequisite {name!r}; known: {sorted(PREREQUISITES)}")
    if name not in _found:
        _found[name] = PREREQUISITES[name][0]()
    return _found[name]


def require(name: str) -> None:
    """For use inside a test: skip (or fail under CI) unless prerequisite ``name`` is installed."""
    if not is_present(name):
        _, what, install = PREREQUISITES[name]
        missing(what, install)


def import_or_missing(module: str, install: str = DEV_INSTALL):
    """``pytest.importorskip`` that fails under CI instead of skipping."""
    try:
        return importlib.import_module(module)
    except ImportError:
        missing(f"the Python package {module}", install)


def _importorskip_failing_in_ci(importorskip):
    """``pytest.importorskip`` as tests call it, except that under CI a missing module fails the test."""
    def wrapped(modname, minversion=None, reason=None, **kwargs):
        try:
            return importorskip(modname, minversion=minversion, reason=reason, **kwargs)
        except pytest.skip.Exception as skipped:
            pytest.fail(f"{skipped.msg}. CI=true: tests that need {modname} must run, not skip", pytrace=False)
    wrapped.__wrapped__ = importorskip
    return wrapped


# -- plugin hooks ---------------------------------------------------------------------------------
def pytest_configure(config):
    config.addinivalue_line("markers", "prerequisite(name): needs an installed dataset or program "
                                       f"(one of {sorted(PREREQUISITES)}); skipped without it, failed under CI=true")
    if in_ci() and not hasattr(pytest.importorskip, "__wrapped__"):
        # Tests written with plain pytest.importorskip (not import_or_missing) cannot skip silently in CI either.
        pytest.importorskip = _importorskip_failing_in_ci(pytest.importorskip)


@pytest.hookimpl(tryfirst=True)  # before fixtures: a missing dataset must not start a module's expensive fixture
def pytest_runtest_setup(item):
    for mark in item.iter_markers("prerequisite"):
        for name in mark.args:
            require(name)


def skip_reasons(reports) -> Counter:
    """Skipped test reports counted by their reason (without pytest's 'Skipped: ' prefix)."""
    reasons = Counter()
    for report in reports:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    return reasons


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    reasons = skip_reasons(terminalreporter.stats.get("skipped", []))
    if not reasons:
        return
    terminalreporter.write_sep("-", f"{sum(reasons.values())} skipped, by reason")
    for reason, count in reasons.most_common():
        terminalreporter.write_line(f"{count:5d}  {reason}")
