"""Data echoing: train on each batch ``factor`` times in a row, to amortise a slow input pipeline.

When loading and augmenting a batch takes longer than a training step, the accelerator waits. Repeating
("echoing") each batch lets the model take ``factor`` steps per batch loaded. Choi et al. found that
echoing recovers most of the lost time with little loss of sample efficiency for small factors; it does
not help when the pipeline is already fast (speedkit's in-memory BatchLoader), because every echoed step
costs as much compute as a fresh one. One epoch becomes ``factor`` times as many steps over the same data.

The Trainer method wraps the train loader at fit start. The wrapper keeps ``len`` (``factor`` times the
loader's), ``batch_size``, ``set_epoch`` and ``iter_from`` (resume at echoed batch k without replaying),
and passes every other attribute to the wrapped loader. Methods at AFTER_DATALOADER (cutout, RandAugment)
still draw fresh randomness for each echo, like the paper's "echoing before augmentation".
Source: Choi et al. 2019, "Faster Neural Network Training with Data Echoing".
"""
from __future__ import annotations

from typing import Iterable, Iterator

from speedkit.core.event import Event
from speedkit.core.method import HParam, Method, MethodCard


def echo_batches(iterable: Iterable, factor: int = 2) -> Iterator:
    """Yield every item of ``iterable`` ``factor`` times in a row (the same object each time)."""
    if factor < 1:
        raise ValueError(f"factor must be >= 1, got {factor}")
    for item in iterable:
        for _ in range(factor):
            yield item


class EchoingLoader:
    """A train loader that yields each batch of ``loader`` ``factor`` times in a row."""

    def __init__(self, loader, factor: int = 2):
        if factor < 1:
            raise ValueError(f"factor must be >= 1, got {factor}")
        if not hasattr(loader, "__len__"):
            raise TypeError(f"data_echoing needs a train loader with a length (len(loader)), got "
                            f"{type(loader).__name__}")
        self.loader = loader
        self.factor = factor

    @property
    def batch_size(self):
        return getattr(self.loader, "batch_size", None)

    def __len__(self) -> int:
        return self.factor * len(self.loader)

    def __iter__(self) -> Iterator:
        return echo_batches(self.loader, self.factor)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.loader, "set_epoch"):
            self.loader.set_epoch(epoch)

    def iter_from(self, batch_index: int) -> Iterator:
        """This epoch's echoed batches from echoed position ``batch_index`` on (for exact resume)."""
        if batch_index < 0:
            raise ValueError(f"batch_index must be >= 0, got {batch_index}")
        source_index, repeats_done = divmod(batch_index, self.factor)
        if hasattr(self.loader, "iter_from"):
            source = self.loader.iter_from(source_index)
        else:  # generic loader: replay up to the batch to resume in
            source = iter(self.loader)
            for _ in range(source_index):
                next(source, None)
        return self._resume(source, repeats_done)

    def _resume(self, source: Iterator, repeats_done: int) -> Iterator:
        for position, item in enumerate(source):
            for _ in range(self.factor - (repeats_done if position == 0 else 0)):
                yield item

    def with_options(self, **changes) -> "EchoingLoader":
        """The wrapped loader's ``with_options``, echoed the same way (so loader-switching methods compose)."""
        return EchoingLoader(self.loader.with_options(**changes), self.factor)

    def __getattr__(self, name):
        # Only called for attributes not found on the wrapper: mean/std, augment, dataset, sampler, ...
        if name in ("loader", "factor") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __repr__(self) -> str:
        return f"EchoingLoader(factor={self.factor}, loader={self.loader!r})"


class DataEchoing(Method):
    CARD = MethodCard(
        name="data_echoing",
        summary="Repeat each batch `factor` times to amortise a slow input pipeline.",
        domain="any",
        events=(Event.FIT_START,),
        reads=("data",),
        writes=("data",),
        hparams=(HParam("factor", int, 2, low=1, high=8, step=1, help="steps taken on each loaded batch"),),
        requirements=("a train loader with len(); pays off only when loading is slower than a training step",),
        effect="when the input pipeline is the bottleneck, the same result from fewer fresh examples "
               "(Choi et al. 2019 report up to about 3x in their best case), at a small cost in sample "
               "efficiency for small factors; no gain with an in-memory loader",
        source="Choi et al. 2019, Faster Neural Network Training with Data Echoing",
    )

    def apply(self, event, state, logger):
        loader = state.train_dataloader
        if isinstance(loader, EchoingLoader):
            return  # a second fit on the same Trainer: already echoing
        state.train_dataloader = EchoingLoader(loader, self.params["factor"])
        # The Trainer measured the epoch before fit start; an epoch now has factor times the batches.
        state.batches_per_epoch = len(state.train_dataloader)
        logger.log_note("data_echoing", f"each batch used {self.params['factor']} times")
        logger.log_text(f"data_echoing: each batch is used {self.params['factor']} times")
