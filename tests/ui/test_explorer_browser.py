"""The explorer in a real browser: JupyterLab on 127.0.0.1, Debian's Chromium driven by playwright.

The test opens notebooks/01_method_explorer.ipynb (with small parameters injected the way papermill
does), runs its cells, toggles methods (and sees the conflict message), runs a short training and
waits for the live plot and the run board to fill, then starts a long run and stops it with the
Stop button, and checks on disk that the stopped run kept its record and checkpoint. Screenshots
go to ``runs/test-artifacts/browser/``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from helpers import needs_fmnist
from lab_server import CHROMIUM, CHROMIUM_FLAGS, lab_server, run_all_cells
from prerequisites import import_or_missing

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("SPEEDKIT_ARTIFACTS", REPO / "runs" / "test-artifacts")) / "browser"

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture
def jupyter_lab(tmp_path):
    # One torch thread in the kernel: Chromium and the server use the same 2 cores, and two torch
    # threads that keep losing their core to them were measured to train 10-30x slower.
    with lab_server(tmp_path, env={"OMP_NUM_THREADS": "1"}) as url:
        yield url, tmp_path


def _explorer_notebook(folder: Path, out_dir: Path) -> Path:
    """The explorer notebook with small parameters injected after its parameters cell, as papermill would."""
    from speedkit.cli.notebook_checks import parameterized_copy

    return parameterized_copy(REPO / "notebooks" / "01_method_explorer.ipynb",
                              {"live": True, "device": "cpu", "duration": "40ba", "data_fraction": 0.1,
                               "eval_fraction": 0.2, "out_dir": str(out_dir), "configs": []},
                              folder / "explorer.ipynb")


def _plot_points(page) -> int:
    """Points drawn in the live figure (the first plotly graph in the page)."""
    return page.evaluate("""() => {
        const gd = document.querySelector('.js-plotly-plot');
        return gd && gd.data ? gd.data.reduce((n, t) => n + (t.x ? t.x.length : 0), 0) : 0;
    }""")


@needs_fmnist
@pytest.mark.prerequisite("chromium")  # checked before the jupyter_lab fixture starts a server
def test_explorer_in_jupyterlab(jupyter_lab):
    sync_api = import_or_missing("playwright.sync_api")
    expect, sync_playwright = sync_api.expect, sync_api.sync_playwright

    url, folder = jupyter_lab
    out_dir = folder / "runs"
    _explorer_notebook(folder, out_dir)
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1500, "height": 1800})
        try:
            page.goto(f"{url}/lab/tree/explorer.ipynb")
            page.locator(".jp-Notebook").first.wait_for(timeout=90_000)
            run_all_cells(page)
            run_button = page.locator(".widget-button", has_text=re.compile("^Run$"))
            run_button.wait_for(timeout=120_000)
            page.screenshot(path=ARTIFACTS / "1-explorer.png")

            # toggling two label-mixing methods shows the engine's conflict and blocks Run
            def checkbox(name):
                label = page.locator("span", has_text=re.compile(f"^{name}$"))
                return page.locator(".widget-checkbox").filter(has=label).locator("input").first

            checkbox("cutmix").check()
            checkbox("mixup").check()
            expect(page.get_by_text("both take the role")).to_be_visible(timeout=20_000)
            expect(run_button).to_be_disabled()
            expect(page.locator(".widget-toggle-button.mod-active", has_text="custom")).to_be_visible()
            page.screenshot(path=ARTIFACTS / "2-conflict.png")
            checkbox("mixup").uncheck()
            expect(page.get_by_text("both take the role")).to_have_count(0, timeout=20_000)

            # a short run: the live plot fills and the run lands on the board
            run_button.click()
            page.wait_for_function("""() => {
                const gd = document.querySelector('.js-plotly-plot');
                return gd && gd.data && gd.data.some(t => t.x && t.x.length > 0);
            }""", timeout=180_000)
            board = page.locator("table.speedkit-board")
            expect(board.locator("td", has_text="completed")).to_have_count(1, timeout=180_000)
            expect(board).to_contain_text("cutmix")
            assert _plot_points(page) > 0
            board.scroll_into_view_if_needed()
            page.screenshot(path=ARTIFACTS / "3-first-run.png", full_page=True)

            # a long run, stopped with the Stop button while it trains
            page.locator(".widget-text", has_text="duration").locator("input").fill("5000ba")
            page.keyboard.press("Tab")
            expect(run_button).to_be_enabled(timeout=20_000)
            run_button.click()
            page.locator(".speedkit-status", has_text=re.compile(r"batch [1-9]")).wait_for(timeout=120_000)
            page.screenshot(path=ARTIFACTS / "4-second-run-training.png", full_page=True)
            page.locator(".widget-button", has_text=re.compile("^Stop$")).click()
            expect(board.locator("td", has_text="stopped")).to_have_count(1, timeout=120_000)
            board.scroll_into_view_if_needed()
            page.screenshot(path=ARTIFACTS / "5-stopped.png", full_page=True)
        finally:
            page.screenshot(path=ARTIFACTS / "last.png", full_page=True)
            (ARTIFACTS / "last.html").write_text(page.content())
            browser.close()

    records = {r.parent.name: json.loads(r.read_text()) for r in out_dir.glob("*/record.json")}
    assert len(records) == 2, sorted(records)
    stopped = [name for name, r in records.items() if r["status"] == "stopped"]
    assert len(stopped) == 1, {name: r["status"] for name, r in records.items()}
    record = records[stopped[0]]
    assert record["stop_reason"] == "stopped from the explorer"
    assert 0 < record["evals"][-1]["batch"] < 5000, "the stopped run should end early, evaluated where it stopped"
    assert (out_dir / stopped[0] / "checkpoints" / "latest.ckpt").exists()
    assert {m["name"] for m in record["methods"]} >= {"cutmix"}
