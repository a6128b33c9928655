"""A JupyterLab server for browser checks: 127.0.0.1, empty token, stopped by its PID.

Used by the browser test and by bench/results/2026-11-29-live-overhead/measure_live_overhead.py.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
JUPYTER = Path(sys.executable).with_name("jupyter")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def lab_server(folder: Path, env: dict | None = None, start_timeout: float = 90):
    """Serve ``folder``; yields the base URL. The server's log is ``folder/jupyter.log``."""
    port = free_port()
    log = open(folder / "jupyter.log", "w")
    server = subprocess.Popen(
        [str(JUPYTER), "lab", "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
         "--ServerApp.token=", "--ServerApp.password=", f"--ServerApp.root_dir={folder}",
         f"--LabApp.workspaces_dir={folder / 'workspaces'}", f"--LabApp.user_settings_dir={folder / 'settings'}"],
        stdout=log, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + start_timeout
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"jupyter lab did not start: {(folder / 'jupyter.log').read_text()[-2000:]}")
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and the kernels it started
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def run_all_cells(page, timeout_ms: int = 90_000) -> None:
    """Open-notebook page: wait for the kernel, then Run > Run All Cells, as a user would."""
    import re

    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=timeout_ms)
    # the status bar says "Idle" once the kernel has started; cells sent earlier can be dropped
    page.locator(".jp-StatusBar-TextItem", has_text="Idle").first.wait_for(timeout=timeout_ms)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile("^Run All Cells$")).click()
