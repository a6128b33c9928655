"""make docs: the docstring references resolve in every module, the method pages are drawn from the cards, and
a rendered reference (the methods package with its method pages) has no link that leads nowhere and loads
nothing from the network. The whole reference is built by `make docs` (scripts/build_docs.py), which runs the
same checks over every module."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from prerequisites import import_or_missing

ROOT = Path(__file__).resolve().parents[1]
DOCS_INSTALL = "pip install 'torch-speedkit[docs]'"


@pytest.fixture(scope="module")
def build_docs():
    import_or_missing("pdoc", DOCS_INSTALL)
    spec = importlib.util.spec_from_file_location("build_docs", ROOT / "scripts" / "build_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_reference_in_speedkits_docstrings_names_something_that_exists(build_docs):
    modules = build_docs.module_names()
    assert {"speedkit.train.trainer", "speedkit.cli.export", "speedkit.methods.ema"} <= set(modules)
    assert not any("._" in name or name.endswith("__main__") for name in modules)
    assert build_docs.broken_docstring_references(modules) == []


def test_a_reference_to_nothing_is_reported(build_docs, tmp_path, monkeypatch):
    (tmp_path / "speedkit_docs_probe.py").write_text(
        '"""Uses ``speedkit.tasks.make_trainer`` and ``speedkit.tasks.make_trainr``."""\n'
        "def f():\n    '''See :func:`g` and :func:`nothing_here`.'''\n\n"
        "def g():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    broken = build_docs.broken_docstring_references(["speedkit_docs_probe"])
    sys.modules.pop("speedkit_docs_probe", None)
    assert broken == ["speedkit_docs_probe: 'speedkit.tasks.make_trainr' names nothing that exists",
                      "speedkit_docs_probe.f: 'nothing_here' names nothing that exists"]


def test_method_pages_come_from_the_cards(build_docs, tmp_path):
    from speedkit.methods import REGISTRY

    pages = build_docs.write_method_pages(tmp_path)
    assert sorted(p.stem for p in pages) == sorted(REGISTRY)
    card = REGISTRY["ema"].CARD
    page = (tmp_path / "methods" / "ema.html").read_text()
    for text in (card.summary, card.source.replace("&", "&amp;"), *[h.name for h in card.hparams]):
        assert text in page
    index = (tmp_path / "methods" / "index.html").read_text()
    assert all(f"href='{name}.html'" in index for name in REGISTRY)


def test_the_rendered_methods_reference_has_no_broken_links(build_docs, tmp_path):
    modules = ["speedkit", "speedkit.methods"] + [
        name for name in build_docs.module_names() if name.startswith("speedkit.methods.")]
    assert build_docs.build(tmp_path, modules) == []
    assert (tmp_path / "speedkit" / "methods" / "ema.html").is_file()
    assert "<a href='../speedkit/methods/ema.html#EMA'>" in (tmp_path / "methods" / "ema.html").read_text()

    (tmp_path / "methods" / "ema.html").write_text("<a href='../speedkit/methods/ema.html#NoSuchClass'>x</a>"
                                                   "<script src='https://cdn.example/x.js'></script>")
    assert sorted(build_docs.broken_links(tmp_path)) == [
        "methods/ema.html: ../speedkit/methods/ema.html#NoSuchClass (no such anchor)",
        "methods/ema.html: loads https://cdn.example/x.js from the network"]
