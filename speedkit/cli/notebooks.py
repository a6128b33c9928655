"""Run the parametrized notebooks headlessly, as tutorials and as regression tests.

Each notebook in ``notebooks/`` and ``tutorials/`` takes its parameters from
``params/<set>/<notebook stem>.yaml`` (sets such as ``cpu-smoke`` and ``gpu``) and is executed with
papermill. Its RunRecords, the executed notebook and an HTML export land in ``<out>/<stem>/``; a
notebook fails when any cell raises, and the failure names the notebook's own exception.

This module runs notebooks (``speedkit notebooks run``, the demo and the notebook tests use it); what the tests
check of a committed notebook and its expected outputs (nbval) is ``speedkit.cli.notebook_checks``.

Without a ``root``, ``run_notebooks`` runs the copy installed with the package (``speedkit.cli.shipped``),
so it works from any folder after ``pip install 'torch-speedkit[demo]'``; a checkout is run with ``root=``.

papermill, nbformat and nbconvert are imported only here (they come with ``torch-speedkit[demo]``), so the
Trainer never needs them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from speedkit.cli.shipped import NOTEBOOK_FOLDERS, is_shipped, notebook_root
from speedkit.record.run_folder import remove_earlier_runs

KERNEL = "python3"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclasses.dataclass
class NotebookResult:
    """How one notebook ran. ``status`` is "passed", "failed" or "no parameters" (not run)."""

    name: str
    path: Path
    status: str
    seconds: float = 0.0
    error: str | None = None  # "ValueError: ..." as the notebook raised it
    cell: int | None = None  # index of the failing cell
    out_dir: Path | None = None
    executed: Path | None = None  # the executed notebook
    html: Path | None = None

    @property
    def failed(self) -> bool:
        return self.status == "failed"


# -- finding notebooks and parameters ---------------------------------------------------------------
def _imports():
    try:
        import nbformat
        import papermill
    except ImportError as e:
        raise ImportError(f"running notebooks needs papermill and nbformat ({e}); "
                          f"install them with: pip install 'torch-speedkit[demo]'") from e
    return nbformat, papermill


def discover_notebooks(root: str | Path = ".") -> list[Path]:
    """Every ``notebooks/*.ipynb`` and ``tutorials/*.ipynb`` under ``root``, in name order per folder."""
    root = Path(root)
    paths = [p for folder in NOTEBOOK_FOLDERS for p in sorted((root / folder).glob("*.ipynb"))]
    stems: dict[str, Path] = {}
    for path in paths:
        if path.stem in stems:  # parameter files and output folders are named by stem
            raise ValueError(f"two notebooks are named {path.stem!r} ({stems[path.stem]} and {path}); "
                             f"rename one")
        stems[path.stem] = path
    return paths


def param_sets(root: str | Path = ".") -> list[str]:
    """The parameter sets under ``root/params`` (one folder each)."""
    folder = Path(root) / "params"
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def _param_folder(params: str | Path, root: Path) -> Path:
    """A set name under root/params, or a folder given by path."""
    folder = root / "params" / str(params)
    if folder.is_dir():
        return folder
    if Path(params).is_dir():
        return Path(params)
    raise ValueError(f"unknown parameter set {str(params)!r}; known sets under {root / 'params'}: "
                     f"{param_sets(root) or 'none'}")


def load_params(params: str | Path, notebook: str | Path, root: str | Path = ".") -> dict | None:
    """The parameters of ``notebook`` (a path or a stem) in set ``params``; None if the set has none for it."""
    path = _param_folder(params, Path(root)) / f"{Path(notebook).stem}.yaml"
    if not path.exists():
        return None
    import yaml

    values = yaml.safe_load(path.read_text()) or {}
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of parameter names to values, got {type(values).__name__}")
    return values


def _select(paths: list[Path], only: Iterable[str] | None, root: Path) -> list[Path]:
    if only is None:
        return paths
    if isinstance(only, str):
        only = [only]
    by_name = {p.stem: p for p in paths}
    chosen = []
    for name in only:
        stem = Path(name).stem  # accept "t1_functional_api", "t1_functional_api.ipynb" or a path
        if stem not in by_name:
            folders = " or ".join(f"{root / f}" for f in NOTEBOOK_FOLDERS)
            raise ValueError(f"no notebook named {name!r} in {folders}; known: {sorted(by_name) or 'none'}")
        chosen.append(by_name[stem])
    return chosen


def declared_parameters(path: str | Path) -> dict[str, Any]:
    """The names and default values (as written) in the notebook's ``parameters`` cell."""
    _, papermill = _imports()
    return {name: p["default"] for name, p in papermill.inspect_notebook(str(path)).items()}


# -- running ------------------------------------------------------------------------------------------
def _first_line(text: str) -> str:
    lines = [line.strip() for line in _ANSI.sub("", text).splitlines() if line.strip()]
    return lines[0] if lines else ""


def _export_html(executed: Path) -> Path:
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_filename(str(executed))
    html = executed.with_suffix(".html")
    html.write_text(body, encoding="utf-8")
    return html


def run_notebook(path: str | Path, parameters: dict, out_dir: str | Path, root: str | Path = ".",
                 timeout: float | None = None, progress: Callable[[str], None] | None = None) -> NotebookResult:
    """Execute one notebook with ``parameters`` (plus ``out_dir``) in a fresh kernel started in ``root``.

    Writes ``<out_dir>/<stem>.ipynb`` and ``<out_dir>/<stem>.html`` even when a cell fails, so the
    failure can be read where it happened. ``timeout`` limits each cell, in seconds. ``progress`` (e.g.
    ``print``) hears each cell as it starts and every line the notebook prints, while it runs.
    """
    _, papermill = _imports()
    path, root = Path(path).resolve(), Path(root).resolve()
    out_dir = Path(out_dir).resolve()  # the kernel runs in root, so pass it an absolute folder
    out_dir.mkdir(parents=True, exist_ok=True)
    result = NotebookResult(path.stem, path, "failed", out_dir=out_dir, executed=out_dir / f"{path.stem}.ipynb")
    for stale in (result.executed, result.executed.with_suffix(".html")):  # never report an earlier run's files
        stale.unlink(missing_ok=True)
    remove_earlier_runs(out_dir)  # a rerun replaces the notebook's runs (run folders refuse to be started over)
    parameters = {**parameters, "out_dir": str(out_dir)}

    # papermill only warns about parameters the notebook does not declare; a typo in a parameter file
    # would then run the notebook at its defaults and pass, so refuse it here.
    declared = declared_parameters(path)
    unknown = sorted(set(parameters) - set(declared))
    if unknown:
        result.error = (f"{path.name} does not declare {unknown} in its 'parameters' cell "
                        f"(it declares {sorted(declared)})")
        return result

    start = time.perf_counter()
    try:
        with _kernel_over_ipc() as config, _streamed(path, progress) as streaming, _no_progress_bars():
            papermill.execute_notebook(str(path), str(result.executed), parameters=parameters, kernel_name=KERNEL,
                                       cwd=str(root), progress_bar=False, execution_timeout=timeout,
                                       config=config, **streaming)
        result.status = "passed"
    except papermill.PapermillExecutionError as e:
        # The notebook's own exception, e.g. the library's ValueError, not papermill's wrapper.
        result.error, result.cell = f"{e.ename}: {_ANSI.sub('', e.evalue)}", e.cell_index
    except Exception as e:  # a dead kernel, a cell timeout, a notebook papermill cannot read
        result.error = f"{type(e).__name__}: {e}"
    result.seconds = time.perf_counter() - start
    if result.executed.exists():
        try:
            result.html = _export_html(result.executed)
        except Exception as e:  # the notebook ran; an unexportable output is still a failure to report
            result.status, result.error = "failed", result.error or f"HTML export failed: {type(e).__name__}: {e}"
    return result


@contextlib.contextmanager
def _no_progress_bars():
    """Kernels inherit the environment: no Trainer draws a bar in a notebook nobody watches (a bar the
    user asks for with SPEEDKIT_PROGRESS=1 stays)."""
    from speedkit.callbacks.monitors import PROGRESS_ENV

    before = os.environ.get(PROGRESS_ENV)
    os.environ.setdefault(PROGRESS_ENV, "0")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PROGRESS_ENV, None)


@contextlib.contextmanager
def _kernel_over_ipc():
    """A kernel configuration that talks over Unix sockets in a private folder instead of TCP on 127.0.0.1:
    nothing else on the machine can reach it, and ipykernel 7 has no reason to warn that TCP is unencrypted.
    Windows has no such sockets: there the kernel keeps jupyter's TCP default."""
    import os
    import tempfile

    from traitlets.config import Config

    if os.name != "posix":
        yield Config()
        return
    with tempfile.TemporaryDirectory(prefix="speedkit-kernel-") as folder:
        yield Config({"KernelManager": {"transport": "ipc", "ip": str(Path(folder) / "kernel")}})


class _Lines:
    """A file papermill writes the kernel's output to; hands each complete line to ``progress``."""

    def __init__(self, progress: Callable[[str], None], prefix: str = "    "):
        self.progress, self.prefix, self.pending = progress, prefix, ""

    def write(self, text: str) -> None:
        *lines, self.pending = (self.pending + text.replace("\r", "\n")).split("\n")
        for line in lines:
            if line.strip():
                self.progress(self.prefix + line)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.pending.strip():
            self.progress(self.prefix + self.pending)
        self.pending = ""


@contextlib.contextmanager
def _streamed(path: Path, progress: Callable[[str], None] | None):
    """papermill's arguments that stream a run to ``progress``: each cell as it starts (papermill logs
    "Executing Cell N" when ``log_output`` is on; only those records are passed on) and the output lines."""
    if progress is None:
        yield {}
        return
    import logging

    nbformat, _ = _imports()
    cells = []
    for cell in nbformat.read(str(path), as_version=4).cells:  # as papermill runs them:
        cells.append(cell.source)
        if "parameters" in cell.metadata.get("tags", []):  # its injected cell follows the parameters cell
            cells.append("# parameters injected by papermill")
    total = len(cells)

    class CellStarts(logging.Handler):
        def emit(self, record):
            found = re.match(r"Executing Cell (\d+)", record.getMessage())
            if found:
                n = int(found.group(1))
                source = cells[n - 1] if n <= total else ""
                first = next((line for line in source.splitlines() if line.strip()), "")
                progress(f"[cell {n}/{total}] {first[:100]}")

    logger = logging.getLogger("papermill")
    handler, level = CellStarts(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    out, err = _Lines(progress), _Lines(progress, prefix="    ! ")
    try:
        yield {"log_output": True, "stdout_file": out, "stderr_file": err}
    finally:
        out.close(), err.close()
        logger.removeHandler(handler)
        logger.setLevel(level)


def run_notebooks(params: str | Path = "cpu-smoke", out: str | Path = "runs/nb", root: str | Path | None = None,
                  only: Iterable[str] | None = None, overrides: dict | None = None, timeout: float | None = None,
                  progress: Callable[[str], None] | None = None,
                  stream: Callable[[str], None] | None = None) -> list[NotebookResult]:
    """Run every notebook under ``root`` (or those named in ``only``) with parameter set ``params``.

    ``root`` is a checkout (its notebooks run with the kernel in it, as before); without it, the copy
    installed with speedkit runs, with the kernel in the current folder.

    ``progress`` hears which notebook starts and how it ended; ``stream`` also each cell and output line.

    ``overrides`` replace parameters of every notebook run (like papermill's ``-p``). A notebook
    without a parameter file in the set is reported as "no parameters" and not run: running it at
    its defaults could take hours, and passing silently would hide the missing file.
    """
    root = notebook_root(root)
    kernel_dir = Path.cwd() if is_shipped(root) else root  # never write into the installed package
    folder = _param_folder(params, root)
    paths = _select(discover_notebooks(root), only, root)
    if not paths:
        raise ValueError(f"no notebooks found in {' or '.join(str(root / f) for f in NOTEBOOK_FOLDERS)}")
    results = []
    for path in paths:
        values = load_params(folder, path, root)
        if values is None:
            result = NotebookResult(path.stem, path, "no parameters",
                                    error=f"no {folder / (path.stem + '.yaml')}")
        else:
            if progress:
                progress(f"running {path.relative_to(root) if path.is_relative_to(root) else path} ...")
            result = run_notebook(path, {**values, **(overrides or {})}, Path(out) / path.stem, kernel_dir, timeout,
                                  progress=stream)
        if progress:
            progress(f"  {result.status} ({result.seconds:.1f}s){': ' + _first_line(result.error) if result.failed else ''}")
        results.append(result)
    return results


def format_summary(results: Iterable[NotebookResult]) -> str:
    """A table: notebook, result, seconds, and the first line of the error for failures."""
    results = list(results)
    rows = [(r.name, r.status, f"{r.seconds:.1f}s" if r.status != "no parameters" else "-",
             _first_line(r.error or "") + (f" (cell {r.cell})" if r.cell is not None else "") if r.failed else "")
            for r in results]
    header = ("notebook", "result", "time", "error")
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(3)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row[:3], widths)) + "  " + row[3] for row in [header, *rows]]
    lines = [line.rstrip() for line in lines]
    counts = {s: sum(r.status == s for r in results) for s in ("passed", "failed", "no parameters")}
    lines.append(f"{counts['passed']} passed, {counts['failed']} failed, {counts['no parameters']} without parameters")
    return "\n".join(lines)


__all__ = ["NotebookResult", "declared_parameters", "discover_notebooks", "format_summary", "load_params",
           "param_sets", "run_notebook", "run_notebooks"]


def add_parser(commands) -> None:
    notebooks = commands.add_parser("notebooks", allow_abbrev=False, help="run the notebooks and tutorials headlessly with papermill")
    actions = notebooks.add_subparsers(dest="action", required=True)
    run = actions.add_parser("run", allow_abbrev=False, help="run every notebook with a parameter set; exit status 1 if any fails")
    run.add_argument("--params", default="cpu-smoke", help="parameter set: a folder under ROOT/params (cpu-smoke, gpu)")
    run.add_argument("--out", default="runs/nb", help="each notebook's records, executed copy and HTML go to OUT/<name>/")
    run.add_argument("--only", nargs="+", metavar="NAME", help="run only these notebooks (names without .ipynb)")
    run.add_argument("--root", help="a checkout holding notebooks/, tutorials/ and params/ (default: the copy "
                     "installed with speedkit)")
    run.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                     help="override a parameter of every notebook run (VALUE is read as YAML)")
    run.add_argument("--timeout", type=float, help="seconds any one cell may take")
    where = actions.add_parser("where", allow_abbrev=False, help="print the folder holding the notebooks, tutorials and params")
    where.add_argument("--root", help="a checkout to check instead of the installed copy")
    copy = actions.add_parser("copy", allow_abbrev=False, help="copy the notebooks, tutorials and params into a folder "
                              "of yours, to open and edit them (nothing there is replaced)")
    copy.add_argument("destination", nargs="?", default="speedkit-notebooks", help="the folder (default: "
                      "./speedkit-notebooks)")
    copy.add_argument("--root", help="copy from this checkout instead of the installed copy")


def run(args) -> int:
    import yaml

    from speedkit.cli.shipped import copy_notebooks

    if args.action == "where":
        print(notebook_root(args.root))
        return 0
    if args.action == "copy":
        written = copy_notebooks(args.destination, root=args.root)
        print(f"copied {len(written)} files into {Path(args.destination).expanduser()}; open them with: "
              f"jupyter lab {args.destination}")
        return 0
    overrides = {}
    for name, value in args.parameter:
        try:
            overrides[name] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise ValueError(f"notebooks run -p {name} {value!r}: the value is read as plain YAML and this is not "
                             f"({' '.join(str(e).split())}); quote it as a string (-p {name} \"'{value}'\") or give "
                             f"a number, true/false, a list or a mapping") from None
    results = run_notebooks(args.params, out=args.out, root=args.root, only=args.only, overrides=overrides,
                            timeout=args.timeout, progress=print)
    print(format_summary(results))
    return 1 if any(r.failed for r in results) else 0
