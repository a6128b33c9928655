"""A run's checkpoints, in three rooms.

- ``format``: the file format, the only module that knows what a checkpoint file holds (its payload's keys,
  the magic line and digest, the sharded layout) and how to load and verify one;
- ``checkpointer``: the Checkpointer, which decides when and where a run saves, which checkpoints it keeps,
  and resumes from one;
- ``storage``: checkpoint folders at fsspec URLs (``s3://``, ``memory://``, ...).
"""
from speedkit.train.checkpoint.checkpointer import Checkpointer
from speedkit.train.checkpoint.format import (FORMAT_VERSION, MAGIC, SHARDED_SUFFIX, CheckpointContents,
                                              CheckpointError, load_checkpoint, load_sharded_checkpoint, read,
                                              rng_state, save_checkpoint, set_rng_state, write)
from speedkit.train.checkpoint.storage import LATEST

__all__ = ["Checkpointer", "CheckpointContents", "CheckpointError", "FORMAT_VERSION", "LATEST", "MAGIC",
           "SHARDED_SUFFIX", "load_checkpoint", "load_sharded_checkpoint", "read", "rng_state", "save_checkpoint",
           "set_rng_state", "write"]
