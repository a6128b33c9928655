"""Run the parametrized notebooks headlessly, as tutorials and as regression tests.

Each notebook in ``notebooks/`` and ``tutorials/`` takes its parameters from
``params/<set>/<notebook stem>.yaml`` (sets such as ``cpu-smoke`` and ``gpu``) and is executed with
papermill. Its RunRecords, the executed notebook and an HTML export land in ``<out>/<stem>/``; a
notebook fails when any cell raises, and the failure names the notebook's own exception.

Committed notebooks carry no outputs. The expected text outputs of cells marked
``# NBVAL_CHECK_OUTPUT`` live beside them in ``expected_outputs/<stem>.json`` (by cell id);
``parameterized_copy`` puts them back into a copy with parameters injected, which is what
``pytest --nbval-lax`` compares. ``check_committed`` says what is wrong with a notebook as
committed, and ``update_expected_outputs`` regenerates its expected outputs by running it.

Without a ``root``, ``run_notebooks`` runs the copy installed with the package (``speedkit.cli.shipped``),
so it works from any folder after ``pip install 'torch-speedkit[demo]'``; a checkout is run with ``root=``.

papermill, nbformat and nbconvert are imported only here (they come with ``torch-speedkit[demo]``), so the
Trainer never needs them.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from speedkit.cli.shipped import NOTEBOOK_FOLDERS, is_shipped, notebook_root
from speedkit.record.run_folder import remove_earlier_runs

KERNEL = "python3"
CHECK_MARKER = "NBVAL_CHECK_OUTPUT"
_CHECK_TAG = "nbval-check-output"
EXPECTED_FOLDER = "expected_outputs"  # beside the notebooks: the check cells' expected outputs
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


# -- committed notebooks and nbval --------------------------------------------------------------------
def is_check_cell(cell) -> bool:
    """A cell whose output nbval compares under ``--nbval-lax`` (the comment or the tag, as nbval reads them)."""
    marked = any(line.strip().lstrip("#").strip() == CHECK_MARKER
                 for line in cell.get("source", "").splitlines() if line.strip().startswith("#"))
    return marked or _CHECK_TAG in cell.get("metadata", {}).get("tags", [])


def expected_outputs_path(path: str | Path) -> Path:
    """Where the expected outputs of a notebook's check cells are kept: ``expected_outputs/<stem>.json``."""
    path = Path(path)
    return path.parent / EXPECTED_FOLDER / f"{path.stem}.json"


def load_expected_outputs(path: str | Path) -> dict[str, list]:
    """``{cell id: outputs}`` for the notebook's check cells; empty when it has none."""
    sidecar = expected_outputs_path(path)
    return json.loads(sidecar.read_text()) if sidecar.exists() else {}


def check_committed(path: str | Path) -> list[str]:
    """What is wrong with a notebook as committed: outputs, execution counts, a check cell without
    expected outputs, or a first code cell that is not a ``parameters`` cell with ``out_dir`` and
    ``device``. An empty list means it is clean."""
    nbformat, _ = _imports()
    nb = nbformat.read(str(path), as_version=4)
    problems = []
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    if not code or "parameters" not in code[0][1].metadata.get("tags", []):
        problems.append("the first code cell is not tagged 'parameters'")
    else:
        names = set(declared_parameters(path))
        problems += [f"the parameters cell does not set {name!r}" for name in ("out_dir", "device") if name not in names]
    expected = load_expected_outputs(path)
    for i, cell in code:
        if cell.get("execution_count") is not None:
            problems.append(f"cell {i} has an execution count")
        if cell.outputs:
            problems.append(f"cell {i} has outputs; commit notebooks without them")
        if is_check_cell(cell) and not expected.get(cell.get("id")):
            problems.append(f"check cell {i} has no expected outputs in {expected_outputs_path(path)}; "
                            f"run speedkit.cli.notebooks.update_expected_outputs")
    return problems


def _text(output) -> str:
    text = output.get("text") if output.get("output_type") == "stream" else output.get("data", {}).get("text/plain")
    return "".join(text) if isinstance(text, list) else (text or "")


