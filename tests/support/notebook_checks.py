"""What the notebook tests share: where the notebooks are, which have cpu-smoke parameters, and the check that
one of them runs with them (tests/cli/test_notebooks.py for notebooks/, test_tutorials.py for tutorials/)."""
from __future__ import annotations

from pathlib import Path

from speedkit.cli.notebook_checks import check_cell_differences
from speedkit.cli.notebooks import discover_notebooks, load_params, run_notebooks

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = discover_notebooks(ROOT)
SMOKE = [p for p in NOTEBOOKS if load_params("cpu-smoke", p, ROOT) is not None]
# The tutorial that tests/cli/test_notebooks.py runs under ``pytest --nbval-lax`` as a user would. That run is also
# its smoke run (same parameters, every cell run, the check cells compared, a RunRecord written), so
# test_tutorials.py does not run it through the runner a second time.
NBVAL_NOTEBOOK = "t3_write_your_own_method"


def smoke_in(folder: str) -> list[Path]:
    """The notebooks under ``folder`` (notebooks or tutorials) that have cpu-smoke parameters."""
    return [p for p in SMOKE if p.parent.name == folder]


def assert_runs_with_smoke_parameters(path: Path, tmp_path: Path) -> None:
    """The notebook runs headlessly with its cpu-smoke parameters, writes a RunRecord and its HTML, and its check
    cells print what the committed expected outputs say (what nbval --nbval-lax would compare)."""
    [result] = run_notebooks("cpu-smoke", out=tmp_path, root=ROOT, only=[path.stem])
    assert result.status == "passed", (f"{path.name} failed in cell {result.cell}: {result.error} "
                                       f"(executed copy: {result.executed})")
    assert list((tmp_path / path.stem).rglob("record.json")), f"{path.name} wrote no RunRecord into out_dir"
    assert result.html is not None and result.html.stat().st_size > 0
    assert check_cell_differences(path, result.executed) == []
