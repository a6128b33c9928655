"""Rewrite the generated parts of README.md (the methods table) from the method cards."""
from __future__ import annotations

import re
import sys
from pathlib import Path

from speedkit.algorithms import methods_table

START, END = "<!-- methods-table:start -->", "<!-- methods-table:end -->"


def render(readme: str) -> str:
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(readme):
        raise SystemExit(f"README.md has no {START} ... {END} section")
    return pattern.sub(lambda _: f"{START}\n{methods_table()}\n{END}", readme)


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "README.md")
    path.write_text(render(path.read_text()))
    print(f"updated {path}")
