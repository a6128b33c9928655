"""How much live plotting slows training: the same run with and without the explorer's live curves.

JupyterLab on 127.0.0.1 and headless Chromium show the explorer notebook; a driver thread in the
kernel alternates a run with no UI at all (``BackgroundRun`` with no progress reports) and the
same configuration through ``explorer.run()`` with its FigureWidget, progress bar and status line
updating in the browser (A B A B ...). The kernel's main thread stays idle, as when a person
clicks Run, so it also handles the browser's replies. Training seconds (evaluation excluded) come
from the RunRecords.

    .venv/bin/python bench/results/2026-11-29-live-overhead/measure_live_overhead.py --repeats 3 --threads 2 --out bench/results/2026-11-29-live-overhead/live_overhead.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "support"))

from lab_server import CHROMIUM, CHROMIUM_FLAGS, lab_server, run_all_cells  # noqa: E402

SETUP = '''import threading
from speedkit.ui import BackgroundRun, MethodExplorer

explorer = MethodExplorer(recipe="mild", duration={duration!r}, device="cpu", data_fraction={fraction},
                          eval_fraction=0.2, eval_interval={duration!r}, run_dir={out!r})
explorer.display()'''

DRIVE = '''def drive():
    for i in range({repeats}):
        plain = explorer.config.make_trainer(run_dir={out!r}, run_name=f"plain-{{i}}")
        BackgroundRun(plain).start().wait()  # no progress reports, no figure
        explorer.run().wait()  # live curves, progress bar and status in the browser

threading.Thread(target=drive, daemon=True).start()'''


def write_notebook(folder: Path, out: Path, args) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    values = {"duration": args.duration, "fraction": args.data_fraction, "out": str(out), "repeats": args.repeats}
    nb.cells = [nbformat.v4.new_code_cell(SETUP.format(**values)), nbformat.v4.new_code_cell(DRIVE.format(**values))]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = folder / "overhead.ipynb"
    nbformat.write(nb, path)
    return path


def wait_for_records(out: Path, count: int, timeout: float) -> list[dict]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        records = [json.loads(p.read_text()) for p in out.glob("*/record.json")]
        done = [r for r in records if r["status"] in ("completed", "failed", "stopped")]
        if len(done) >= count:
            return done
        time.sleep(2)
    raise TimeoutError(f"only {len(done)} of {count} runs finished within {timeout}s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", default="1ep")
    parser.add_argument("--data-fraction", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=2, help="torch threads in the kernel (OMP_NUM_THREADS)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    folder = Path(tempfile.mkdtemp(prefix="speedkit-overhead-"))
    out = folder / "runs"
    write_notebook(folder, out, args)
    with lab_server(folder, env={"OMP_NUM_THREADS": str(args.threads)}) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1500, "height": 1400})
        page.goto(f"{url}/lab/tree/overhead.ipynb")
        run_all_cells(page)
        records = wait_for_records(out, 2 * args.repeats, timeout=3600)
        page.screenshot(path=folder / "overhead.png")
        browser.close()

    train_s = {r["name"]: r["timings"]["train_s"] for r in records}
    plain = [train_s[f"plain-{i}"] for i in range(args.repeats)]
    live = [t for name, t in sorted(train_s.items()) if not name.startswith("plain-")]
    ratios = [b / a for a, b in zip(plain, live)]
    result = {
        "what": "training seconds of the same run without UI and with the explorer's live plots in JupyterLab "
                "(headless Chromium), interleaved; ratio = live / plain, paired",
        "duration": args.duration, "data_fraction": args.data_fraction, "torch_threads": args.threads,
        "plain_train_s": plain, "live_train_s": live, "ratios": ratios,
        "median_overhead_percent": round(100 * (statistics.median(ratios) - 1), 2),
        "command": " ".join(["python", *sys.argv]),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
