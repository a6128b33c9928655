"""``python -m speedkit train ...`` in a child process, as a user runs it: this checkout first on the path
(and the tests' support and task folders, for tasks that tests write), one thread, output captured."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def speedkit_train(*args: str, cwd: Path, wait: bool = True, **kwargs):
    """Run ``speedkit train ARGS`` in ``cwd``: a CompletedProcess, or with ``wait=False`` a Popen."""
    path = [str(REPO), str(REPO / "tests" / "support"), str(REPO / "tests" / "tasks"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "speedkit", "train", *args]
    if not wait:
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                **kwargs)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, **kwargs)
