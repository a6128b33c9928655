"""The notebook test tool: what is checked of a committed notebook, and its expected outputs for nbval.

Committed notebooks carry no outputs. The expected text outputs of cells marked ``# NBVAL_CHECK_OUTPUT`` live
beside them in ``expected_outputs/<stem>.json`` (by cell id); ``parameterized_copy`` puts them back into a copy
with parameters injected, which is what ``pytest --nbval-lax`` compares. ``check_committed`` says what is wrong
with a notebook as committed, and ``update_expected_outputs`` regenerates its expected outputs by running it
(``speedkit.cli.notebooks`` runs it).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

from speedkit.cli.notebooks import KERNEL, _imports, declared_parameters, load_params, run_notebook

CHECK_MARKER = "NBVAL_CHECK_OUTPUT"
_CHECK_TAG = "nbval-check-output"
EXPECTED_FOLDER = "expected_outputs"  # beside the notebooks: the check cells' expected outputs


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
                            f"run speedkit.cli.notebook_checks.update_expected_outputs")
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
