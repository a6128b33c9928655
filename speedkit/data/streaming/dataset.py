"""litdata's ``StreamingDataset`` whose samples that cannot be read are one ``ShardError`` naming the chunk and
the commands that find and redo it, instead of a parser's traceback from deep inside litdata or PIL (a chunk whose
bytes changed in place keeps its size, so the checks by size in :mod:`speedkit.data.streaming.shards` pass it).

Imported by the loaders when they are built: it imports litdata.
"""
from __future__ import annotations

import struct

import torch

from speedkit.data.streaming import shards as S

S.disable_litdata_network()

from litdata import StreamingDataset  # noqa: E402
from litdata.streaming.sampler import ChunkedIndex  # noqa: E402

# What reading a sample out of altered chunk bytes raises: litdata's parsing of the offsets (struct), its checks of a
# chunk's header (RuntimeError), a read past the end; and decoding the sample's image (PIL: OSError, SyntaxError).
UNREADABLE = (struct.error, RuntimeError, OSError, ValueError, EOFError, IndexError)
UNDECODABLE = (OSError, SyntaxError, ValueError, EOFError)


class ShardDataset(StreamingDataset):
    """A split of a shard folder; ``decode`` is applied to each sample read (in the loader's worker processes)."""

    def __init__(self, source, *, decode, where: str, advice: str, **options):
        super().__init__(source, transform=None, **options)
        self.decode, self.where, self.advice = decode, where, advice
        # The epoch in shared memory: persistent worker processes hold a copy of this dataset made when they
        # started, and read each new epoch's order from here (the loader sets it in the parent).
        self._shared_epoch = torch.zeros(1, dtype=torch.int64).share_memory_()

    def set_epoch(self, current_epoch: int) -> None:
        super().set_epoch(current_epoch)
        self._shared_epoch.numpy()[0] = self.current_epoch

    def __iter__(self):
        if self._state_dict is None:
            self.current_epoch = int(self._shared_epoch.numpy()[0]) or self.current_epoch
        try:  # litdata checks the header of the first chunks it will read here
            return super().__iter__()
        except UNREADABLE as error:
            raise S.ShardError(self._damaged(None, error)) from None

    def __getitem__(self, index):
        try:
            item = super().__getitem__(index)
        except UNREADABLE as error:
            raise S.ShardError(self._damaged(index, error)) from None
        try:
            return self.decode(item)
        except UNDECODABLE as error:
            raise S.ShardError(self._damaged(index, error)) from None

    def _damaged(self, index, error: Exception) -> str:
        chunk = self._chunk_name(index)
        what = (f"{self.where}/{chunk}: a sample cannot be read from it" if chunk
                else f"{self.where}: a chunk cannot be read")
        return (f"{what} ({type(error).__name__}: {error}); its bytes changed since it was written (a damaged disk or "
                f"copy). {self.advice}")

    def _chunk_name(self, index):
        if index is None:
            return None
        try:
            if isinstance(index, int):
                index = ChunkedIndex(*self.cache._get_chunk_index_from_index(index))
            return self.cache._reader.config[index][0].rsplit("/", 1)[-1]
        except Exception:  # naming the chunk is a courtesy: the error's own text is in the message
            return None


def worker_message(error: S.ShardError) -> str:
    """The message of a ShardError raised in a loader's worker process: torch hands it over with the worker's
    traceback before it."""
    text = str(error)
    marker = "ShardError: "
    return text.rsplit(marker, 1)[-1].strip() if "Original Traceback" in text and marker in text else text