def _text_outputs(outputs) -> list:
    """The text a check cell is compared on: stream text and text/plain results, without execution counts."""
    kept = []
    for output in outputs:
        if output.get("output_type") == "stream":
            kept.append({"output_type": "stream", "name": output["name"], "text": _text(output)})
        elif "text/plain" in output.get("data", {}):
            kept.append({"output_type": "display_data", "data": {"text/plain": _text(output)}, "metadata": {}})
    return kept


def check_cell_differences(notebook: str | Path, executed: str | Path) -> list[str]:
    """How the executed copy's check cells differ from the committed expected outputs (empty: none do), on
    the text nbval --nbval-lax compares. A run the runner already made is checked without running it again."""
    nbformat, _ = _imports()
    expected = load_expected_outputs(notebook)
    cells = [c for c in nbformat.read(str(executed), as_version=4).cells if c.cell_type == "code" and is_check_cell(c)]
    problems = [f"check cell {c.get('id')} has no expected outputs" for c in cells if c.get("id") not in expected]
    for cell in cells:
        got, want = _text_outputs(cell.outputs), expected.get(cell.get("id"))
        if want is not None and got != want:
            problems.append(f"check cell {cell.get('id')} printed {[_text(o) for o in got]!r}, expected "
                            f"{[_text(o) for o in want]!r}")
    return problems


def strip_notebook(nb):
    """A copy of ``nb`` ready to commit: no outputs or execution counts; papermill's injected cells
    and metadata dropped."""
    nbformat, _ = _imports()
    nb = copy.deepcopy(nb)
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
    for cell in nb.cells:
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.execution_count = None
            cell.outputs = []
    nb.metadata.pop("papermill", None)
    return nbformat.from_dict(nb)


def update_expected_outputs(path: str | Path, params: str | Path = "cpu-smoke", root: str | Path = ".",
                            out: str | Path = "runs/nb-expected") -> list[str]:
    """Run the notebook with its parameters and write the text outputs of its check cells to
    ``expected_outputs/<stem>.json``. Returns the check cells' ids. Use it after a deliberate change
    of what those cells print; review the diff before committing."""
    nbformat, _ = _imports()
    path = Path(path)
    values = load_params(params, path, root)
    if values is None:
        raise ValueError(f"{path.name} has no parameter file in set {str(params)!r}")
    result = run_notebook(path, values, Path(out) / path.stem, root)
    if result.failed:
        raise RuntimeError(f"{path.name} failed, so its expected outputs were not updated: {result.error}")
    executed = nbformat.read(str(result.executed), as_version=4)
    expected = {cell.id: _text_outputs(cell.outputs) for cell in executed.cells
                if cell.cell_type == "code" and is_check_cell(cell)}
    sidecar = expected_outputs_path(path)
    sidecar.parent.mkdir(exist_ok=True)
    sidecar.write_text(json.dumps(expected, indent=1) + "\n")
    return sorted(expected)


def parameterized_copy(path: str | Path, parameters: dict, dest: str | Path):
    """Write ``path`` with ``parameters`` injected (as papermill would) to ``dest``, unexecuted: for
    ``pytest --nbval-lax``, or for a person or a browser test to open and run.

    The check cells get their expected outputs back from ``expected_outputs/<stem>.json``, and a
    number: nbval compares a cell only if it counts as executed.
    """
    nbformat, papermill = _imports()
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    expected = load_expected_outputs(path)
    nb = load_notebook_node(str(path))  # papermill's reader adds the metadata its parameterizer expects
    nb = parameterize_notebook(nb, parameters, kernel_name=KERNEL, language="python")
    count = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            count += 1
            if is_check_cell(cell) and expected.get(cell.get("id")):
                cell.outputs = nbformat.from_dict(expected[cell.id])
                cell.execution_count = count
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(dest))
    return dest


__all__ = ["NotebookResult", "check_committed", "declared_parameters", "discover_notebooks", "format_summary",
           "expected_outputs_path", "is_check_cell", "load_expected_outputs", "load_params", "parameterized_copy",
           "param_sets", "run_notebook", "run_notebooks", "strip_notebook", "update_expected_outputs"]
