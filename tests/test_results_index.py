"""bench/results/INDEX.md is generated from the study folders (`make readme`, scripts/update_readme.py): it is never
stale, a study folder says what it is, nothing lies loose at the top of bench/results, and every link a study's
README.md makes leads to a file."""
from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def _update_readme():
    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "scripts" / "update_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_index_is_generated_from_the_study_folders():
    index = (RESULTS / "INDEX.md").read_text()
    assert _update_readme().results_index() == index, "bench/results/INDEX.md is stale: run `make readme`"
    studies = [p.name for p in RESULTS.iterdir() if p.is_dir() and re.fullmatch(r"\d{4}-\d{2}-\d{2}-.+", p.name)]
    assert studies and all(f"]({name}/README.md)" in index for name in studies)


def _small_results(tmp_path: Path) -> Path:
    results = tmp_path / "bench" / "results"
    study = results / "2026-12-06-a-study"
    (study / "before").mkdir(parents=True)
    (study / "README.md").write_text("# What a study measured\n\nIts command and what it found.\n")
    (study / "summary.json").write_text("{}")
    shutil.copy(RESULTS / "summary.json", results / "summary.json")
    return results


def test_a_new_study_shows_in_the_index_with_its_title_and_files(tmp_path):
    index = _update_readme().results_index(_small_results(tmp_path))
    row = next(line for line in index.splitlines() if "2026-12-06-a-study" in line)
    assert row.startswith("| 2026-12-06 | [What a study measured](2026-12-06-a-study/README.md) |")
    assert "`before/`" in row and "`summary.json`" in row and "README.md`" not in row
    assert "[summary.json](summary.json)" in index  # a standing file, in the second table


def test_a_loose_result_or_a_study_without_its_paragraph_stops_the_index(tmp_path):
    module, results = _update_readme(), _small_results(tmp_path)
    (results / "new_timing.json").write_text("{}")
    with pytest.raises(SystemExit, match="new_timing.json is not a study: move it into a dated study folder"):
        module.results_index(results)
    (results / "new_timing.json").unlink()
    (results / "2026-12-07-untitled").mkdir()
    with pytest.raises(SystemExit, match="2026-12-07-untitled/README.md must start with the study's title"):
        module.results_index(results)


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")


@pytest.mark.parametrize("readme", sorted(RESULTS.glob("*/README.md")) + [RESULTS / "INDEX.md"],
                         ids=lambda p: str(p.relative_to(RESULTS)))
def test_every_link_of_a_study_leads_to_a_file(readme):
    targets = [t for t in LINK.findall(readme.read_text()) if not t.startswith(("http://", "https://"))]
    assert [t for t in targets if not (readme.parent / t).exists()] == []
