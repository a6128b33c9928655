"""Rewrite what is generated from the cards, the presets and the committed benchmark results: the README's
methods and recipes tables and its benchmark results (from bench/results/summary.json), and what each preset
reached, speedkit/tasks/presets/reached.json (from summary.json and bench/results/fresh_seeds.json)."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from speedkit.experiments.bench.report import preset_reached, readme_table
from speedkit.methods import methods_table
from speedkit.tasks.recipes import PRESETS
from speedkit.tasks.task import BUILT_IN_TASKS

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
SUMMARY, FRESH_SEEDS = RESULTS / "summary.json", RESULTS / "fresh_seeds.json"


def recipes_table() -> str:
    rows = ["| task | recipe | model | budget | methods | what it is |", "|---|---|---|---|---|---|"]
    for task in BUILT_IN_TASKS.values():
        for name, r in task.recipes.items():
            methods = ", ".join(f"`{m}`" for m in r.methods) or "none"
            rows.append(f"| {task.name} | `{name}` | {r.model} | {r.duration}, batch {r.batch_size}, {r.precision} | "
                        f"{methods} | {r.summary} |")
    return "\n".join(rows)


def bench_results() -> str:
    if not SUMMARY.exists():
        return "No benchmark results are committed yet: `speedkit bench --task fashion-mnist` writes them."
    return readme_table(json.loads(SUMMARY.read_text()), leave_one_out=False).rstrip("\n")  # those: summary.md


def reached_json() -> str:
    """presets/reached.json as it should be: what each preset reached in the committed benchmark."""
    figures = preset_reached(json.loads(SUMMARY.read_text()), json.loads(FRESH_SEEDS.read_text()))
    return json.dumps(figures, indent=1) + "\n"


SECTIONS = {"methods-table": methods_table, "recipes-table": recipes_table, "bench-results": bench_results}


def render(readme: str) -> str:
    for name, make in SECTIONS.items():
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
        if not pattern.search(readme):
            raise SystemExit(f"README.md has no {start} ... {end} section")
        readme = pattern.sub(lambda _: f"{start}\n{make()}\n{end}", readme)
    return readme


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "README.md")
    (PRESETS / "reached.json").write_text(reached_json())  # first: the recipes table reads the presets
    path.write_text(render(path.read_text()))
    print(f"updated {path} and {PRESETS / 'reached.json'}")
