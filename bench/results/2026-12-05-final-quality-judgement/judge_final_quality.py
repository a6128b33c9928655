"""Judge committed benchmark summaries at their baselines' final quality, where they were written before
`speedkit bench` did (issue 57): each recipe's seeds that ended at or beyond the strongest baseline's final
quality, and, where that level is the summary's own target, the times and speed-ups to it. The runs behind
these summaries were not committed, so a level above the target has no times here (the summary says so);
`speedkit bench --reuse --run-dir RUNS --out DIR` judges it in full where the runs were kept.

    python bench/results/2026-12-05-final-quality-judgement/judge_final_quality.py [SUMMARY.json ...]     # default: every summary under bench/results

A summary already judged is left as it is.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from speedkit.experiments.summary import add_final_quality
from speedkit.experiments.report import summary_markdown

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "bench" / "results"


def judge_summary_file(path: str | Path) -> list[str]:
    """Judge a benchmark summary written before final quality was (its runs not kept beside it) at its baselines'
    final quality (``add_final_quality`` without records), and rewrite it and its markdown (the ``.md`` of the
    same name, where there is one, or summary.md). Entries already judged keep what their runs gave. Returns the
    keys it judged; none for a file that is not a benchmark summary."""
    path = Path(path)
    summary = json.loads(path.read_text())
    entries = summary.items() if isinstance(summary, dict) else ()
    judged = [key for key, entry in entries
              if isinstance(entry, dict) and "strongest_baseline" in entry and "final_quality" not in entry]
    for key in judged:
        add_final_quality(summary[key])
    if judged:
        path.write_text(json.dumps(summary, indent=1))
        markdown = path.with_suffix(".md")
        if markdown.exists() or path.name == "summary.json":
            markdown.write_text(summary_markdown(summary))
    return judged


def committed_summaries() -> list[Path]:
    """Every benchmark summary under bench/results, the searches' (bench/results/2026-11-30-recipe-searches) left
    out."""
    gpu_run = [p for p in RESULTS.glob("2026-12-04-first-gpu-run/*.json") if p.name != "alibi_step.json"]
    found = [*RESULTS.rglob("summary.json"), *gpu_run]
    return sorted({p for p in found if "2026-11-30-recipe-searches" not in p.relative_to(RESULTS).parts})


def main(paths: list[str]) -> None:
    for path in [Path(p) for p in paths] or committed_summaries():
        judged = judge_summary_file(path)
        if judged:
            print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: judged {', '.join(judged)}")


if __name__ == "__main__":
    main(sys.argv[1:])
