"""`make lab` as the README says, run by whoever runs the tests (root in containers and CI): JupyterLab must
start and answer its status over 127.0.0.1. Set-up is skipped (`make -o setup`), the venv is the one running
the tests; the port and token come from a throwaway Jupyter config folder, so the Makefile's command is
exactly what a user runs."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from lab_server import free_port
from prerequisites import DEV_INSTALL, missing

ROOT = Path(__file__).resolve().parents[2]


def test_make_lab_starts_jupyterlab_as_this_user(tmp_path):
    if shutil.which("make") is None:
        missing("make", "sudo apt-get install make")
    if not Path(sys.executable).with_name("jupyter").exists():
        missing("jupyter", DEV_INSTALL)
    port = free_port()
    (tmp_path / "jupyter_server_config.py").write_text(
        f"c.ServerApp.ip = '127.0.0.1'\nc.ServerApp.port = {port}\nc.ServerApp.open_browser = False\n"
        "c.IdentityProvider.token = ''\n")
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path), "VENV": str(Path(sys.executable).parents[1])}
    log = open(tmp_path / "make-lab.log", "w")
    server = subprocess.Popen(["make", "-o", "setup", "lab"], cwd=ROOT, env=env, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        status = wait_for_status(f"http://127.0.0.1:{port}/api/status", server, tmp_path / "make-lab.log")
        assert "started" in status
        if os.geteuid() == 0:
            assert "--allow-root" in (tmp_path / "make-lab.log").read_text()
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # make and the server it started
        server.wait(timeout=30)
        log.close()


def wait_for_status(url: str, server: subprocess.Popen, log: Path, timeout: float = 90) -> dict:
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return json.load(response)
        except OSError:
            if server.poll() is not None or time.time() > deadline:
                pytest.fail(f"make lab did not start JupyterLab: {log.read_text()[-2000:]}")
            time.sleep(0.5)
