"""``make docs``: the API reference, offline. pdoc renders every public module from its docstrings; each method
gets a page drawn from its card (``speedkit methods NAME`` shows the same data); then every link in the output
and every ``speedkit.…`` / ``:func:`…``` reference in the docstrings is checked.

    python scripts/build_docs.py [OUT]      (default build/docs; exit status 1 when a reference is broken)

tests/test_docs.py runs the same checks.
"""
from __future__ import annotations

import contextlib
import html
import importlib
import inspect
import pkgutil
import re
import sys
import urllib.parse
import warnings
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# -- what is documented -----------------------------------------------------------------------------
def module_names() -> list[str]:
    """speedkit and its public submodules (no ``_private`` parts, no ``__main__``)."""
    sys.path.insert(0, str(ROOT))
    import speedkit

    names = ["speedkit"]
    for info in pkgutil.walk_packages(speedkit.__path__, "speedkit."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


# -- references in docstrings -----------------------------------------------------------------------
DOTTED = re.compile(r"``(speedkit(?:\.\w+)+)(?:\(\))?``")  # ``speedkit.tasks.make_trainer``
ROLE = re.compile(r":(?:func|class|meth|attr|mod|data|obj):`~?([\w.]+)`")  # :func:`swa_update`


def _resolve(dotted: str):
    """The object ``a.b.c`` names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def _has(scope, name: str) -> bool:
    """An attribute, or a field a class declares (dataclass fields without defaults are not attributes)."""
    return hasattr(scope, name) or (isinstance(scope, type) and any(
        name in getattr(klass, "__annotations__", {}) for klass in scope.__mro__))


def _resolves(name: str, scopes: list) -> bool:
    if name.startswith("speedkit."):
        try:
            _resolve(name)
            return True
        except (ImportError, AttributeError):
            return False
    head, *rest = name.split(".")
    for scope in scopes:
        if not _has(scope, head):
            continue
        obj = getattr(scope, head, None)
        if all(_has(obj, attr) and (obj := getattr(obj, attr, None)) is not None or attr == rest[-1]
               for attr in rest):
            return True
    return False


def broken_docstring_references(modules: list[str]) -> list[str]:
    """``speedkit.x.y`` in double backticks and Sphinx-style roles that name nothing that exists."""
    import pdoc.doc

    _import_speedkits_public_names()
    broken = []
    for name in modules:
        module = pdoc.doc.Module(importlib.import_module(name))
        with _lazy_names_unresolved():
            members = [module, *module.flattened_own_members]
        for doc in members:
            text = _own_docstring(doc.obj)  # not one inherited from torch, whose names are torch's
            if not text:
                continue
            owner = doc.obj if isinstance(doc, pdoc.doc.Class) else getattr(getattr(doc, "cls", None), "obj", None)
            scopes = [module.obj, sys.modules.get(getattr(doc.obj, "__module__", None) or ""), owner]
            for found in [*DOTTED.findall(text), *ROLE.findall(text)]:
                if not _resolves(found, [s for s in scopes if s is not None]):
                    broken.append(f"{doc.fullname}: {found!r} names nothing that exists")
    return broken


@contextlib.contextmanager
def _lazy_names_unresolved():
    """speedkit.ui names its widgets in ``__all__`` but imports them on first use (ipywidgets is optional); pdoc
    cannot resolve such names and warns, and documents them in their own modules anyway."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Found '\w+' in speedkit\.ui\.__all__, but it does not resolve")
        yield


def _import_speedkits_public_names() -> None:
    """``speedkit`` imports its public names on first use (so ``import speedkit`` stays cheap); pdoc reads the
    module's namespace, so they are imported first and documented where users find them (``speedkit.Method``)."""
    import speedkit

    for name in speedkit.__all__:
        getattr(speedkit, name)


def _own_docstring(obj) -> str:
    """The docstring written for ``obj`` in speedkit itself, else ''."""
    if isinstance(obj, type):
        text = obj.__dict__.get("__doc__")
    else:
        text = getattr(obj, "__doc__", None) if callable(obj) or inspect.ismodule(obj) else None
    module = obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", None) or ""
    return text if isinstance(text, str) and module.startswith("speedkit") else ""


