"""Rewrite the generated parts of README.md: the methods and recipes tables (from the cards and
recipes) and the benchmark results (from bench/results/summary.json)."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from speedkit.experiments.bench.report import readme_table
from speedkit.methods import methods_table
from speedkit.tasks.recipes import RECIPES

SUMMARY = Path(__file__).resolve().parents[1] / "bench" / "results" / "summary.json"


def recipes_table() -> str:
    rows = ["| task | recipe | model | budget | methods | what it is |", "|---|---|---|---|---|---|"]
    for task, recipes in RECIPES.items():
        for name, r in recipes.items():
            methods = ", ".join(f"`{m}`" for m in r.methods) or "none"
            rows.append(f"| {task} | `{name}` | {r.model} | {r.duration}, batch {r.batch_size}, {r.precision} | "
                        f"{methods} | {r.summary} |")
    return "\n".join(rows)


def bench_results() -> str:
    if not SUMMARY.exists():
        return "No benchmark results are committed yet: `speedkit bench vision` writes them."
    return readme_table(json.loads(SUMMARY.read_text())).rstrip("\n")


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
    path.write_text(render(path.read_text()))
    print(f"updated {path}")
