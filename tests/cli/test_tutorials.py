"""Every tutorial runs headlessly with its cpu-smoke parameters (the notebooks/ folder's in test_notebooks.py,
which also holds the tests of the runner itself and of the committed notebooks)."""
from __future__ import annotations

import pytest
from prerequisites import import_or_missing

import_or_missing("papermill")

from helpers import needs_fmnist  # noqa: E402
from notebook_checks import NBVAL_NOTEBOOK, assert_runs_with_smoke_parameters, smoke_in  # noqa: E402

# NBVAL_NOTEBOOK's smoke run is test_notebooks.py's nbval test (it asserts what this test does but the HTML export,
# which every other notebook's run checks).
SMOKE_TUTORIALS = [p for p in smoke_in("tutorials") if p.stem != NBVAL_NOTEBOOK]


@needs_fmnist
@pytest.mark.parametrize("path", SMOKE_TUTORIALS, ids=[p.stem for p in SMOKE_TUTORIALS])
def test_tutorial_runs_with_its_smoke_parameters(path, tmp_path):
    assert_runs_with_smoke_parameters(path, tmp_path)
