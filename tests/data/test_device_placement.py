"""Where the in-memory loader keeps its set: on the device when it fits, else on the host with pinned,
non-blocking copies started one batch ahead. The decision and the copy order are checked on a CPU."""
from __future__ import annotations

import pytest
import torch

from speedkit.data.batch_loader import Augment, BatchLoader, choose_placement

GiB = 1 << 30


@pytest.mark.parametrize("dataset_gib, free_gib, expected", [(0.05, 80, "device"), (20, 80, "device"),
                                                             (21, 80, "host"), (2, 4, "host")])
def test_auto_keeps_the_set_on_the_gpu_where_it_fits(dataset_gib, free_gib, expected):
    assert choose_placement("auto", torch.device("cuda"), int(dataset_gib * GiB), int(free_gib * GiB)) == expected


def test_a_cpu_has_no_copy_to_save_and_a_choice_given_is_kept():
    assert choose_placement("auto", torch.device("cpu"), 100 * GiB) == "device"
    assert choose_placement("host", torch.device("cpu"), 1) == "host"
    with pytest.raises(ValueError, match="placement must be one of"):
        choose_placement("gpu", torch.device("cpu"), 1)


def loader(placement, copies):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 256, (40, 8, 8), dtype=torch.uint8, generator=g), torch.randint(0, 3, (40,), generator=g)
    made = BatchLoader(x, y, 8, augment=Augment(crop_pad=2, flip="random"), mean=0.5, std=0.25, seed=1,
                       placement=placement)
    start_copy = made._start_copy

    def counted(batch):
        copies.append(len(batch))  # tensors copied host -> device for one batch
        return start_copy(batch)

    made._start_copy = counted
    return made


def test_host_placement_copies_each_batch_once_one_batch_ahead_and_yields_the_same_batches():
    on_device, on_host = [], []
    device_batches = list(loader("device", on_device))
    host = loader("host", on_host)
    copies_when_yielded = []
    host_batches = []
    for batch in host:
        copies_when_yielded.append(len(on_host))
        host_batches.append(batch)
    assert on_device == []  # the set on the device: not one copy per step
    assert on_host == [2] * 5  # images and labels, once per batch
    assert copies_when_yielded == [2, 3, 4, 5, 5]  # batch k+1's copy started before batch k is handed over
    for (xd, yd), (xh, yh) in zip(device_batches, host_batches, strict=True):
        assert torch.equal(xd, xh) and torch.equal(yd, yh)
