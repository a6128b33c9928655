"""How many data-loading worker processes a run gets when the user names none."""
from __future__ import annotations

import os

import pytest
import torch
from helpers import needs_fmnist

from speedkit.core.devices import MAX_LOADER_WORKERS, loader_workers


@pytest.mark.parametrize("cores, expected", [(1, 0), (4, 3), (64, MAX_LOADER_WORKERS)])
def test_a_gpu_gets_every_core_but_one_up_to_a_cap_and_a_cpu_none(monkeypatch, cores, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert loader_workers(None, torch.device("cuda")) == expected
    assert loader_workers(None, torch.device("cpu")) == 0  # a CPU's cores run the step itself
    assert loader_workers(2, torch.device("cuda")) == 2 and loader_workers(0, torch.device("cuda")) == 0


def test_processes_sharing_a_machine_share_its_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(32)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun: four GPUs' processes on this machine
    assert loader_workers(None, torch.device("cuda")) == 7


@needs_fmnist
def test_the_run_request_reaches_the_tasks_loader(tmp_path):
    from speedkit.tasks import make_trainer

    def loader(**options):
        trainer = make_trainer("fashion-mnist", "baseline", device="cpu", duration="1ba", data_fraction=0.01,
                               run_dir=tmp_path, save_checkpoints=False, **options)
        return trainer.state.train_dataloader

    assert isinstance(loader(), torch.utils.data.DataLoader)  # the hand-written baseline's own DataLoader
    assert loader().num_workers == 0 and loader(num_workers=2).num_workers == 2