# -- method pages from the cards --------------------------------------------------------------------
PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.3rem .6rem;text-align:left}}</style>
</head><body>{body}</body></html>
"""


def _e(value) -> str:
    return html.escape(str(value))


def _module_link(cls, up: str) -> str:
    """The pdoc page (and anchor) of the class that implements a method."""
    return f"{up}{cls.__module__.replace('.', '/')}.html#{cls.__qualname__}"


def method_page(name: str, cls) -> str:
    card = cls.CARD
    rows = "".join(f"<tr><td><code>{_e(h.name)}</code></td><td>{_e(getattr(h.type, '__name__', h.type))}</td>"
                   f"<td><code>{_e(repr(h.default))}</code></td><td>{_e(_range(h))}</td><td>{_e(h.help)}</td></tr>"
                   for h in card.hparams)
    facts = [("domain", card.domain), ("events", ", ".join(e.value for e in card.events)),
             ("reads", ", ".join(card.reads) or "-"), ("writes", ", ".join(card.writes) or "-"),
             ("requirements", "; ".join(card.requirements) or "-"),
             ("conflicts", "; ".join(f"{k}: {v}" for k, v in card.conflicts.items()) or "-"),
             ("runs after", ", ".join(card.runs_after) or "-"), ("expected effect", card.effect or "-"),
             ("source", card.source or "-")]
    body = (f"<p><a href='index.html'>all methods</a> · <a href='../index.html'>API reference</a></p>"
            f"<h1>{_e(name)}</h1><p>{_e(card.summary)}</p>"
            f"<p>Class <a href='{_module_link(cls, '../')}'><code>{_e(cls.__module__)}.{_e(cls.__qualname__)}"
            f"</code></a> (the functional form is in the same module)</p>"
            "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts) + "</table>"
            "<h2>Hyperparameters</h2>" + ("<table><tr><th>name</th><th>type</th><th>default</th><th>range</th>"
                                          f"<th>what it does</th></tr>{rows}</table>" if rows else "<p>none</p>"))
    return PAGE.format(title=f"{_e(name)} · speedkit methods", body=body)


def _range(hparam) -> str:
    if getattr(hparam, "choices", None):
        return " | ".join(map(str, hparam.choices))
    low, high = getattr(hparam, "low", None), getattr(hparam, "high", None)
    return "-" if low is None and high is None else f"{low} .. {high}"


def write_method_pages(out: Path) -> list[Path]:
    from speedkit.methods import REGISTRY

    folder = out / "methods"
    folder.mkdir(parents=True, exist_ok=True)
    pages = []
    for name, cls in REGISTRY.items():
        page = folder / f"{name}.html"
        page.write_text(method_page(name, cls), encoding="utf-8")
        pages.append(page)
    items = "".join(f"<tr><td><a href='{_e(name)}.html'>{_e(name)}</a></td><td>{_e(cls.CARD.domain)}</td>"
                    f"<td>{_e(cls.CARD.summary)}</td></tr>" for name, cls in REGISTRY.items())
    index = (f"<p><a href='../index.html'>API reference</a></p><h1>Methods</h1>"
             f"<table><tr><th>method</th><th>domain</th><th>what it does</th></tr>{items}</table>")
    (folder / "index.html").write_text(PAGE.format(title="speedkit methods", body=index), encoding="utf-8")
    return pages


# -- links in the output ----------------------------------------------------------------------------
class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.ids, self.assets = [], set(), set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        for key in ("href", "src"):
            if attrs.get(key):
                self.links.append(attrs[key])
                if tag in ("script", "img", "iframe") or (tag == "link" and attrs.get("rel") != "canonical"):
                    self.assets.add(attrs[key])  # what a browser fetches to show the page


def _parse(page: Path, cache: dict) -> _Links:
    if page not in cache:
        parser = _Links()
        parser.feed(page.read_text(encoding="utf-8"))
        cache[page] = parser
    return cache[page]


def broken_links(out: Path) -> list[str]:
    """Links that lead to no page, and links from the method pages to no anchor. Scripts and styles must be
    local (the reference reads offline); links to papers and pdoc's credit line may leave the site.

    Anchors inside pdoc's own pages are not held to this: pdoc links names in docstrings to members it then
    does not render (members inherited from torch classes or from private base classes), which
    :func:`dead_pdoc_anchors` counts.
    """
    cache: dict = {}
    broken = []
    for page in sorted(out.rglob("*.html")):
        for link in _parse(page, cache).links:
            parsed = urllib.parse.urlsplit(link)
            if parsed.scheme in ("http", "https") or link.startswith("//"):
                if link in _parse(page, cache).assets:
                    broken.append(f"{page.relative_to(out)}: loads {link} from the network")
                continue
            if parsed.scheme:  # data:, mailto:
                continue
            target = (page.parent / urllib.parse.unquote(parsed.path)).resolve() if parsed.path else page
            if not target.is_file():
                broken.append(f"{page.relative_to(out)}: {link} (no such page)")
            elif (page.parent == out / "methods" and parsed.fragment  # the card pages, not pdoc's speedkit/methods/
                  and parsed.fragment not in _parse(target, cache).ids):
                broken.append(f"{page.relative_to(out)}: {link} (no such anchor)")
    return broken


def dead_pdoc_anchors(out: Path) -> int:
    """Links within pdoc's pages to anchors that are not there (see :func:`broken_links`)."""
    cache: dict = {}
    dead = 0
    for page in sorted(out.rglob("*.html")):
        for link in _parse(page, cache).links:
            parsed = urllib.parse.urlsplit(link)
            if parsed.scheme or not parsed.fragment:
                continue
            target = (page.parent / urllib.parse.unquote(parsed.path)).resolve() if parsed.path else page
            dead += target.is_file() and parsed.fragment not in _parse(target, cache).ids
    return dead


# -- the whole build --------------------------------------------------------------------------------
def build(out: Path, modules: list[str] | None = None) -> list[str]:
    """Render the reference into ``out``; returns the broken references and links (empty: all good)."""
    import pdoc
    import pdoc.render

    modules = modules or module_names()
    _import_speedkits_public_names()
    pdoc.render.configure(docformat="restructuredtext", footer_text="speedkit API reference")
    with _lazy_names_unresolved():
        pdoc.pdoc(*modules, output_directory=out)
    problems = broken_docstring_references(modules)
    write_method_pages(out)
    return problems + broken_links(out)


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "build" / "docs"
    problems = build(out)
    for problem in problems:
        print(f"broken: {problem}", file=sys.stderr)
    print(f"{out / 'index.html'}: {len(module_names())} modules, method pages in {out / 'methods'}; "
          f"{len(problems)} broken reference(s); {dead_pdoc_anchors(out)} link(s) pdoc made to members it does "
          f"not render (inherited from torch or private classes)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
