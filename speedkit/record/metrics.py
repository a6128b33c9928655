"""Evaluation metrics and the Evaluator that pairs them with a dataloader."""
from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import torch
import torch.nn.functional as F

from speedkit.core.devices import to_host
from speedkit.core.time import Time


def flatten_logits(outputs: torch.Tensor, targets: torch.Tensor):
    """Logits [..., C] and targets [...] (index) or [..., C] (dense) to 2-D / 1-D."""
    if outputs.dim() > 2:
        dense = targets.shape == outputs.shape
        outputs = outputs.reshape(-1, outputs.shape[-1])
        targets = targets.reshape(-1, outputs.shape[-1]) if dense else targets.reshape(-1)
    return outputs, targets


class Metric:
    """Accumulates over evaluation batches; ``compute`` returns a float.

    ``sum_states`` names the attributes that add up over batches (and so over ranks): in a run on
    several processes each rank evaluates its shard of the eval set and these are summed across
    ranks before ``compute`` (``speedkit.core.distributed.reduce_metrics``). A ``torchmetrics.Metric`` works as
    it is (:class:`TorchMetric` wraps it; it synchronizes itself).

    The states may be tensors on the device, added to without reading them (a read per batch would make
    the host wait for every evaluation batch); :func:`compute_metrics` reads all of an evaluator's
    states in one go and then calls ``compute`` on Python numbers.
    """

    lower_is_better = False
    sum_states: tuple[str, ...] = ()

    def reset(self) -> None:
        raise NotImplementedError

    def update(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        raise NotImplementedError

    def compute(self) -> float:
        raise NotImplementedError


class Accuracy(Metric):
    """Top-k accuracy for class logits; targets are indices (or dense labels, argmaxed)."""

    sum_states = ("correct", "total")

    def __init__(self, topk: int = 1):
        if topk < 1:
            raise ValueError(f"Accuracy(topk=...) must be >= 1, got {topk}")
        self.topk = topk
        self.reset()

    def reset(self):
        self.correct = 0
        self.total = 0

    @torch.no_grad()
    def update(self, outputs, targets):
        outputs, targets = flatten_logits(outputs, targets)
        if targets.dim() == 2:
            targets = targets.argmax(dim=1)
        top = outputs.topk(self.topk, dim=1).indices
        self.correct = self.correct + (top == targets.unsqueeze(1)).any(dim=1).sum()  # stays on the device
        self.total += targets.numel()

    def compute(self):
        return float(self.correct) / self.total if self.total else float("nan")


class CrossEntropy(Metric):
    """Mean cross-entropy in nats per target."""

    lower_is_better = True
    sum_states = ("sum", "count")

    def __init__(self):
        self.reset()

    def reset(self):
        self.sum = 0.0
        self.count = 0

    @torch.no_grad()
    def update(self, outputs, targets):
        outputs, targets = flatten_logits(outputs, targets)
        # Summed in float64 on the device: an evaluation set's worth of per-batch sums keeps its digits.
        self.sum = self.sum + F.cross_entropy(outputs.float(), targets, reduction="sum").double()
        self.count += outputs.shape[0]

    def compute(self):
        return float(self.sum) / self.count if self.count else float("nan")


class Perplexity(CrossEntropy):
    def compute(self):
        return math.exp(super().compute())


class BitsPerByte(CrossEntropy):
    """Cross-entropy in bits, for byte-level language models (vocab 256)."""

    def compute(self):
        return super().compute() / math.log(2)


class TorchMetric(Metric):
    """A ``torchmetrics.Metric`` in speedkit's metric interface; :class:`Evaluator` wraps one for you.

    ``compute`` returns a float. Under several processes torchmetrics gathers its own states across the
    ranks inside ``compute`` (every rank calls it), so speedkit's sum of ``sum_states`` leaves it alone
    (``syncs_itself``). Its states follow the outputs onto their device at the first update.
    """

    syncs_itself = True

    def __init__(self, metric):
        self.metric = metric
        self.lower_is_better = getattr(metric, "higher_is_better", True) is False

    def reset(self):
        self.metric.reset()

    @torch.no_grad()
    def update(self, outputs, targets):
        if self.metric.device != outputs.device:
            self.metric.to(outputs.device)
        self.metric.update(outputs, targets)

    def compute(self):
        value = self.metric.compute()
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise TypeError(f"{type(self.metric).__name__}.compute() returned {_describe(value)}; a speedkit metric "
                            f"is one number: configure it to reduce to a scalar (e.g. average='micro' or 'macro')")
        return float(value)


def compute_metrics(metrics: dict) -> dict[str, float]:
    """``{name: metric.compute()}``, with every tensor state of the metrics read from the device at once.

    Each state named in a metric's ``sum_states`` that is a tensor becomes a Python number (an integer
    tensor an int), so that ``compute`` reads nothing more: one wait per evaluation, not one per metric
    or batch. Metrics without ``sum_states`` (a torchmetrics metric) compute as they do.
    """
    held = [(metric, name) for metric in metrics.values() for name in getattr(metric, "sum_states", ())
            if isinstance(getattr(metric, name, None), torch.Tensor)]
    if held:
        tensors = [getattr(metric, name).detach().reshape(()) for metric, name in held]
        by_device: dict = {}
        for index, tensor in enumerate(tensors):
            by_device.setdefault(tensor.device, []).append(index)
        for indices in by_device.values():  # one read per device (one device in practice)
            values = to_host(torch.stack([tensors[i].double() for i in indices]))
            for i, value in zip(indices, values):
                metric, name = held[i]
                is_integer = not tensors[i].is_floating_point()
                setattr(metric, name, int(round(value)) if is_integer else value)
    return {name: metric.compute() for name, metric in metrics.items()}


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def as_metric(metric) -> Metric:
    """``metric`` as a speedkit Metric: a ``torchmetrics.Metric`` gets wrapped, anything else must be one."""
    torchmetrics = sys.modules.get("torchmetrics")  # a torchmetrics metric exists only if it was imported
    if torchmetrics is not None and isinstance(metric, torchmetrics.Metric):
        return TorchMetric(metric)
    if not all(callable(getattr(metric, name, None)) for name in ("reset", "update", "compute")):
        raise TypeError(f"a metric needs reset(), update(outputs, targets) and compute(); got "
                        f"{type(metric).__name__}: pass a speedkit.record.metrics.Metric, a torchmetrics.Metric or a name "
                        f"from {sorted(METRICS)}")
    return metric


METRICS = {"accuracy": Accuracy, "top5": lambda: Accuracy(topk=5), "loss": CrossEntropy,
           "perplexity": Perplexity, "bpb": BitsPerByte}


def make_metric(name: str) -> Metric:
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; known: {sorted(METRICS)}")
    return METRICS[name]()


@dataclasses.dataclass
class Evaluator:
    """A dataloader and the metrics computed on it, logged as ``eval/<metric>`` (or ``<label>/<metric>``)."""

    dataloader: Any
    metrics: dict = dataclasses.field(default_factory=lambda: {"accuracy": Accuracy(), "loss": CrossEntropy()})
    label: str = "eval"
    interval: Time | str | None = None  # None: the Trainer's eval_interval
    max_batches: int | None = None

    def __post_init__(self):
        if isinstance(self.metrics, (list, tuple)):
            self.metrics = {m: make_metric(m) for m in self.metrics}
        self.metrics = {name: as_metric(m) for name, m in self.metrics.items()}
        self.interval = Time.from_input(self.interval)
