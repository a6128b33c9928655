"""Streamed shards under DDP: two gloo ranks on CPU (torchrun) see disjoint samples that cover the epoch."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("litdata")

from streaming_data import make_image_folder  # noqa: E402

from speedkit.data.streaming import prepare_images  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # two torchrun launches: about a minute
ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "support" / "streaming_ranks_worker.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("workers", [0, 1])
def test_two_ranks_train_on_disjoint_samples_that_cover_the_epoch(tmp_path, workers):
    source = make_image_folder(tmp_path / "source", per_class=12)
    prepare_images(source, tmp_path / "shards", short_side=24, part_size=7, val_fraction=0.25, progress=False)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'support'}"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--nnodes", "1",
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), str(WORKER),
               str(tmp_path / "shards"), str(tmp_path), str(workers)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-6000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["world"] == 2 and r["status"] == "completed" and r["local_batch"] == 4 for r in ranks)
    a, b = (set(r["ids"]) for r in ranks)
    assert not a & b, "the ranks were served the same samples"
    assert len(ranks[0]["ids"]) == len(ranks[1]["ids"]) == 4 * ranks[0]["batches"]
    total = 3 * 12 - ranks[0]["val_size"]
    assert total - 8 < len(a | b) <= total  # all but the last samples that do not fill a global batch
    val = [r["val"] for r in ranks]
    assert not set(val[0]) & set(val[1]) and sorted(val[0] + val[1]) == list(range(ranks[0]["val_size"]))
